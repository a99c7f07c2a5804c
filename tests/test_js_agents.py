"""JavaScript agents: the Vercel AI SDK (generateText and streamText, with tools, its own ``ai.*`` spans), a tool
loop on the ``openai`` client under OpenInference's JS instrumentation, and LangGraph.js's prebuilt ReAct agent under
OpenInference's LangChain.js instrumentation (each tool span's output an lc-serialised ``ToolMessage`` inside the
run's ``{"output": ...}``, whose content is the result), recorded by ``tests/js/record.mjs`` with the
real npm packages and the OTel JS SDK against the scripted provider on loopback. The committed recordings rebuild
into the scripted run's steps exactly as the Python set-ups do (``tests/frameworks/script.py``); with Node on the
machine the suite records them again, sending the spans to a real receiver through the JS SDK's OTLP/protobuf
exporter as well. ``python -m tests.test_js_agents`` writes the committed recordings again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.collectors.otlp import decode_json_document
from reflect_otel.collectors.receiver import OTLPReceiver
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.semconv import SpanAttributes
from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
from reflect_otel.trace import StructuredTrace
from tests.frameworks.script import ANSWER, QUESTION, SCRIPT, STEPS, assistant_turns, steps_of
from tests.frameworks.tracing import ROOT, same_trace_from_otlp_json

JS = ROOT / "tests" / "js"
RECORDINGS = JS / "recordings"
SCENARIOS = {
    "ai-generate-text": ("calculator", "vercel-ai"),
    "ai-stream-text": ("calculator-stream", "vercel-ai"),
    "openinference-openai": ("calculator", "openai"),
    "openinference-langgraph": (None, "langchain"),
}
"""Each recording, with the agent it names (LangGraph.js names none that assembly reads) and the framework assembly
recognises."""


def _turn(body: dict[str, Any]) -> ScriptedTurn:
    return SCRIPT[assistant_turns(body)]


def js_environment() -> Path:
    """A folder holding ``record.mjs`` and the npm packages of ``package-lock.json``, installed once (``npm ci``) under
    ``.test-envs/`` (or ``REFLECT_TEST_ENVS``) and kept while the lock file is unchanged."""
    lock = (JS / "package-lock.json").read_bytes()
    folder = Path(os.environ.get("REFLECT_TEST_ENVS") or ROOT / ".test-envs") / (
        "js-" + hashlib.sha256(lock).hexdigest()[:16]
    )
    if not (folder / "node_modules" / ".package-lock.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(JS / name, folder / name)
        installed = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if installed.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)
            pytest.fail(f"npm ci of tests/js failed (is the npm registry reachable?):\n{installed.stderr[-3000:]}")
    shutil.copy(JS / "record.mjs", folder / "record.mjs")
    return folder


def record(out: Path, *, otlp_url: str | None = None) -> dict[str, str]:
    """Run every scenario of ``record.mjs`` against the scripted provider, writing ``out/<scenario>.otlp.json``;
    returns each scenario's answer."""
    folder = js_environment()
    with ScriptedOpenAIServer(_turn) as server:
        done = subprocess.run(
            ["node", str(folder / "record.mjs"), server.base_url, str(out), *([otlp_url] if otlp_url else [])],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    answers: dict[str, str] = json.loads(done.stdout)
    return answers


def rebuilt(path: Path) -> StructuredTrace:
    batch = decode_json_document(json.loads(path.read_text(encoding="utf-8")))
    assert not batch.rejected, batch.error_message
    return assemble_trace(batch.spans, collector="file")


def check_run(trace: StructuredTrace, scenario: str) -> None:
    """The scripted run, rebuilt as every Python set-up rebuilds it."""
    agent, framework = SCENARIOS[scenario]
    assert steps_of(trace) == STEPS
    assert (trace.question, trace.final_answer, trace.agent) == (QUESTION, ANSWER, agent)
    assert trace.source.framework == framework and trace.source.service == "js-calculator"
    assert [s.prompt_tokens for s in trace.steps] == [50, 50, 50]
    assert {t.name for t in trace.tools} == {"multiply", "add"}
    assert not trace.warnings, trace.warnings


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_committed_recording_rebuilds_the_scripted_run(scenario: str, tmp_path: Path) -> None:
    path = RECORDINGS / f"{scenario}.otlp.json"
    trace = rebuilt(path)
    check_run(trace, scenario)
    same_trace_from_otlp_json(json.loads(path.read_text(encoding="utf-8")), trace, tmp_path)  # import and receiver


def test_langgraph_js_tool_results_are_the_content_of_their_tool_messages() -> None:
    """The recording holds the shape: each tool span's output is ``{"output": <lc-serialised ToolMessage>}``; the
    steps take the message's content as the result, not the whole serialisation."""
    path = RECORDINGS / "openinference-langgraph.otlp.json"
    batch = decode_json_document(json.loads(path.read_text(encoding="utf-8")))
    outputs = [
        json.loads(str(s.attributes[SpanAttributes.OUTPUT_VALUE]))
        for s in batch.spans
        if s.attributes.get(SpanAttributes.OPENINFERENCE_SPAN_KIND) == "TOOL"
    ]
    assert [(o["output"]["id"][-1], o["output"]["kwargs"]["content"]) for o in outputs] == [
        ("ToolMessage", "391"),
        ("ToolMessage", "396"),
    ]
    trace = rebuilt(path)
    assert [(s.tool_result, s.tool_call_id) for s in trace.steps[:2]] == [("391", "call_1"), ("396", "call_2")]


@pytest.mark.slow
@pytest.mark.frameworks
@pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None, reason="Node.js and npm not found")
def test_the_js_agents_recorded_again_rebuild_the_same_way(tmp_path: Path) -> None:
    received: list[StructuredTrace] = []
    receiver = OTLPReceiver(received.append, http=("127.0.0.1", 0)).start()
    try:
        answers = record(tmp_path, otlp_url=f"http://127.0.0.1:{receiver.http_port}/v1/traces")
        assert receiver.force_flush(30_000)
    finally:
        receiver.shutdown(30_000)
    assert answers == dict.fromkeys(SCENARIOS, ANSWER)
    by_id = {trace.trace_id: trace for trace in received}
    for scenario in SCENARIOS:
        trace = rebuilt(tmp_path / f"{scenario}.otlp.json")
        check_run(trace, scenario)
        live = by_id[trace.trace_id]  # the same spans, through the JS SDK's OTLP/protobuf exporter
        assert (live.steps, live.question, live.final_answer) == (trace.steps, trace.question, trace.final_answer)
        assert live.source.collector == "otlp"
    assert len(received) == len(SCENARIOS)


if __name__ == "__main__":  # python -m tests.test_js_agents: record the committed recordings again
    RECORDINGS.mkdir(exist_ok=True)
    print(record(RECORDINGS), file=sys.stderr)
