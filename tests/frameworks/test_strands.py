"""Strands Agents, recorded: its own OpenTelemetry tracer (the GenAI conventions) on a Strands agent with two tools,
on Strands' OpenAI model provider against the scripted server on loopback (``strands_app.py``), in both of the forms
it writes. ``events``, its default: each message a span event whose content is a list of Bedrock-style blocks
(``{"text"}``, ``{"toolUse": {"name", "input"}}``, ``{"toolResult": {"content": [{"text"}]}}``), the tool spans'
arguments and results only in their ``gen_ai.tool.message`` / ``gen_ai.choice`` events. ``latest``
(``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``): the parts-based messages, each in a
``gen_ai.client.inference.operation.details`` event of its own, the agent's answer a text part of its span's last
output message. Strands needs none of reflect-otel and a Python of its own: the recordings are committed, and
``REFLECT_STRANDS_PYTHON`` (a Python with ``strands-agents[openai]`` and ``opentelemetry-exporter-otlp-proto-common``)
records them again, in the test below and with ``python -m tests.frameworks.test_strands``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.collectors.otlp import decode_json_document
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.genai import as_openinference
from reflect_otel.reading.semconv import SpanAttributes
from reflect_otel.testing.openai_server import ScriptedOpenAIServer
from reflect_otel.trace import StructuredTrace
from tests.frameworks.script import ANSWER, QUESTION, SCRIPT, STEPS, assistant_turns, steps_of
from tests.frameworks.tracing import same_trace_from_otlp_json

HERE = Path(__file__).parent
RECORDINGS = HERE / "recordings"
FORMS = ("events", "latest")


def record(python: str, form: str) -> dict[str, Any]:
    """Run ``strands_app.py`` with ``python`` against the scripted server: ``{"answer", "otlp"}``."""
    with ScriptedOpenAIServer(lambda body: SCRIPT[assistant_turns(body)]) as server:
        done = subprocess.run(
            [python, str(HERE / "strands_app.py"), server.base_url, form],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    run: dict[str, Any] = json.loads(done.stdout)
    return run


def rebuilt(otlp: dict[str, Any]) -> StructuredTrace:
    batch = decode_json_document(otlp)
    assert not batch.rejected, batch.error_message
    return assemble_trace(batch.spans, collector="file")


def check_run(trace: StructuredTrace) -> None:
    assert steps_of(trace) == STEPS
    # Strands' answer is the text of its last message, which ends in a newline; the step is the model's reply
    assert (trace.question, trace.final_answer, trace.agent) == (QUESTION, ANSWER + "\n", "calculator")
    assert trace.source.framework == "strands" and trace.source.service == "strands-calculator"
    assert [s.prompt_tokens for s in trace.steps] == [50, 50, 50]
    assert not trace.warnings, trace.warnings


def _recording(form: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((RECORDINGS / f"strands-{form}.otlp.json").read_text(encoding="utf-8"))
    return document


@pytest.mark.parametrize("form", FORMS)
def test_a_committed_strands_recording_rebuilds_the_scripted_run(form: str, tmp_path: Path) -> None:
    otlp = _recording(form)
    trace = rebuilt(otlp)
    check_run(trace)
    same_trace_from_otlp_json(otlp, trace, tmp_path)  # through import and the receiver alike


def test_tool_spans_of_the_event_form_carry_their_arguments_and_results() -> None:
    """Strands' default form writes no arguments or result attribute on a tool span: they are its events'."""
    spans = decode_json_document(_recording("events")).spans
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    assert all("gen_ai.tool.call.arguments" not in s.attributes for s in tools)
    read = [as_openinference(s).attributes for s in tools]
    assert [
        (a[SpanAttributes.TOOL_NAME], a[SpanAttributes.INPUT_VALUE], a[SpanAttributes.OUTPUT_VALUE]) for a in read
    ] == [
        ("multiply", '{"a": 17, "b": 23}', "391"),
        ("add", '{"a": 391, "b": 5}', "396"),
    ]
    # the model's tool calls are blocks in its choice event: {"toolUse": {"name", "input"}}
    chats = [as_openinference(s).attributes for s in spans if s.name == "chat"]
    assert [a.get("llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments") for a in chats] == [
        '{"a": 17, "b": 23}',
        '{"a": 391, "b": 5}',
        None,
    ]


def test_the_latest_form_gives_the_agents_answer_from_its_last_output_message() -> None:
    spans = decode_json_document(_recording("latest")).spans
    (agent,) = [s for s in spans if s.name.startswith("invoke_agent")]
    assert "gen_ai.output.messages" not in agent.attributes  # in the second of its details events
    assert as_openinference(agent).attributes[SpanAttributes.OUTPUT_VALUE] == ANSWER + "\n"


@pytest.mark.slow
@pytest.mark.frameworks
@pytest.mark.skipif(not os.environ.get("REFLECT_STRANDS_PYTHON"), reason="REFLECT_STRANDS_PYTHON is not set")
@pytest.mark.parametrize("form", FORMS)
def test_strands_recorded_again_rebuilds_the_same_way(form: str) -> None:
    run = record(os.environ["REFLECT_STRANDS_PYTHON"], form)
    assert run["answer"] == ANSWER
    check_run(rebuilt(run["otlp"]))


if __name__ == "__main__":  # python -m tests.frameworks.test_strands PYTHON: record the committed recordings again
    RECORDINGS.mkdir(exist_ok=True)
    for form in FORMS:
        otlp = record(sys.argv[1], form)["otlp"]
        (RECORDINGS / f"strands-{form}.otlp.json").write_text(json.dumps(otlp, indent=1) + "\n", encoding="utf-8")
