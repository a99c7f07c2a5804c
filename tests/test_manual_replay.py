"""``reflect-otel replay`` and ``reflect_otel.replay_from``: a user's change of one step of a stored run, replayed
under the controlled rule (the intervention, the control, the sensitivity arm), with the real agents and their
real frameworks: the LangGraph table agent (its model scripted), the OpenAI tool-loop SQL agent against a scripted
OpenAI-compatible server, a chain of thought, and a remote agent behind the HTTP replay protocol."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pytest

import reflect_otel
from reflect_otel.attribution.manual import ManualEdit, check_edit, parse_call
from reflect_otel.cli import main
from reflect_otel.demo.wtq import WTQQuestion, load_questions
from reflect_otel.errors import ConfigError
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.exporters.report import render_report
from reflect_otel.reading.semconv import OpenInferenceSpanKindValues, SpanAttributes
from reflect_otel.record import AttributionRecord, AttributionStatus, ReplayArm
from reflect_otel.testing import ScriptedLLM, ScriptedRequest
from reflect_otel.trace import StepAction, StructuredTrace
from tests.conftest import Instrumented

if TYPE_CHECKING:
    from reflect_otel.replay import ReplayAdapter

pytest.importorskip("langgraph")

WRONG = "No 1st place finishes found."
RIGHT = "Bangkok, Thailand"
FIRST = 'filter_rows({"column": "Position", "op": "=", "table": "t0", "value": "1st"})'
"""The demo's verified correction of nt-1's step 1, as the demo and the report print it."""


def nt1() -> WTQQuestion:
    return next(q for q in load_questions() if q.id == "nt-1")


def table_model(request: ScriptedRequest) -> dict[str, Any]:
    """The table agent's model on nt-1, as the default model decided it: it filters Position on '1' (the table
    writes '1st'), and from an empty result answers that there is none; given rows, it sorts them newest first,
    reads the venue and answers it."""
    results = [m.content for m in request.messages if m.content.startswith("Result of ")]
    if not results:
        action = {"tool": "filter_rows", "table": "t0", "column": "Position", "op": "=", "value": "1"}
        return {"thought": "Keep the rows where Position is 1.", "action": action}
    tool, _, shown = results[-1].partition(":\n")
    table = shown.split(":")[0]
    if " 0 rows" in shown.split("\n")[0]:
        return {"thought": "No row has Position 1.", "action": {"tool": "final_answer", "answer": WRONG}}
    if tool.endswith("filter_rows"):
        action = {"tool": "sort_rows", "table": table, "column": "Year", "descending": True, "limit": 1}
        return {"thought": "newest first", "action": action}
    if tool.endswith("sort_rows"):
        return {"thought": "read", "action": {"tool": "lookup", "table": table, "column": "Venue", "row": 1}}
    return {"thought": "done", "action": {"tool": "final_answer", "answer": shown}}


@pytest.fixture
def on_the_session_provider(monkeypatch: pytest.MonkeyPatch, instrumented: Instrumented) -> Instrumented:
    """The command attaches to the application's provider, as the demo does: here the session's, which carries the
    LangChain and OpenAI instrumentation already."""
    monkeypatch.setattr("reflect_otel.online.setup.otel_trace.get_tracer_provider", lambda: instrumented.provider)
    return instrumented


def stored(path: Path, trace: StructuredTrace) -> str:
    with DuckDBStore(path) as store:
        store.write_trace(trace)
    return trace.trace_id


def table_run(instrumented: Instrumented, llm: ScriptedLLM, thread: str = "manual-nt-1") -> StructuredTrace:
    """A run of the table agent on nt-1 under an AGENT span named as the demo names it (``observe(name=...)``)."""
    from reflect_otel.demo.table_agent import TableQAAgent

    agent = TableQAAgent(nt1(), llm, max_steps=6)
    return agent_run(instrumented, lambda: agent.answer(thread_id=thread))


def agent_run(instrumented: Instrumented, ask: Any) -> StructuredTrace:
    from reflect_otel.reading.capture import recorded_run

    attributes = {
        SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
        SpanAttributes.AGENT_NAME: "table_qa",
        SpanAttributes.INPUT_VALUE: nt1().question,
    }
    tracer = instrumented.provider.get_tracer("tests")
    with (
        recorded_run(instrumented.provider, "run") as run,
        tracer.start_as_current_span("table_qa", attributes=attributes),
    ):
        answer = ask()
    assert answer == WRONG and run.trace is not None
    return run.trace.model_copy(update={"final_answer": answer})


def restored_adapter(instrumented: Instrumented, llm: ScriptedLLM, trace: StructuredTrace) -> ReplayAdapter:
    """The table agent's deterministic LangGraph adapter as the demo builds it, its workspace restored to ``trace``'s
    tables."""
    from reflect_otel.cli._demo_runs import table_adapter
    from reflect_otel.demo.table_agent import TableQAAgent

    agent = TableQAAgent(nt1(), llm, max_steps=6)
    agent.restore(trace)
    return table_adapter(agent, instrumented.provider, deterministic=True)


def manual_records(path: Path) -> list[AttributionRecord]:
    with duckdb.connect(str(path), read_only=True) as db:
        rows = db.execute("SELECT record_json FROM attributions WHERE method = 'manual' ORDER BY created_at").fetchall()
    return [AttributionRecord.model_validate_json(json_text) for (json_text,) in rows]


def test_a_call_is_read_as_the_report_prints_it() -> None:
    assert parse_call(FIRST) == StepAction(
        tool_name="filter_rows", arguments={"column": "Position", "op": "=", "table": "t0", "value": "1st"}
    )
    assert parse_call(" schema ( ) ") == StepAction(tool_name="schema", arguments={})
    for bad in ("filter_rows", 'filter_rows({"a": 1', "filter_rows([1, 2])"):
        with pytest.raises(ConfigError, match="--call"):
            parse_call(bad)
    with pytest.raises(ConfigError, match="exactly one change"):
        ManualEdit.of(1, call=FIRST, resample=3)


def test_the_table_agent_replayed_with_the_demos_correction_is_verified_and_stored(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    on_the_session_provider: Instrumented,
) -> None:
    llm = ScriptedLLM(respond=table_model)
    trace = table_run(on_the_session_provider, llm)
    assert trace.agent == "table_qa" and trace.steps[0].tool_args["value"] == "1"
    store = tmp_path / "runs.duckdb"
    stored(store, trace)
    monkeypatch.setattr("reflect_otel.llm.factory.make_llm", lambda config: llm)

    # an edit the run cannot take is refused before the model starts
    assert main(["replay", trace.trace_id[:12], "--step", "2", "--call", FIRST, "--store", str(store)]) == 2
    assert "--step 2 is the run's answer turn" in capsys.readouterr().err
    assert main(["replay", trace.trace_id[:12], "--step", "1", "--call", "drop_table({})", "--store", str(store)]) == 2
    assert "no tool 'drop_table'; its tools: " in capsys.readouterr().err
    # a budget too small for one test is refused naming the one it needs (the embedded-model rule: one per arm)
    args = ["replay", trace.trace_id[:12], "--step", "1", "--call", FIRST, "--store", str(store)]
    assert main([*args, "--deterministic-agent", "--max-replays", "2"]) == 2
    assert "needs 3 replays" in capsys.readouterr().err and manual_records(store) == []

    assert main([*args, "--deterministic-agent"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "replaying" in captured.err and "the demo's table agent on nt-1" in captured.err
    intervention = out.index("intervention")
    control = out.index("control", intervention)
    sensitivity = out.index("sensitivity", control)
    assert f"answer: {RIGHT!r} (right)" in out[intervention:control]
    assert f"answer: {WRONG!r} (wrong)" in out[control:sensitivity]
    assert f"answer: {WRONG!r} (wrong)" in out[sensitivity:]
    assert "The rule: verified. Changed this way, step 1 changed what it produced" in out
    assert "(the step changed in text only: its arguments in reverse order)" in out
    assert f"reflect-otel report {trace.trace_id[:12]} --method manual" in out
    (record,) = manual_records(store)
    assert record.status is AttributionStatus.VERIFIED and record.claim == "decisive" and record.step_index == 1
    assert record.corrected_answer == RIGHT and record.auditor_confidence is None
    assert [a.arm for a in record.replays] == [ReplayArm.CONTROL, ReplayArm.INTERVENTION, ReplayArm.SENSITIVITY]
    assert record.effect is not None and record.effect.text() == (
        "intervention flipped 1 of 1, control 0 of 1, sensitivity 0 of 1"
    )
    assert record.config["manual_edit"]["step"] == 1
    # the report shows it, and prints the command to try another change
    page = tmp_path / "report.html"
    assert main(["report", trace.trace_id[:12], "--method", "manual", "-o", str(page), "--store", str(store)]) == 0
    html = page.read_text()
    assert "Try another change" in html and "reflect-otel replay" in html and "--step 1" in html

    # the original call again changes nothing, and says so: nothing is replayed
    same = 'filter_rows({"table": "t0", "column": "Position", "op": "=", "value": "1"})'
    assert main(["replay", trace.trace_id[:12], "--step", "1", "--call", same, "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "The rule: unverified. Your change changes nothing at step 1, so nothing was tested" in out
    # nor does a value the filter reads the same (it trims): its preview returns what the step returned
    padded = 'filter_rows({"table": "t0", "column": "Position", "op": "=", "value": " 1"})'
    assert main(["replay", trace.trace_id[:12], "--step", "1", "--call", padded, "--store", str(store)]) == 0
    assert "Your change changes nothing at step 1" in capsys.readouterr().out
    (latest,) = manual_records(store)  # the store keeps a run's latest record of each method
    assert latest.status is AttributionStatus.UNVERIFIED and not latest.replays
    assert "previewed before any replay" in str(latest.corrections[0].refused)


def test_replay_from_in_python_gives_the_same_record(on_the_session_provider: Instrumented) -> None:
    llm = ScriptedLLM(respond=table_model)
    trace = table_run(on_the_session_provider, llm)
    adapter = restored_adapter(on_the_session_provider, llm, trace)
    record = reflect_otel.replay_from(trace, 1, call=FIRST, replay=adapter, expected=nt1().expected)
    assert record.method == "manual" and record.status is AttributionStatus.VERIFIED
    assert record.corrected_answer == RIGHT
    # a change of effect that does not flip the run is a change that does not decide it
    other = 'filter_rows({"column": "Position", "op": "=", "table": "t0", "value": "2nd"})'
    missed = reflect_otel.replay_from(trace, 1, call=other, replay=adapter, expected=nt1().expected)
    assert missed.status is AttributionStatus.UNVERIFIED
    assert "step 1 produced something else and the agent still answered wrong" in missed.reason
    with pytest.raises(ConfigError, match="--step 9: the run has 2 step"):
        check_edit(trace, ManualEdit.of(9, call=FIRST))


def test_the_agents_own_step_resampled_is_tested_as_a_change(on_the_session_provider: Instrumented) -> None:
    """``--resample K``: the agent's own decisions at the step, asked with no hint and sampled; each distinct one is
    executed and tested under the rule like a change the user wrote."""

    def sampled(request: ScriptedRequest) -> dict[str, Any]:  # asked to sample, it filters on the right value
        if request.temperature and not any(m.content.startswith("Result of ") for m in request.messages):
            action = {"tool": "filter_rows", "table": "t0", "column": "Position", "op": "=", "value": "1st"}
            return {"thought": "first places", "action": action}
        return table_model(request)

    llm = ScriptedLLM(respond=sampled)
    trace = table_run(on_the_session_provider, llm, thread="manual-resample")
    adapter = restored_adapter(on_the_session_provider, llm, trace)
    record = reflect_otel.replay_from(trace, 1, resample=2, replay=adapter, expected=nt1().expected)
    assert record.status is AttributionStatus.VERIFIED and record.corrected_answer == RIGHT
    assert record.verified_by is not None and record.verified_by.source == "proposal:resample"
    assert sum(1 for r in llm.requests if r.temperature) == 2  # the two samples asked for


# -- the SQL agent: an OpenAI tool loop ---------------------------------------------------------------------------

WRONG_SQL = """SELECT "Venue" FROM data WHERE "Position" = '1' ORDER BY "Year" DESC LIMIT 1"""
RIGHT_SQL = """SELECT "Venue" FROM data WHERE "Position" = '1st' ORDER BY "Year" DESC LIMIT 1"""


def sql_model(body: dict[str, Any]) -> Any:
    """The SQL agent's model: the schema, then '1' where the table writes '1st'; it answers the venue it read."""
    from reflect_otel.testing.openai_server import ScriptedToolCall, ScriptedTurn

    messages = body["messages"]
    results = [json.loads(m["content"]) for m in messages if m["role"] == "tool" and m["content"].startswith("{")]
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if not results:
        return ScriptedTurn("", [ScriptedToolCall("schema", {}, f"call_{turn}")])
    if "columns" in results[-1]:
        return ScriptedTurn("", [ScriptedToolCall("query", {"sql": WRONG_SQL}, f"call_{turn}")])
    rows = results[-1].get("rows") or []
    return ScriptedTurn(rows[0]["Venue"] if rows else "none")


def test_the_sql_agent_replayed_with_a_corrected_query(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    on_the_session_provider: Instrumented,
) -> None:
    from reflect_otel.config import LLMConfig
    from reflect_otel.demo.sql_agent import SQLAgent, chat_client
    from reflect_otel.llm.openai_compat import OpenAICompatibleLLM
    from reflect_otel.reading.capture import recorded_run
    from reflect_otel.testing.openai_server import ScriptedOpenAIServer

    with ScriptedOpenAIServer(sql_model) as server:
        llm = OpenAICompatibleLLM(LLMConfig(base_url=server.base_url, api_key="k", model="scripted-model"))
        client, model = chat_client(llm)
        agent = SQLAgent(nt1(), client, model=model, tracer_provider=on_the_session_provider.provider)
        with recorded_run(on_the_session_provider.provider, "sql_agent") as run:
            assert agent.answer() == "none"
        trace = run.trace
        assert trace is not None and trace.agent == "sql_agent"
        store = tmp_path / "runs.duckdb"
        stored(store, trace)
        monkeypatch.setattr("reflect_otel.llm.factory.make_llm", lambda config: llm)
        call = f"query({json.dumps({'sql': RIGHT_SQL})})"
        args = ["replay", trace.trace_id[:12], "--step", "2", "--call", call, "--store", str(store)]
        assert main([*args, "--deterministic-agent"]) == 0
        out = capsys.readouterr().out
        # the same query, laid out otherwise: the sensitivity arm (its result is the original's)
        assert f"answer: {RIGHT!r} (right)" in out and "answer: 'none' (wrong)" in out
        assert "The rule: verified." in out
        (record,) = manual_records(store)
        assert record.effect is not None and record.effect.sensitivity_note == "its statement laid out otherwise"
        # the wrong query itself: refused before any replay (a pure tool's call the step made)
        wrong = f"query({json.dumps({'sql': WRONG_SQL})})"
        assert main(["replay", trace.trace_id[:12], "--step", "2", "--call", wrong, "--store", str(store)]) == 0
        assert "Your change changes nothing at step 2" in capsys.readouterr().out


# -- a chain of thought -------------------------------------------------------------------------------------------


def cot_model(request: ScriptedRequest) -> dict[str, Any]:
    """Continues a chain of thought on 2 + 3 * 4: right once it has multiplied first, else 20."""
    assistant = " ".join(m.content for m in request.messages if m.role == "assistant")
    if "3 * 4 = 12" in assistant:
        return {"steps": ["2 + 12 = 14."], "answer": "14"}
    return {"steps": ["5 * 4 = 20."], "answer": "20"}


def test_a_chain_of_thought_replayed_with_another_thought(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], instrumented: Instrumented
) -> None:
    from opentelemetry.trace import format_trace_id

    from reflect_otel.demo.cot_agent import ChainOfThoughtAgent

    llm = ScriptedLLM(respond=cot_model)
    first = ScriptedLLM([{"steps": ["2 + 3 = 5.", "5 * 4 = 20."], "answer": "20"}])
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    ChainOfThoughtAgent(first, tracer_provider=instrumented.provider).solve("What is 2 + 3 * 4?")
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    trace = instrumented.assembled(trace_id)
    store = tmp_path / "runs.duckdb"
    stored(store, trace)
    monkeypatch.setattr("reflect_otel.llm.factory.make_llm", lambda config: llm)
    args = ["replay", trace_id[:12], "--step", "1", "--store", str(store), "--expected", "14"]
    assert main([*args, "--text", "3 * 4 = 12."]) == 0
    out = capsys.readouterr().out
    assert "answer: 'So the answer is 14' (right)" in out and "The rule: verified." in out
    (record,) = manual_records(store)
    assert record.effect is not None and record.effect.sensitivity_note == "its words under a step label"
    # the same thought in its own words changes nothing
    assert main([*args, "--text", '"2 + 3 = 5."']) == 0
    assert "Your change changes nothing at step 1" in capsys.readouterr().out
    # nothing stored says what the answer is: the command asks for it
    assert main(["replay", trace_id[:12], "--step", "1", "--text", "x", "--store", str(store)]) == 2
    assert "give --expected" in capsys.readouterr().err


# -- a remote agent, over HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def endpoint(on_the_session_provider: Instrumented) -> Iterator[tuple[str, list[dict[str, Any]], StructuredTrace]]:
    """The table agent in its own server behind the HTTP replay protocol (the agent's side of the wire)."""
    from reflect_otel.cli._demo_runs import table_adapter
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.replay_adapters.http import replay_handler

    llm = ScriptedLLM(respond=table_model)
    agent = TableQAAgent(nt1(), llm, max_steps=6)
    adapter = table_adapter(agent, on_the_session_provider.provider)
    asked: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            asked.append(json.loads(body))
            status, answer = replay_handler(adapter, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        trace = agent_run(on_the_session_provider, lambda: agent.answer(thread_id="remote-manual"))
        yield f"http://127.0.0.1:{server.server_address[1]}/replay", asked, trace
    finally:
        server.shutdown()


def test_a_remote_agent_replayed_over_its_http_endpoint(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    on_the_session_provider: Instrumented,
    endpoint: tuple[str, list[dict[str, Any]], StructuredTrace],
) -> None:
    url, asked, trace = endpoint
    remote = trace.model_copy(update={"source": trace.source.model_copy(update={"service": "table-agent"})})
    store = tmp_path / "runs.duckdb"
    stored(store, remote)
    config = tmp_path / "replay.toml"
    config.write_text(f'[[endpoint]]\nservice = "table-agent"\nurl = "{url}"\ndeterministic = true\n')

    def no_model(config: Any) -> Any:
        raise AssertionError("an agent behind its endpoint runs on its own model: none is started here")

    monkeypatch.setattr("reflect_otel.llm.factory.make_llm", no_model)
    args = ["replay", trace.trace_id[:12], "--step", "1", "--call", FIRST, "--store", str(store)]
    assert main([*args, "--replay-config", str(config), "--expected", RIGHT]) == 0
    captured = capsys.readouterr()
    assert "the replay endpoint of service table-agent" in captured.err
    assert f"answer: {RIGHT!r} (right)" in captured.out and "The rule: verified." in captured.out
    assert len(asked) == 3 and asked[1]["action"]["arguments"]["value"] == "1st"  # control, intervention, sensitivity


# -- the report ---------------------------------------------------------------------------------------------------


def test_the_report_prints_the_command_to_try_another_change() -> None:
    from tests.test_pipeline import five_step_trace
    from tests.test_store import _record

    trace = five_step_trace()
    page = render_report(trace, _record())
    assert "Try another change" in page
    assert f"reflect-otel replay {trace.trace_id[:12]} --step 2 --call" in page
    assert "--resample 3" in page
