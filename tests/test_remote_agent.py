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
from reflect_otel.llm.local import free_port
from reflect_otel.semconv import ReflectAttributes
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


def _agent_turn(schema: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The table agent on nt-1: it filters on Position '1' (nothing matches) and answers 'none'; given rows, it
    sorts them by year, newest first, reads the venue and answers with it."""
    results = _results(messages)
    if not results:
        action = {"tool": "filter_rows", "table": "t0", "column": "Position", "op": "=", "value": "1"}
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


def test_a_remote_agents_wrong_answer_is_flagged_replayed_over_http_verified_stored_and_exported(
    tmp_path: Path, recorders: tuple[_Recorder, _Recorder]
) -> None:
    second, forbidden = recorders
    collect_port, replay_port = free_port(), free_port()
    config = tmp_path / "replay.toml"
    config.write_text(
        f'[[endpoint]]\nservice = "table-agent"\nurl = "http://127.0.0.1:{replay_port}/replay"\n'
        'headers_from_env = { "X-Replay-Token" = "TABLE_AGENT_TOKEN" }\n'
    )
    store, out = tmp_path / "online.duckdb", tmp_path / "runs.jsonl"
    with ScriptedOpenAIServer(_turn) as model:
        env = os.environ | {
            "PYTHONUNBUFFERED": "1",
            "REFLECT_LLM_BASE_URL": model.base_url,
            "REFLECT_LLM_API_KEY": "test",
            "REFLECT_LLM_MODEL": "scripted-model",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{second.url}/v1/traces",
            "TABLE_AGENT_TOKEN": "secret-token",
        }
        collector = subprocess.Popen(
            [
                *CLI,
                "collect",
                "--http",
                f"127.0.0.1:{collect_port}",
                "-o",
                str(out),
                "--store",
                str(store),
                "--attribute",
                "--replay-config",
                str(config),
                "--export",
                "otlp",
                "--grace",
                "0.5",
                "--rounds",
                "1",
                "--rollback-points",
                "1",
                "--gate",
                "soft",
            ],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        agent = None
        try:
            assert collector.stderr is not None
            assert "listening for OTLP/HTTP" in collector.stderr.readline()
            agent = subprocess.Popen(
                [
                    *CLI,
                    "demo-agent",
                    "--question",
                    "nt-1",
                    "--replay-port",
                    str(replay_port),
                    "--otlp-endpoint",
                    f"http://127.0.0.1:{collect_port}/v1/traces",
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            assert agent.stdout is not None
            assert agent.stdout.readline().startswith("replay endpoint http://127.0.0.1:")
            assert agent.stdout.readline().strip() == "answered nt-1: none"
            # another service's run, whose spans name an address: flagged, attributed without a replay
            _other_service_run(collect_port, forbidden.url)
            wait_until(lambda: len(_attributed(second)) >= 2, 120, "the two records at the second receiver")
        finally:
            collector.send_signal(signal.SIGTERM)
            _, errors = collector.communicate(timeout=60)
            if agent is not None:
                agent.send_signal(signal.SIGTERM)
                agent.wait(timeout=30)
        assert collector.returncode == 0, errors
    assert forbidden.bodies == []  # a URL named in trace content is never called
    with duckdb.connect(str(store), read_only=True) as db:
        rows = db.execute(
            "SELECT t.agent, a.status, a.mode, a.step_index, a.verified_by_kind, a.corrected_answer "
            "FROM attributions a JOIN traces t USING (trace_id) ORDER BY t.agent"
        ).fetchall()
        jobs = db.execute("SELECT status, count(*) FROM attribution_jobs GROUP BY ALL").fetchall()
    assert ("other", "unverified", "localization_only", 1, None, None) in rows
    ((_, status, mode, step, kind, corrected),) = [r for r in rows if r[0] == "table_qa"]
    assert (status, mode, step, kind) == ("verified", "replay", 1, "action")
    assert corrected == "Bangkok, Thailand"
    assert jobs == [("done", 2)]
    assert sorted(_attributed(second).values()) == ["unverified", "verified"]
    assert "attributed 2 (1 verified)" in errors


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
