"""The OpenAI Agents SDK, its real OpenInference instrumentation, a chat-completions or Responses model on a
scripted server on loopback: the run multiply(17, 23) -> add(391, 5) -> "The answer is 396." rebuilt exactly, alone
and after a handoff (which is one step: the model's transfer call, answered by the handoff); a run its
``tool_use_behavior`` stops at a tool answers with that tool's result, and a run stopped by an error does not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedToolCall, ScriptedTurn
from reflect_otel.trace import StepKind, StructuredTrace
from tests.frameworks.script import ANSWER, QUESTION, SCRIPT
from tests.frameworks.tracing import Traced, instrumented_by, same_trace_from_otlp_file

pytestmark = pytest.mark.frameworks
agents = pytest.importorskip("agents")
CALCULATION = [
    (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", "I multiply first."),
    (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", "Now add 5."),
    (StepKind.FINAL_ANSWER, None, {}, None, ANSWER),
]


@agents.function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@agents.function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _turn(body: dict[str, Any]) -> ScriptedTurn:
    if "input" in body:  # the Responses API: the model's earlier calls come back as function_call items
        return SCRIPT[sum(1 for item in body["input"] if item.get("type") == "function_call")]
    if "Route" in str(body["messages"][0].get("content")):
        return ScriptedTurn("", [ScriptedToolCall("transfer_to_calculator", {}, "call_handoff")])
    calculator_turns = sum(1 for m in body["messages"] if m.get("role") == "assistant" and not _is_handoff(m))
    return SCRIPT[calculator_turns]


def _is_handoff(message: dict[str, Any]) -> bool:
    return any(c["function"]["name"].startswith("transfer_to_") for c in message.get("tool_calls") or [])


@pytest.fixture(scope="module")
def traced() -> Iterator[Traced]:
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    agents.set_trace_processors([])  # no export to OpenAI's tracing backend: tests stay on loopback
    with instrumented_by(OpenAIAgentsInstrumentor()) as traced:
        yield traced


def _run(
    traced: Traced,
    *,
    handoff: bool,
    responses: bool = False,
    behavior: Any = "run_llm_again",
    answer: object = ANSWER,
    max_turns: int = 10,
) -> StructuredTrace:
    from openai import AsyncOpenAI

    provider, traces = traced.provider, traced.traces
    before = len(traces)
    with ScriptedOpenAIServer(_turn) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="test")
        model: Any = (
            agents.OpenAIResponsesModel(model="scripted-model", openai_client=client)
            if responses
            else agents.OpenAIChatCompletionsModel(model="scripted-model", openai_client=client)
        )
        agent = agents.Agent(
            name="calculator", instructions="Compute.", tools=[multiply, add], model=model, tool_use_behavior=behavior
        )
        if handoff:
            agent = agents.Agent(name="triage", instructions="Route the question.", handoffs=[agent], model=model)
        if isinstance(answer, type):
            with pytest.raises(answer):
                agents.Runner.run_sync(agent, QUESTION, max_turns=max_turns)
        else:
            assert agents.Runner.run_sync(agent, QUESTION, max_turns=max_turns).final_output == answer
    assert provider.force_flush(10_000)
    (trace,) = [t for t in traces[before:] if t.steps]
    return trace


def _steps(trace: StructuredTrace) -> list[tuple[Any, ...]]:
    return [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.reasoning) for s in trace.steps]


def test_chat_completions_agent(traced: Traced, tmp_path: Path) -> None:
    trace = _run(traced, handoff=False)
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert _steps(trace) == CALCULATION
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_file(traced, trace, tmp_path)


def test_responses_agent(traced: Traced, tmp_path: Path) -> None:
    trace = _run(traced, handoff=False, responses=True)
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert _steps(trace) == CALCULATION
    assert not trace.warnings, trace.warnings  # its messages start at index 1: no gap
    same_trace_from_otlp_file(traced, trace, tmp_path)


def test_a_handoff_is_one_step(traced: Traced, tmp_path: Path) -> None:
    trace = _run(traced, handoff=True)
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert _steps(trace) == [(StepKind.TOOL_CALL, "transfer_to_calculator", {}, "calculator", ""), *CALCULATION]
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_file(traced, trace, tmp_path)


@pytest.mark.parametrize(
    ("behavior", "answer", "steps"),
    [
        (
            "stop_on_first_tool",
            "391",
            [(StepKind.FINAL_ANSWER, "multiply", {"a": 17, "b": 23}, "391", "I multiply first.")],
        ),
        (
            agents.StopAtTools(stop_at_tool_names=["add"]),
            "396",
            [CALCULATION[0], (StepKind.FINAL_ANSWER, "add", {"a": 391, "b": 5}, "396", "Now add 5.")],
        ),
    ],
    ids=["stop_on_first_tool", "StopAtTools"],
)
def test_a_run_stopped_at_a_tool_answers_with_its_result(
    traced: Traced, tmp_path: Path, behavior: Any, answer: str, steps: list[tuple[Any, ...]]
) -> None:
    """The SDK records neither the behaviour nor the run's output: the run ending on a tool's result, with no model
    turn after and no agent in error, is what marks that call as the answer step."""
    trace = _run(traced, handoff=False, behavior=behavior, answer=answer)
    assert _steps(trace) == steps
    assert trace.final_answer == answer
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_file(traced, trace, tmp_path)


def test_a_run_out_of_turns_has_no_answer_step(traced: Traced) -> None:
    """Running out of turns also ends the run on a tool's result, but the SDK marks the agent span with the error:
    the run gave no answer, and no step is made its answer."""
    trace = _run(traced, handoff=False, answer=agents.MaxTurnsExceeded, max_turns=2)
    assert _steps(trace) == CALCULATION[:2]
    assert trace.final_answer is None


def test_a_run_whose_agent_span_never_arrived_is_not_a_stop_at_a_tool(traced: Traced) -> None:
    """A process killed mid-run exports its tool and model spans but never its agent span: such a run's last tool
    result is not an answer."""
    from reflect_otel.reading.assembly import assemble_trace
    from reflect_otel.reading.spans import span_record_from_readable

    trace = _run(traced, handoff=False, behavior="stop_on_first_tool", answer="391")
    spans = [s for s in traced.exporter.get_finished_spans() if format(s.context.trace_id, "032x") == trace.trace_id]
    records = [r for r in map(span_record_from_readable, spans) if r is not None]
    without_agent = [r for r in records if r.attributes.get("openinference.span.kind") != "AGENT"]
    assert len(without_agent) < len(records)  # the run had an agent span, and it is gone
    cut = assemble_trace(without_agent)
    assert cut.final_answer is None and not any(s.is_final_answer for s in cut.steps)
    assert assemble_trace(records).final_answer == "391"  # the whole run still stops at its tool
