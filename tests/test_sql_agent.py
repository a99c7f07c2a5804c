"""The text-to-SQL demo agent, end to end against the scripted OpenAI server: a plain OpenAI tool loop (the real
``openai`` client and OpenInference's OpenAI instrumentation) on a real DuckDB table. Its run reads as schema and
query steps with JSON results; the OpenAI tool-loop adapter replays it (the conformance suite) and proposes the
model's next call without running it; REFLECT proves the literal the data writes differently by an action replay
under control; ``wtq-live`` measures it, the placebo drawing its plan from another failure's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.attribution.controls import NO_PLACEBO
from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.config import ReflectConfig
from reflect_otel.demo.sql_agent import SQLAgent, SQLWorkspace
from reflect_otel.demo.wtq import WTQQuestion, load_questions
from reflect_otel.flagging.verifiers import OracleVerifier, judged_correct
from reflect_otel.record import AttributionStatus
from reflect_otel.replay import ReplayRequest, proposer
from reflect_otel.testing.conformance import ConformanceCase, run_conformance
from reflect_otel.testing.examples import scripted_auditor
from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedToolCall, ScriptedTurn
from reflect_otel.trace import StepAction, StepKind, StepStatus, StructuredTrace
from tests.conftest import Instrumented

RIGHT = "Bangkok, Thailand"
WRONG_SQL = """SELECT "Venue" FROM data WHERE "Position" = '1' ORDER BY "Year" DESC LIMIT 1"""
RIGHT_SQL = """SELECT "Venue" FROM data WHERE "Position" = '1st' ORDER BY "Year" DESC LIMIT 1"""
FIX = "Filter on Position = '1st': the table writes places as 1st, 2nd."
PLAN = {
    "root_cause": "the filter matched nothing",
    "correction_instruction": FIX,
    "forbidden_actions": [],
    "expected_next_tool": "query",
    "corrected_call": None,
    "confidence": 0.5,
}


def nt1() -> WTQQuestion:
    return next(q for q in load_questions() if q.id == "nt-1")


def model_turn(body: dict[str, Any]) -> ScriptedTurn:
    """A model that looks at the schema, filters on '1' (the table writes '1st') unless a message after the question
    says '1st', and answers the venue it read, or "none"."""
    messages = body["messages"]
    hinted = any("'1st'" in str(m.get("content") or "") for m in messages[2:] if m["role"] in ("system", "user"))
    results = [json.loads(m["content"]) for m in messages if m["role"] == "tool" and m["content"].startswith("{")]
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if not results:
        return ScriptedTurn("", [ScriptedToolCall("schema", {}, f"call_{turn}")])
    found = [r["rows"] for r in results if r.get("rows")]
    asked = [c["function"]["arguments"] for m in messages for c in m.get("tool_calls") or ()]
    retry = not found and not (hinted and any("1st" in a for a in asked)) and ("columns" in results[-1] or hinted)
    if body.get("tool_choice") != "none" and retry:
        sql = RIGHT_SQL if hinted else WRONG_SQL
        return ScriptedTurn("", [ScriptedToolCall("query", {"sql": sql}, f"call_{turn}")])
    return ScriptedTurn(found[-1][0]["Venue"] if found else "none")


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(model_turn) as running:
        yield running


def client_of(server: ScriptedOpenAIServer) -> Any:
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)


def recorded(instrumented: Instrumented, agent: SQLAgent) -> tuple[str, StructuredTrace]:
    from reflect_otel import recorded_run  # the public helper: the trace of the run just made

    with recorded_run(instrumented.provider, "sql_agent") as run:
        answer = agent.answer()
    assert run.trace is not None
    return answer, run.trace


def adapter_of(instrumented: Instrumented, agent: SQLAgent, client: Any) -> Any:
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    return OpenAIToolLoopReplayAdapter(
        agent.resume,
        tracer_provider=instrumented.provider,
        execute_tool=agent.execute_tool,
        client=client,
        deterministic=True,
    )


def test_the_run_reads_as_schema_and_query_steps_with_json_results(
    instrumented: Instrumented, server: ScriptedOpenAIServer
) -> None:
    agent = SQLAgent(nt1(), client_of(server), model="scripted-model", tracer_provider=instrumented.provider)
    answer, trace = recorded(instrumented, agent)
    assert answer == "none" and trace.final_answer == "none"
    assert trace.question == nt1().question
    assert [(s.kind, s.tool_name) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "schema"),
        (StepKind.TOOL_CALL, "query"),
        (StepKind.FINAL_ANSWER, None),
    ]
    assert trace.steps[1].tool_args == {"sql": WRONG_SQL}
    assert json.loads(trace.steps[1].tool_result or "") == {"row_count": 0, "rows": []}
    assert {t.name for t in trace.tools} == {"schema", "query"}  # recorded from the requests, not guessed
    first, second = server.requests[:2]
    assert first["tool_choice"] == {"type": "function", "function": {"name": "schema"}}  # a SQL agent starts there
    assert second["tool_choice"] == "auto" and first["temperature"] == 0
    assert second["messages"][2]["content"] is None  # the assistant turn that only calls a tool, as OpenAI takes it


def test_a_run_that_raises_still_gives_its_trace(instrumented: Instrumented, server: ScriptedOpenAIServer) -> None:
    """A crashed run is the one a user most wants attributed: ``recorded_run`` assembles what it did before the
    exception, and the exception goes on unchanged."""
    from reflect_otel.reading.capture import recorded_run

    agent = SQLAgent(nt1(), client_of(server), model="scripted-model", tracer_provider=instrumented.provider)

    def gone(sql: str) -> str:
        raise ConnectionError("the database went away")

    agent.workspace.query = gone  # type: ignore[method-assign]
    with pytest.raises(ConnectionError, match="the database went away"), recorded_run(instrumented.provider) as run:
        agent.answer()
    assert run.trace is not None and run.error == ""
    assert run.trace.question == nt1().question and run.trace.final_answer is None
    assert [(s.kind, s.tool_name) for s in run.trace.steps] == [
        (StepKind.TOOL_CALL, "schema"),
        (StepKind.TOOL_CALL, "query"),
    ]
    crashed = run.trace.steps[1]
    assert crashed.tool_args == {"sql": WRONG_SQL} and crashed.status is StepStatus.ERROR
    assert "the database went away" in (crashed.status_message or "")


def test_the_table_is_typed_read_only_and_answers_duckdb_errors() -> None:
    workspace = SQLWorkspace(nt1())
    schema = json.loads(workspace.schema())
    assert {c["name"]: c["type"] for c in schema["columns"]}["Year"] == "BIGINT"
    assert len(schema["sample_rows"]) == 3 and schema["row_count"] == 17
    assert json.loads(workspace.query(RIGHT_SQL)) == {"row_count": 1, "rows": [{"Venue": RIGHT}]}
    assert workspace.query('SELECT "Venu" FROM data').startswith('Binder Error: Referenced column "Venu" not found')
    assert workspace.query("DROP TABLE data").startswith("Error: only one SELECT")
    assert json.loads(workspace.query("SELECT count(*) AS n FROM data"))["rows"] == [{"n": 17}]  # still there


def test_the_database_reads_no_file_and_no_url(tmp_path: Path) -> None:
    """The statements come from the model, and in a replay from trace content: DuckDB itself refuses any file, URL
    or extension, with its own error the model can read."""
    import http.server
    import threading

    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret", encoding="utf-8")
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"a\n1\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workspace = SQLWorkspace(nt1())
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/rows.csv"
        for sql in (
            f"SELECT content FROM read_text('{secret}')",
            f"SELECT * FROM read_csv('{secret}')",
            f"SELECT * FROM '{url}'",
            f"SELECT * FROM read_csv('{url}')",
        ):
            answer = workspace.query(sql)
            assert answer.startswith("Permission Error:") and "the-secret" not in answer, (sql, answer)
    finally:
        server.shutdown()
        server.server_close()
    assert asked == []  # no request left the process
    assert json.loads(workspace.query(RIGHT_SQL))["rows"] == [{"Venue": RIGHT}]  # the table still answers


def test_a_long_query_is_stopped_and_a_result_is_bounded() -> None:
    from reflect_otel.demo.sql_agent import COUNT_CAP, MAX_RESULT_CHARS, MAX_ROWS

    workspace = SQLWorkspace(nt1(), timeout_s=0.3)
    stopped = workspace.query("SELECT count(*) FROM range(1000000000000) AS a")
    assert stopped.startswith("Error: the query ran longer than 0.3 s and was stopped")
    assert json.loads(workspace.query("SELECT count(*) AS n FROM data"))["rows"] == [{"n": 17}]  # usable after
    many = json.loads(workspace.query("SELECT range AS n FROM range(5000000)"))
    assert many["row_count"] == COUNT_CAP and len(many["rows"]) == MAX_ROWS
    assert many["note"].startswith(f"counting stopped at {COUNT_CAP} rows")
    wide_sql = "SELECT " + ", ".join(f"repeat('x', 90) AS c{i}" for i in range(30)) + " FROM data"
    wide = workspace.query(wide_sql)
    assert len(wide) <= MAX_RESULT_CHARS
    shown = json.loads(wide)
    assert shown["row_count"] == 17 and 0 < len(shown["rows"]) < MAX_ROWS
    assert f"rows shown: a result is limited to {MAX_RESULT_CHARS} characters" in shown["note"]


def test_the_openai_loop_adapter_passes_the_conformance_suite(
    instrumented: Instrumented, server: ScriptedOpenAIServer
) -> None:
    client = client_of(server)
    agent = SQLAgent(nt1(), client, model="scripted-model", tracer_provider=instrumented.provider)
    _, trace = recorded(instrumented, agent)
    case = ConformanceCase(
        adapter=adapter_of(instrumented, agent, client),
        trace=trace,
        fix=FIX,
        is_correct=lambda answer: judged_correct(answer or "", RIGHT),
        model_requests=lambda: [json.dumps(r) for r in server.requests],
        action=StepAction(tool_name="query", arguments={"sql": RIGHT_SQL}),
        action_result=json.dumps({"row_count": 1, "rows": [{"Venue": RIGHT}]}),
    )
    results = run_conformance(case)
    assert {r.adapter_info["adapter"] for r in results} == {"openai_loop"}


def test_propose_asks_the_model_at_the_temperature_and_runs_nothing(
    instrumented: Instrumented, server: ScriptedOpenAIServer
) -> None:
    client = client_of(server)
    agent = SQLAgent(nt1(), client, model="scripted-model", tracer_provider=instrumented.provider)
    _, trace = recorded(instrumented, agent)
    adapter = adapter_of(instrumented, agent, client)
    executed: list[str] = []
    agent.execute_tool = lambda name, arguments: executed.append(name) or ""  # type: ignore[method-assign]
    sent = len(server.requests)
    proposals = proposer(adapter).propose(
        ReplayRequest(
            # type: ignore[union-attr]
            trace=trace,
            rollback_point=1,
            injection=FIX,
            temperature=0.7,
        ),
        samples=2,
    )
    assert [p.action for p in proposals] == [StepAction(tool_name="query", arguments={"sql": RIGHT_SQL})] * 2
    asked = server.requests[sent:]
    assert [r["temperature"] for r in asked] == [0.7, 0.7] and not executed
    assert asked[0]["messages"][-1] == {"role": "system", "content": FIX}
    assert asked[0]["tools"] == server.requests[1]["tools"]  # the recorded request, resent
    at_answer = proposer(adapter).propose(ReplayRequest(trace=trace, rollback_point=2, injection=""), samples=1)  # type: ignore[union-attr]
    assert at_answer[0].is_final_answer and at_answer[0].action.text == "none"


def test_the_loop_resamples_whole_runs_at_the_temperature_for_the_consistency_check(
    instrumented: Instrumented, server: ScriptedOpenAIServer
) -> None:
    from reflect_otel.flagging.consistency import check_consistency
    from reflect_otel.replay import resampler

    client = client_of(server)
    agent = SQLAgent(nt1(), client, model="scripted-model", tracer_provider=instrumented.provider)
    answer, trace = recorded(instrumented, agent)
    adapter = adapter_of(instrumented, agent, client)
    assert adapter.resamples and resampler(adapter) is adapter
    sent = len(server.requests)
    runs = adapter.resample(ReplayRequest.resampling(trace, 0.9), samples=2)
    asked = server.requests[sent:]
    assert [r.rollback_point for r in runs] == [0, 0] and all(r.final_answer == answer for r in runs)
    assert asked and {r["temperature"] for r in asked} == {0.9}  # every model call of the resample sampled
    assert asked[0]["messages"] == server.requests[0]["messages"]  # from the run's first request, nothing kept
    assert all(r["temperature"] == 0 for r in server.requests[:sent])  # the run and its replays stay greedy
    check = check_consistency(trace, adapter, samples=2, temperature=0.9)
    assert (check.finished, check.agreeing) == (2, 2)  # the scripted model answers the same every time


def test_a_loop_whose_resume_takes_no_temperature_offers_no_resample(
    instrumented: Instrumented, server: ScriptedOpenAIServer
) -> None:
    from reflect_otel.errors import ReplayError
    from reflect_otel.replay import resampler
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    agent = SQLAgent(nt1(), client_of(server), model="scripted-model", tracer_provider=instrumented.provider)
    _, trace = recorded(instrumented, agent)
    adapter = OpenAIToolLoopReplayAdapter(
        lambda messages, guard: agent.resume(messages, guard), tracer_provider=instrumented.provider
    )
    assert not adapter.resamples and resampler(adapter) is None  # it would repeat the loop's own sampling
    with pytest.raises(ReplayError, match="temperature keyword"):
        adapter.resample(ReplayRequest.resampling(trace, 0.9), samples=1)


def test_reflect_proves_the_literal_the_data_writes_differently(
    instrumented: Instrumented, server: ScriptedOpenAIServer
) -> None:
    client = client_of(server)
    agent = SQLAgent(nt1(), client, model="scripted-model", tracer_provider=instrumented.provider)
    _, trace = recorded(instrumented, agent)
    auditor = scripted_auditor(localize=(2,), plan=PLAN)
    pipeline = ReflectPipeline(auditor, verifier=OracleVerifier(), config=ReflectConfig(rounds=1, rollback_points=1))
    record = pipeline.attribute(
        trace, expected=RIGHT, replay=adapter_of(instrumented, agent, client), domain_context=agent.table_context
    )
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 2
    assert record.verified_by is not None and record.verified_by.source == "evidence:shown_value"
    assert record.intervention is not None and record.intervention.correction is not None
    assert record.intervention.correction.replacement == StepAction(tool_name="query", arguments={"sql": RIGHT_SQL})
    assert record.corrected_answer == RIGHT
    assert record.effect is not None and (record.effect.control.flips, record.effect.control.replays) == (0, 1)


def test_the_agents_requests_made_for_an_attribution_are_counted_as_the_agents(server: ScriptedOpenAIServer) -> None:
    """The command's client for the SQL agent (``chat_client``) counts each request it sends while an attribution
    runs, with the usage the endpoint reports, and none of the agent's own run."""
    from reflect_otel.config import LLMConfig
    from reflect_otel.demo.sql_agent import chat_client
    from reflect_otel.llm.openai_compat import OpenAICompatibleLLM
    from reflect_otel.llm.recording import CallLog, recording_agent_calls
    from reflect_otel.record import AGENT_REPLAY_STAGE

    endpoint = OpenAICompatibleLLM(LLMConfig(model="scripted-model", base_url=server.base_url, context_tokens=4096))
    client, model = chat_client(endpoint)
    ask = {"model": model, "messages": [{"role": "user", "content": nt1().question}]}
    client.chat.completions.create(**ask)  # the agent's own run: no attribution's cost
    log = CallLog()
    with recording_agent_calls(log):
        client.chat.completions.create(**ask)
        client.chat.completions.create(**ask)
    assert len(server.requests) == 3
    assert [(c.stage, c.prompt_tokens, c.completion_tokens, c.attempts, c.ok) for c in log.calls] == [
        (AGENT_REPLAY_STAGE, 50, 10, 1, True)
    ] * 2


def _two_failures(tmp_path: Path) -> Path:
    """nt-1 and a twin question on the same table: the scripted agent fails both the same way."""
    question = nt1()
    folder = tmp_path / "data" / "wtq"
    (folder / "csv" / "204-csv").mkdir(parents=True)
    shutil.copy(question.table, folder / "csv" / "204-csv" / "622.tsv")
    (folder / "questions.tsv").write_text(
        "id\tutterance\tcontext\ttargetValue\n"
        f"nt-1\t{question.question}\tcsv/204-csv/622.csv\t{RIGHT}\n"
        f"nt-1-twin\twhere was piotr's most recent win?\tcsv/204-csv/622.csv\t{RIGHT}\n",
        encoding="utf-8",
    )
    return tmp_path / "data"


@pytest.mark.parametrize(
    "methods",
    [
        ("reflect", "control-placebo"),
        # alone, the placebo draws on its own auditor's plans: a live run on the local model (benchmarks/results/
        # wtq-live-sql-seed44) skipped it on both failures, REFLECT's unverified records carrying no plan to draw
        ("control-placebo",),
    ],
)
def test_wtq_live_measures_the_sql_agent_and_the_placebo_draws_another_failures_plan(
    instrumented: Instrumented, server: ScriptedOpenAIServer, tmp_path: Path, methods: tuple[str, ...]
) -> None:
    from benchmarks.evaluation.live import LiveOptions, run_live_eval
    from reflect_otel.cli.evaluate import sql_agent_runs

    auditor = scripted_auditor(localize=(2,), plan=PLAN)
    out = tmp_path / "out"
    options = LiveOptions(
        methods, _two_failures(tmp_path), out, agent="sql", config=ReflectConfig(rounds=1, rollback_points=1)
    )
    run, rebuild = sql_agent_runs(
        client_of(server), "scripted-model", instrumented.provider, max_steps=6, deterministic=True
    )
    metrics = run_live_eval(options, auditor, run, rebuild=rebuild)
    assert (metrics["questions"], metrics["failed_runs"]) == (2, 2)
    if "reflect" in methods:
        assert metrics["methods"]["reflect"]["verified"]["mean"] == 1
    placebo = metrics["methods"]["control-placebo"]
    assert (placebo["runs"], placebo["skipped"]) == (2, 1)  # the first failure had no other failure's plan yet
    rows = {r["question_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    first = rows["nt-1"]["methods"]["control-placebo"]
    assert first["status"] == "skipped" and first["record"]["reason"] == NO_PLACEBO and first["replays"] == 0
    second = rows["nt-1-twin"]["methods"]["control-placebo"]["record"]
    injected = {a["injection"] for a in second["replays"] if a["arm"] == "intervention"}
    assert injected and all(FIX in text for text in injected)  # the plan the auditor wrote for nt-1
    assert "not run: nothing to test" in (out / "metrics.md").read_text()
    assert json.loads((out / "run_config.json").read_text())["agent"] == "sql"


# -- the commands ------------------------------------------------------------------------------------------------
def _scripted_endpoint(monkeypatch: pytest.MonkeyPatch, module: str, server: ScriptedOpenAIServer) -> None:
    """The auditor scripted in process and the agent on the scripted OpenAI server: the command's own wiring
    (``make_llm`` for the auditor, ``chat_client`` for the agent's endpoint) with the two doubles behind it."""
    monkeypatch.setattr(f"{module}.make_llm", lambda config: scripted_auditor(localize=(2,), plan=PLAN))
    monkeypatch.setattr("reflect_otel.demo.sql_agent.chat_client", lambda llm: (client_of(server), "scripted-model"))


@pytest.mark.parametrize(
    ("flags", "variable", "per_arm"),
    [
        # a remote endpoint at temperature 0 is not repeatable: each arm runs REFLECT_VERIFY_SAMPLES replays
        ((), None, 3),
        (("--deterministic-agent",), None, 1),  # the user says the endpoint repeats itself
        ((), "true", 1),
        (("--no-deterministic-agent",), "true", 3),  # the flag wins over the variable
    ],
)
def test_the_demo_command_runs_the_sql_agent_and_verifies_its_failure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    instrumented: Instrumented,
    server: ScriptedOpenAIServer,
    flags: tuple[str, ...],
    variable: str | None,
    per_arm: int,
) -> None:
    import duckdb

    from reflect_otel.cli import main

    _scripted_endpoint(monkeypatch, "reflect_otel.cli.demo", server)
    monkeypatch.delenv("PHOENIX_COLLECTOR_ENDPOINT", raising=False)
    monkeypatch.delenv("REFLECT_VERIFY_SAMPLES", raising=False)
    if variable is None:
        monkeypatch.delenv("REFLECT_DETERMINISTIC_AGENT", raising=False)
    else:
        monkeypatch.setenv("REFLECT_DETERMINISTIC_AGENT", variable)
    monkeypatch.setattr("reflect_otel.online.setup.otel_trace.get_tracer_provider", lambda: instrumented.provider)
    store = tmp_path / "demo.duckdb"
    assert main(["demo", "--agent", "sql", "--questions", "nt-1", "--store", str(store), *flags]) == 0
    captured = capsys.readouterr()
    assert f"every test controlled, {per_arm} replay(s) per arm" in captured.err
    assert "nt-1: answered 'none' (expected 'Bangkok, Thailand'): wrong" in captured.err
    assert "nt-1: attribution verified at step 2" in captured.err, captured.err
    assert "replayed from there with the correction, the agent answered 'Bangkok, Thailand'" in captured.out
    with duckdb.connect(str(store), read_only=True) as db:
        assert db.execute("SELECT agent FROM traces").fetchall() == [("sql_agent",)]
        (source, intervention, control) = db.execute(
            "SELECT verified_by_source, effect_intervention_replays, effect_control_replays FROM attributions "
            "WHERE status = 'verified'"
        ).fetchone()
    assert source == "evidence:shown_value" and (intervention, control) == (per_arm, per_arm)


def test_only_the_embedded_local_model_is_taken_as_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded server decodes greedily one request at a time; any other endpoint is sampled unless the user
    says otherwise."""
    import argparse
    from types import SimpleNamespace

    from reflect_otel.cli._options import agent_is_deterministic
    from reflect_otel.config import LLMConfig
    from reflect_otel.llm.local import LocalLLM
    from reflect_otel.llm.openai_compat import OpenAICompatibleLLM

    monkeypatch.delenv("REFLECT_DETERMINISTIC_AGENT", raising=False)
    config = LLMConfig(model="m", base_url="http://127.0.0.1:9/v1", context_tokens=4096)
    local = LocalLLM(config, SimpleNamespace())  # type: ignore[arg-type]  # its server is not needed to tell
    remote = OpenAICompatibleLLM(config)
    unset = argparse.Namespace(deterministic_agent=None)
    assert agent_is_deterministic(unset, local) and not agent_is_deterministic(unset, remote)
    assert agent_is_deterministic(argparse.Namespace(deterministic_agent=True), remote)
    assert not agent_is_deterministic(argparse.Namespace(deterministic_agent=False), local)
    monkeypatch.setenv("REFLECT_DETERMINISTIC_AGENT", "false")
    assert not agent_is_deterministic(unset, local)


def test_the_eval_command_measures_the_sql_agent(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    instrumented: Instrumented,
    server: ScriptedOpenAIServer,
) -> None:
    from reflect_otel.cli import main

    _scripted_endpoint(monkeypatch, "benchmarks.evaluation.command", server)
    monkeypatch.delenv("REFLECT_DETERMINISTIC_AGENT", raising=False)
    monkeypatch.delenv("REFLECT_VERIFY_SAMPLES", raising=False)
    monkeypatch.setattr("reflect_otel.online.setup.otel_trace.get_tracer_provider", lambda: instrumented.provider)
    out = tmp_path / "out"
    argv = ["eval", "--benchmark", "wtq-live", "--agent", "sql", "--data", str(_two_failures(tmp_path))]
    argv += ["--out", str(out), "--method", "reflect,control-placebo", "--rounds", "1", "--rollback-points", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "wtq-live: sql agent, model scripted" in captured.err
    assert "sampled replays, 3 per arm" in captured.err  # a remote endpoint: temperature 0 is not repeatable there
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["failed_runs"] == 2 and metrics["methods"]["reflect"]["verified"]["mean"] == 1
    assert "| reflect | 2 |" in captured.out  # the table printed
    config = json.loads((out / "run_config.json").read_text())
    assert config["deterministic_agent"] is False  # what the replays were taken as, as the command decided it
    assert main([*argv[:4], "table", *argv[5:]]) == 2  # a run made with one agent is not resumed with another
    assert "agent" in capsys.readouterr().err
    assert main([*argv, "--deterministic-agent"]) == 2  # nor one of sampled replays with one replay per arm
    assert "deterministic_agent: False -> True" in capsys.readouterr().err
