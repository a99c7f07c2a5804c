"""Spans by the OpenTelemetry GenAI conventions: the official OTel instrumentation of the OpenAI client
(``opentelemetry-instrumentation-openai-v2``, content on spans) and an application's ``execute_tool`` and
``invoke_agent`` spans give the same trace as the OpenInference run of the same agent, through the span processor
and through an OTLP/JSON file; and the legacy indexed form OpenLLMetry writes is read too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.trace import StepKind, StructuredTrace
from tests.agents import ANSWER, QUESTION

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def genai_run() -> dict[str, Any]:
    pytest.importorskip("opentelemetry.instrumentation.openai_v2")
    done = subprocess.run(
        [sys.executable, "-m", "tests.genai_agent"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _expected_steps(trace: StructuredTrace) -> list[tuple[Any, ...]]:
    return [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.tool_call_id) for s in trace.steps]


EXPECTED_STEPS = [
    (StepKind.TOOL_CALL, "lookup_population", {"city": "Paris"}, "2100000", "call_paris"),
    (StepKind.TOOL_CALL, "add", {"a": 2100000, "b": 1000}, "2101000", "call_add"),
    (StepKind.TOOL_CALL, "lookup_population", {"city": "Rome"}, "2800000", "call_rome"),
    (StepKind.FINAL_ANSWER, None, {}, None, None),
]


def test_the_official_genai_instrumentation_gives_the_whole_trace(genai_run: dict[str, Any]) -> None:
    (data,) = genai_run["traces"]
    trace = StructuredTrace.model_validate(data)
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert (trace.session_id, trace.agent) == ("conversation-1", "population_agent")
    assert _expected_steps(trace) == EXPECTED_STEPS
    assert [s.reasoning for s in trace.steps[:2]] == [
        "I need the population of Paris.",
        "Now add 1000 to it and look up Rome.",
    ]
    assert trace.steps[-1].reasoning == ANSWER
    assert trace.steps[0].model_name == "scripted-model" and trace.steps[0].prompt_tokens == 50
    assert not trace.warnings, trace.warnings


def test_an_otlp_json_file_of_the_same_spans_gives_the_same_trace(genai_run: dict[str, Any], tmp_path: Path) -> None:
    from reflect_otel.collectors.files import import_files

    path = tmp_path / "genai.json"
    path.write_text(json.dumps(genai_run["otlp"]), encoding="utf-8")
    imported: list[StructuredTrace] = []
    report = import_files([path], lambda trace, _meta: imported.append(trace))
    (trace,) = imported
    live = StructuredTrace.model_validate(genai_run["traces"][0])
    assert report.traces == 1
    assert _expected_steps(trace) == _expected_steps(live) == EXPECTED_STEPS
    assert (trace.question, trace.final_answer, trace.session_id) == (live.question, live.final_answer, live.session_id)


def _span(span_id: str, parent: str | None, name: str, start: int, **attributes: Any) -> SpanRecord:
    return SpanRecord("a" * 32, span_id, parent, name, start, start + 1, attributes)


def test_openllmetry_indexed_prompt_and_completion_attributes_are_read() -> None:
    """The form OpenLLMetry's OpenAI instrumentation writes: ``gen_ai.prompt.N.*`` and ``gen_ai.completion.N.*``,
    with tool calls under ``tool_calls.K``; no ``gen_ai.operation.name``."""
    spans = [
        _span("1" * 16, None, "agent", 0),
        _span(
            "2" * 16,
            "1" * 16,
            "openai.chat",
            1,
            **{
                "gen_ai.prompt.0.role": "user",
                "gen_ai.prompt.0.content": "Population of Paris?",
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.content": "Looking it up.",
                "gen_ai.completion.0.tool_calls.0.id": "call_1",
                "gen_ai.completion.0.tool_calls.0.name": "lookup_population",
                "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Paris"}',
                "gen_ai.usage.prompt_tokens": 12,
            },
        ),
        _span(
            "3" * 16,
            "1" * 16,
            "execute_tool lookup_population",
            2,
            **{
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.call.id": "call_1",
                "gen_ai.tool.call.result": "2100000",
            },
        ),
        _span(
            "4" * 16,
            "1" * 16,
            "openai.chat",
            3,
            **{"gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "2100000 people."},
        ),
    ]
    trace = assemble_trace(spans)
    assert trace.question == "Population of Paris?"
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "lookup_population", {"city": "Paris"}, "2100000"),
        (StepKind.FINAL_ANSWER, None, {}, None),
    ]
    assert trace.steps[0].prompt_tokens == 12 and trace.final_answer == "2100000 people."


def test_system_instructions_reasoning_parts_and_bad_json_are_handled() -> None:
    spans = [
        _span("0" * 15 + "1", None, "run", 0),
        _span(
            "1" * 16,
            "0" * 15 + "1",
            "chat m",
            0,
            **{
                "gen_ai.operation.name": "chat",
                "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be brief."}]),
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "2+2?"}]}]),
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [
                                {"type": "reasoning", "content": "Two and two."},
                                {"type": "text", "content": "4"},
                            ],
                            "finish_reason": "stop",
                        }
                    ]
                ),
            },
        ),
        _span(
            "2" * 16,
            "0" * 15 + "1",
            "chat m",
            1,
            **{"gen_ai.operation.name": "chat", "gen_ai.output.messages": "[not json"},
        ),
    ]
    trace = assemble_trace(spans)
    assert trace.question == "2+2?"  # the user's message, not the system instructions
    assert trace.steps[0].reasoning == "Two and two.\n4"
    assert len(trace.steps) == 2 and trace.steps[1].reasoning == "[not json"  # unreadable output: kept as text


def test_the_event_based_form_of_v1_36_and_before_is_read_from_span_events(tmp_path: Path) -> None:
    """Real SDK spans whose messages are GenAI events (``gen_ai.user.message``, ``gen_ai.tool.message``,
    ``gen_ai.choice``, bodies as attributes or as JSON in ``gen_ai.event.content``), through the span processor's
    conversion and through an OTLP/JSON file."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from reflect_otel.reading.spans import span_record_from_readable
    from tests.frameworks.tracing import otlp_json

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("events")
    call = {"id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 17, "b": 23}'}}
    with tracer.start_as_current_span("agent"):
        with tracer.start_as_current_span("chat gpt", attributes={"gen_ai.system": "openai"}) as first:
            first.add_event("gen_ai.user.message", {"content": "What is 17 times 23?"})
            first.add_event(
                "gen_ai.choice",
                {
                    "gen_ai.event.content": json.dumps(
                        {"index": 0, "message": {"role": "assistant", "content": "Multiplying.", "tool_calls": [call]}}
                    )
                },
            )
        with tracer.start_as_current_span(
            "multiply",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.call.id": "call_1",
                "gen_ai.tool.call.result": "391",
            },
        ):
            pass
        with tracer.start_as_current_span("chat gpt", attributes={"gen_ai.operation.name": "chat"}) as second:
            second.add_event("gen_ai.user.message", {"content": "What is 17 times 23?"})
            second.add_event("gen_ai.assistant.message", {"tool_calls": json.dumps([call])})
            second.add_event("gen_ai.tool.message", {"id": "call_1", "content": "391"})
            second.add_event("gen_ai.choice", {"message": json.dumps({"role": "assistant", "content": "It is 391."})})
    spans = exporter.get_finished_spans()
    live = assemble_trace([r for r in map(span_record_from_readable, spans) if r is not None])
    assert live.question == "What is 17 times 23?" and live.final_answer == "It is 391."
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.reasoning) for s in live.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", "Multiplying."),
        (StepKind.FINAL_ANSWER, None, {}, None, "It is 391."),
    ]
    from reflect_otel.collectors.files import import_files

    path = tmp_path / "events.json"
    path.write_text(json.dumps(otlp_json(list(spans))), encoding="utf-8")
    imported: list[StructuredTrace] = []
    import_files([path], lambda trace, _meta: imported.append(trace))
    assert [(t.steps, t.question, t.final_answer) for t in imported] == [(live.steps, live.question, live.final_answer)]
