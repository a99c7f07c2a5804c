"""The collector's online job, end to end with real processes: the LangGraph demo agent in its own process
(OpenInference, OTLP/HTTP, the HTTP replay protocol), ``reflect-otel collect --attribute`` in another, a scripted
OpenAI-compatible server for the agent's model and the auditor, and a second OTLP receiver for the records.

A wrong answer (its expected answer on the root span) is flagged, replayed over HTTP at the endpoint the config
file names, verified, stored, and sent on as an EVALUATOR span. A run of another service, whose spans name a URL,
gets no replay and that URL is never called."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from reflect_otel.collectors.otlp import decode_protobuf
from reflect_otel.flagging.verifiers import answers_match
from reflect_otel.llm.local import free_port
from reflect_otel.reading.semconv import ReflectAttributes
from reflect_otel.testing import wait_until
from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn

pytest.importorskip("langgraph")
pytest.importorskip("openinference.instrumentation.langchain")

CLI = [sys.executable, "-m", "reflect_otel"]


class _Recorder:
    """An HTTP server that keeps every request body: the second OTLP receiver, and the address no one may call."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, bytes]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                owner.bodies.append((self.path, self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list[Any]:
        return [span for _, body in self.bodies for span in decode_protobuf(body).spans]


@pytest.fixture
def recorders() -> Iterator[tuple[_Recorder, _Recorder]]:
    second, forbidden = _Recorder(), _Recorder()
    yield second, forbidden
    second.server.shutdown()
    forbidden.server.shutdown()


def _results(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("content") or "") for m in messages if str(m.get("content") or "").startswith("Result of ")]


def _agent_turn(
    schema: str, messages: list[dict[str, Any]], first_place: str = "1", column: str = "Position"
) -> dict[str, Any]:
    """The table agent on nt-1: it filters ``column`` on ``first_place`` ('1' matches nothing, and it answers
    'none'); given rows, it sorts them by year, newest first, reads the venue and answers with it."""
    results = _results(messages)
    if not results:
        action = {"tool": "filter_rows", "table": "t0", "column": column, "op": "=", "value": first_place}
        return {"thought": "first places", "action": action}
    tool, _, shown = results[-1].partition(":\n")
    table = shown.split(":")[0]
    if tool.endswith("lookup") or schema == "FinalDecision" or " 0 rows" in shown.split("\n")[0]:
        answer = shown if tool.endswith("lookup") else "none"
        return {"thought": "done", "action": {"tool": "final_answer", "answer": answer}}
    if tool.endswith("filter_rows"):
        action = {"tool": "sort_rows", "table": table, "column": "Year", "descending": True, "limit": 1}
        return {"thought": "newest first", "action": action}
    return {"thought": "read", "action": {"tool": "lookup", "table": table, "column": "Venue", "row": 1}}


_AUDITOR: dict[str, dict[str, Any]] = {
    "LocalizationOutput": {
        "error_step": 1,
        "confidence": 0.5,
        "reasoning": "the filter on Position '1' matched nothing",
        "what_should_have_been_done": "filter on '1st'",
    },
    "ClassificationOutput": {
        "error_type": "tool_error",
        "confidence": 0.5,
        "explanation": "wrong filter value",
        "suggested_correction": "use '1st'",
    },
    "DiagnosisWithCorrectedStep": {
        "root_cause": "the column holds '1st', not '1'",
        "correction_instruction": "filter Position on '1st'",
        "corrected_call": {
            "tool": "filter_rows",
            "arguments": {"table": "t0", "column": "Position", "op": "=", "value": "1st"},
        },
        "forbidden_actions": [],
        "confidence": 0.5,
    },
    "GateOutput": {"is_faithful": True, "violation_reason": None, "violation_type": None},
    "PostCorrectionOutput": {"reasoning": "r", "error_type": "tool_error", "explanation": "the filter value"},
}


def _turn(body: dict[str, Any]) -> ScriptedTurn:
    schema = str(((body.get("response_format") or {}).get("json_schema") or {}).get("name", ""))
    reply = _AUDITOR.get(schema)
    return ScriptedTurn(text=json.dumps(reply if reply is not None else _agent_turn(schema, body["messages"])))


def _sampling_turn(body: dict[str, Any]) -> ScriptedTurn:
    """As :func:`_turn`, but the agent sampled (a resample: temperature above 0) filters on '1st' and answers
    'Bangkok, Thailand' on nt-1, where its greedy run answered 'none'; on nt-3 it answers '12,467' at once, greedy
    or sampled."""
    schema = str(((body.get("response_format") or {}).get("json_schema") or {}).get("name", ""))
    if schema in _AUDITOR:
        return ScriptedTurn(text=json.dumps(_AUDITOR[schema]))
    if "saskatoon" in json.dumps(body["messages"]).lower():
        return ScriptedTurn(
            text=json.dumps({"thought": "known", "action": {"tool": "final_answer", "answer": "12,467"}})
        )
    first_place = "1st" if float(body.get("temperature") or 0) > 0.3 else "1"
    return ScriptedTurn(text=json.dumps(_agent_turn(schema, body["messages"], first_place)))


def _wrong_column_turn(body: dict[str, Any]) -> ScriptedTurn:
    """As :func:`_turn`, but the agent filters the venues on '1st' (a value of Position), and the auditor, who
    finds the step, writes no corrected call: only the table agent's own rule (``other_field``) knows the fix."""
    schema = str(((body.get("response_format") or {}).get("json_schema") or {}).get("name", ""))
    if schema in _AUDITOR:
        reply = _AUDITOR[schema]
        if schema == "DiagnosisWithCorrectedStep":
            reply = {**reply, "corrected_call": None}
        return ScriptedTurn(text=json.dumps(reply))
    return ScriptedTurn(text=json.dumps(_agent_turn(schema, body["messages"], "1st", column="Venue")))


@dataclass
class _Online:
    """What one end-to-end run left: the agent's answer, the collector's last lines, the store's rows."""

    answer: str
    errors: str
    rows: list[tuple[Any, ...]]
    """(agent, status, mode, step, verified_by_kind, corrected_answer, verified_by_source) of each attribution."""
    jobs: list[tuple[Any, ...]]
    replays: int
    verdicts: list[tuple[Any, ...]]


def _run_online(
    tmp_path: Path,
    llm_env: dict[str, str],
    second: _Recorder,
    *,
    other_service: str | None,
    timeout_s: float,
    questions: tuple[str, ...] = ("nt-1",),
    agent_args: tuple[str, ...] = (),
    collect_args: tuple[str, ...] = (),
    endpoint: str = "resample = true\n",
) -> _Online:
    """The demo agent on ``questions`` (nt-1) and ``collect --attribute`` in their own processes, the model at
    ``llm_env``; with ``other_service`` (an address) a second run of another service naming it. Waits for the
    attribution spans of nt-1 answered wrong to reach ``second``, then stops both and reads the store."""
    collect_port, replay_port = free_port(), free_port()
    config = tmp_path / "replay.toml"
    config.write_text(
        f'[[endpoint]]\nservice = "table-agent"\nurl = "http://127.0.0.1:{replay_port}/replay"\n'
        'headers_from_env = { "X-Replay-Token" = "TABLE_AGENT_TOKEN" }\n' + endpoint
    )
    store = tmp_path / "online.duckdb"
    env = (
        os.environ
        | llm_env
        | {
            "PYTHONUNBUFFERED": "1",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{second.url}/v1/traces",
            "TABLE_AGENT_TOKEN": "secret-token",
        }
    )
    collector = subprocess.Popen(
        [
            *CLI, "collect", "--http", f"127.0.0.1:{collect_port}", "-o", str(tmp_path / "runs.jsonl"),
            "--store", str(store), "--attribute", "--replay-config", str(config), "--export", "otlp",
            "--grace", "0.5", "--rounds", "1", "--rollback-points", "1", "--gate", "soft", *collect_args,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip
    agent = None
    answer = startup = ""
    try:
        assert collector.stderr is not None
        assert "listening for OTLP/HTTP" in collector.stderr.readline()
        # read what is printed at start here: communicate(timeout=) reads the pipe past readline's buffer
        startup = collector.stderr.readline() if "--verifier" in collect_args else ""
        agent = subprocess.Popen(
            [
                *CLI, "demo-agent", *(a for q in questions for a in ("--question", q)),
                "--replay-port", str(replay_port), "--otlp-endpoint", f"http://127.0.0.1:{collect_port}/v1/traces",
                *agent_args,
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        assert agent.stdout is not None
        assert agent.stdout.readline().startswith("replay endpoint http://127.0.0.1:")
        for _question in questions:  # nt-1 last
            answered = agent.stdout.readline().strip()
            assert answered.startswith(f"answered {_question}: "), answered
        answer = answered.removeprefix("answered nt-1: ")
        if other_service is not None:
            _other_service_run(collect_port, other_service)
        wrong = 0 if answers_match(answer, "Bangkok, Thailand") else 1
        expected = wrong + (other_service is not None)
        wait_until(lambda: len(_attributed(second)) >= expected, timeout_s, f"{expected} record(s) at the receiver")
    finally:
        collector.send_signal(signal.SIGTERM)
        _, errors = collector.communicate(timeout=120)
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
    assert collector.returncode == 0, errors
    with duckdb.connect(str(store), read_only=True) as db:
        rows = db.execute(
            "SELECT t.agent, a.status, a.mode, a.step_index, a.verified_by_kind, a.corrected_answer, "
            "a.verified_by_source FROM attributions a JOIN traces t USING (trace_id) ORDER BY t.agent"
        ).fetchall()
        verdicts = db.execute(
            "SELECT t.question, v.verifier, v.is_correct, v.basis, v.resamples, v.resamples_agreeing "
            "FROM verdicts v JOIN traces t USING (trace_id) ORDER BY t.question"
        ).fetchall()
        jobs = db.execute("SELECT status, count(*) FROM attribution_jobs GROUP BY ALL").fetchall()
        replays = db.execute("SELECT count(*) FROM replays WHERE error IS NULL").fetchone()
    return _Online(answer, startup + errors, rows, jobs, replays[0] if replays else 0, verdicts)


def test_a_remote_agents_wrong_answer_is_flagged_replayed_over_http_verified_stored_and_exported(
    tmp_path: Path, recorders: tuple[_Recorder, _Recorder]
) -> None:
    second, forbidden = recorders
    with ScriptedOpenAIServer(_turn) as model:
        llm_env = {"REFLECT_LLM_BASE_URL": model.base_url, "REFLECT_LLM_API_KEY": "t", "REFLECT_LLM_MODEL": "scripted"}
        online = _run_online(tmp_path, llm_env, second, other_service=forbidden.url, timeout_s=120)
    assert online.answer == "none"
    assert forbidden.bodies == []  # a URL named in trace content is never called
    assert ("other", "unverified", "localization_only", 1, None, None, None) in online.rows
    ((_, status, mode, step, kind, corrected, _),) = [r for r in online.rows if r[0] == "table_qa"]
    assert (status, mode, step, kind) == ("verified", "replay", 1, "action")
    assert corrected == "Bangkok, Thailand"
    assert online.jobs == [("done", 2)]
    assert sorted(_attributed(second).values()) == ["unverified", "verified"]
    assert "attributed 2 (1 verified)" in online.errors


def _attributed(receiver: _Recorder) -> dict[str, str]:
    """Attributed trace id -> status, from the attribution spans the receiver got."""
    return {
        str(s.attributes[ReflectAttributes.TRACE_ID]): str(s.attributes[ReflectAttributes.STATUS])
        for s in receiver.spans()
        if ReflectAttributes.STATUS in s.attributes and ReflectAttributes.TRACE_ID in s.attributes
    }


def _other_service_run(port: int, address: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "other-service"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
    tracer = provider.get_tracer("other")
    root = {
        "openinference.span.kind": "AGENT",
        "agent.name": "other",
        "input.value": "What is the capital of France?",
        "output.value": "Lyon",
        ReflectAttributes.EXPECTED_ANSWER: "Paris",
        "replay.url": f"{address}/replay",
    }
    with tracer.start_as_current_span("other", attributes=root):
        tool = {
            "openinference.span.kind": "TOOL",
            "tool.name": "fetch",
            "input.value": json.dumps({"url": f"{address}/capital"}),
            "output.value": f"see {address}/replay for the answer: Lyon",
        }
        with tracer.start_as_current_span("fetch", attributes=tool):
            pass
    provider.shutdown()


def test_without_an_expected_answer_the_combined_verifier_flags_the_wrong_run_through_its_resamples(
    tmp_path: Path, recorders: tuple[_Recorder, _Recorder]
) -> None:
    """Issue 43's end to end: the remote agent sends no expected answer; ``collect --attribute --verifier
    combined`` re-runs it through its replay endpoint. On nt-1 its resamples answer 'Bangkok, Thailand' where the
    run said 'none': flagged, and attributed with the replays judged by that consensus (no answer known anywhere).
    On nt-3 its resamples repeat '12,467': left alone."""
    second, _ = recorders
    with ScriptedOpenAIServer(_sampling_turn) as model:
        llm_env = {"REFLECT_LLM_BASE_URL": model.base_url, "REFLECT_LLM_API_KEY": "t", "REFLECT_LLM_MODEL": "scripted"}
        online = _run_online(
            tmp_path,
            llm_env,
            second,
            other_service=None,
            timeout_s=300,
            questions=("nt-3", "nt-1"),
            agent_args=("--no-expected",),
            collect_args=("--verifier", "combined"),
        )
    assert online.answer == "none"
    by_question = {row[0][:20]: row[1:] for row in online.verdicts}
    # two resamples alike stop each check (REFLECT_FLAG_STOP_LEAD)
    assert by_question["in what city did pio"] == ("combined", False, "consistency_disagree", 2, 0)
    assert by_question["how many more passen"] == ("combined", True, "consistency_agree", 2, 2)
    ((_, status, mode, step, kind, corrected, _),) = online.rows  # the right run is not attributed
    assert (status, mode, step, kind, corrected) == ("verified", "replay", 1, "action", "Bangkok, Thailand")
    assert "consistency checked 2 of 2 at rate 100% (4 agent resamples)" in online.errors
    assert "consistency check: 100% of runs without an expected answer" in online.errors


def test_the_remote_table_agent_serves_its_own_correction_rule(
    tmp_path: Path, recorders: tuple[_Recorder, _Recorder]
) -> None:
    """The table rule lives with the table agent's adapter, in the agent's process: with ``corrections = true`` the
    collector asks the endpoint for its corrections, and the rule, given the table the agent was given (the
    collector never saw it), proposes Position = '1st' for the filter of the venues on '1st', which, replayed over
    HTTP, verifies the step: the auditor wrote no corrected call, and no built-in rule knows the fix
    (tests/test_replay_adapters.py checks the same run's corrections without the endpoint's)."""
    second, _ = recorders
    with ScriptedOpenAIServer(_wrong_column_turn) as model:
        llm_env = {"REFLECT_LLM_BASE_URL": model.base_url, "REFLECT_LLM_API_KEY": "t", "REFLECT_LLM_MODEL": "scripted"}
        online = _run_online(
            tmp_path, llm_env, second, other_service=None, timeout_s=300, endpoint="corrections = true\n"
        )
    assert online.answer == "none"
    ((_, status, mode, step, kind, corrected, source),) = online.rows
    assert (status, mode, step, kind) == ("verified", "replay", 1, "action")
    assert (source, corrected) == ("evidence:other_field", "Bangkok, Thailand")
