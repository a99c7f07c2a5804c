"""pydantic-ai against a scripted OpenAI-compatible server on loopback, traced two ways: its own instrumentation
(OTel GenAI conventions: ``chat``, ``execute_tool``, ``invoke_agent`` spans with parts-based messages) and the same
spans through OpenInference's span processor for pydantic-ai. Both rebuild the run exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from reflect_otel.flagging.evidence import find_evidence
from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedToolCall, ScriptedTurn
from reflect_otel.trace import StepKind, StructuredTrace
from tests.frameworks.script import ADD, ANSWER, MULTIPLY, QUESTION, SCRIPT, assistant_turns
from tests.frameworks.tracing import Traced, same_trace_from_otlp_file

pytestmark = pytest.mark.frameworks
pytest.importorskip("pydantic_ai")


class Computed(BaseModel):
    """The structured output of the run: pydantic-ai asks for it through an output tool, ``final_result``."""

    value: int
    explanation: str


STRUCTURED = Computed(value=396, explanation="17*23+5")
STRUCTURED_SCRIPT = [
    MULTIPLY,
    ADD,
    ScriptedTurn("", [ScriptedToolCall("final_result", STRUCTURED.model_dump(), "call_3")]),
]


def _run(traced: Traced, *, output_type: Any = str, script: list[ScriptedTurn] = SCRIPT) -> StructuredTrace:
    from pydantic_ai import Agent
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = traced.provider

    def turn(body: dict[str, Any]) -> ScriptedTurn:
        return script[assistant_turns(body)]

    with ScriptedOpenAIServer(turn) as server:
        model = OpenAIChatModel("scripted-model", provider=OpenAIProvider(base_url=server.base_url, api_key="test"))
        agent = Agent(model, name="calculator", instructions="Compute.", output_type=output_type)
        agent.instrument = InstrumentationSettings(tracer_provider=provider)

        @agent.tool_plain
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            return a * b

        @agent.tool_plain
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        assert agent.run_sync(QUESTION).output == (ANSWER if output_type is str else STRUCTURED)
    provider.shutdown()
    (trace,) = traced.traces
    return trace


def _traced(openinference: bool) -> Traced:
    if not openinference:
        return Traced()
    # it rewrites each span as it ends, so it runs before the processors that read them
    from openinference.instrumentation.pydantic_ai import OpenInferenceSpanProcessor

    return Traced(first=[OpenInferenceSpanProcessor()])


@pytest.mark.parametrize("openinference", [False, True], ids=["native-genai", "openinference-processor"])
def test_pydantic_ai(openinference: bool, tmp_path: Path) -> None:
    traced = _traced(openinference)
    trace = _run(traced)
    assert (trace.question, trace.final_answer, trace.agent) == (QUESTION, ANSWER, "calculator")
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.tool_call_id, s.reasoning) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", "call_1", "I multiply first."),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", "call_2", "Now add 5."),
        (StepKind.FINAL_ANSWER, None, {}, None, None, ANSWER),
    ]
    assert trace.steps[0].model_name == "scripted-model"
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_file(traced, trace, tmp_path)


@pytest.mark.parametrize("openinference", [False, True], ids=["native-genai", "openinference-processor"])
def test_a_structured_output_is_answered_by_the_output_tool(openinference: bool, tmp_path: Path) -> None:
    """With an output type, pydantic-ai ends the run with a call of its output tool (``final_result``, marked
    ``kind: "output"`` in the request parameters it records): that call is the run's answer step, with the
    structured answer as its arguments, though its own spans record no output (native) or record it as JSON."""
    traced = _traced(openinference)
    trace = _run(traced, output_type=Computed, script=STRUCTURED_SCRIPT)
    assert [(s.kind, s.tool_name, s.tool_args) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}),
        (StepKind.FINAL_ANSWER, "final_result", STRUCTURED.model_dump()),
    ]
    assert trace.final_answer is not None and Computed.model_validate_json(trace.final_answer) == STRUCTURED
    assert not [f for f in find_evidence(trace) if f.step_index == 3]
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_file(traced, trace, tmp_path)
