"""pydantic-ai against a scripted OpenAI-compatible server on loopback, traced two ways: its own instrumentation
(OTel GenAI conventions: ``chat``, ``execute_tool``, ``invoke_agent`` spans with parts-based messages) and the same
spans through OpenInference's span processor for pydantic-ai. Both rebuild the run exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
from reflect_otel.trace import StepKind, StructuredTrace
from tests.frameworks.script import ANSWER, QUESTION, SCRIPT, assistant_turns
from tests.frameworks.tracing import Traced, same_trace_from_otlp_file

pytestmark = pytest.mark.frameworks
pytest.importorskip("pydantic_ai")


def _run(traced: Traced, *, openinference: bool) -> StructuredTrace:
    from pydantic_ai import Agent
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = traced.provider

    def turn(body: dict[str, Any]) -> ScriptedTurn:
        return SCRIPT[assistant_turns(body)]

    with ScriptedOpenAIServer(turn) as server:
        model = OpenAIChatModel("scripted-model", provider=OpenAIProvider(base_url=server.base_url, api_key="test"))
        agent = Agent(model, name="calculator", instructions="Compute.")
        agent.instrument = InstrumentationSettings(tracer_provider=provider)

        @agent.tool_plain
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            return a * b

        @agent.tool_plain
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        assert agent.run_sync(QUESTION).output == ANSWER
    provider.shutdown()
    (trace,) = traced.traces
    return trace


@pytest.mark.parametrize("openinference", [False, True], ids=["native-genai", "openinference-processor"])
def test_pydantic_ai(openinference: bool, tmp_path: Path) -> None:
    traced = Traced()
    if openinference:  # it rewrites each span as it ends, so it runs before the processors that read them
        from openinference.instrumentation.pydantic_ai import OpenInferenceSpanProcessor

        traced = Traced(first=[OpenInferenceSpanProcessor()])
    trace = _run(traced, openinference=openinference)
    assert (trace.question, trace.final_answer, trace.agent) == (QUESTION, ANSWER, "calculator")
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.tool_call_id, s.reasoning) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", "call_1", "I multiply first."),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", "call_2", "Now add 5."),
        (StepKind.FINAL_ANSWER, None, {}, None, None, ANSWER),
    ]
    assert trace.steps[0].model_name == "scripted-model"
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_file(traced, trace, tmp_path)
