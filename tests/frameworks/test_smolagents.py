"""smolagents, its real OpenInference instrumentation, against a scripted OpenAI-compatible server on loopback: the
run multiply(17, 23) -> add(391, 5) -> "The answer is 396." rebuilt exactly, by a ToolCallingAgent (native tool
calls) and by a CodeAgent (tools called from the code it writes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedToolCall, ScriptedTurn
from reflect_otel.trace import StepKind, StructuredTrace
from tests.frameworks.script import ADD, ANSWER, MULTIPLY, QUESTION, assistant_turns
from tests.frameworks.tracing import Traced, instrumented_by, same_trace_from_otlp_file

pytestmark = pytest.mark.frameworks
smolagents = pytest.importorskip("smolagents")


@smolagents.tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


@smolagents.tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term
        b: the second term
    """
    return a + b


@pytest.fixture(scope="module")
def traced() -> Iterator[Traced]:
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    with instrumented_by(SmolagentsInstrumentor()) as traced:
        yield traced


def _run(traced: Traced, agent_class: Any, turn: Any, **options: Any) -> StructuredTrace:
    provider, traces = traced.provider, traced.traces
    before = len(traces)
    with ScriptedOpenAIServer(turn) as server:
        model = smolagents.OpenAIServerModel(model_id="scripted-model", api_base=server.base_url, api_key="test")
        agent = agent_class(tools=[multiply, add], model=model, max_steps=4, verbosity_level=0, **options)
        assert agent.run(QUESTION) == ANSWER
    assert provider.force_flush(10_000)
    (trace,) = traces[before:]
    return trace


def test_tool_calling_agent(traced: Traced, tmp_path: Path) -> None:
    script = [
        MULTIPLY,
        ADD,
        ScriptedTurn("Done.", [ScriptedToolCall("final_answer", {"answer": ANSWER}, "call_3")]),
    ]
    trace = _run(traced, smolagents.ToolCallingAgent, lambda body: script[assistant_turns(body)])
    assert (trace.question, trace.final_answer, trace.source.framework) == (QUESTION, ANSWER, "smolagents")
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.reasoning) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", "I multiply first."),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", "Now add 5."),
        (StepKind.FINAL_ANSWER, "final_answer", {"answer": ANSWER}, ANSWER, "Done."),
    ]
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_file(traced, trace, tmp_path)


def test_code_agent(traced: Traced, tmp_path: Path) -> None:
    first = "Thought: multiply first.\n```python\nproduct = multiply(a=17, b=23)\nprint(product)\n```"
    second = "Thought: add 5 and answer.\n```python\nfinal_answer(f'The answer is {add(a=391, b=5)}.')\n```"
    trace = _run(
        traced,
        smolagents.CodeAgent,
        lambda body: ScriptedTurn([first, second][assistant_turns(body)]),
        code_block_tags="markdown",
    )
    assert (trace.question, trace.final_answer, trace.source.framework) == (QUESTION, ANSWER, "smolagents")
    # a reply whose code names a tool is the decision to call it (its code is the reasoning), as a ReAct agent's
    # written "Action:" is; a further tool the same code called is an action of its own
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.reasoning) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", first),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", second),
        (StepKind.FINAL_ANSWER, "final_answer", {"args": [ANSWER]}, ANSWER, ""),
    ]
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_file(traced, trace, tmp_path)


def test_a_managed_agents_answer_is_handed_back_to_its_manager(traced: Traced, tmp_path: Path) -> None:
    """A code agent asks its managed tool-calling agent, which answers with final_answer: that call hands the
    helper's answer back to the manager (a message, not a lookup the run went past); the manager's own final_answer
    is the run's answer step. Neither is known by its tool's name."""
    ask = "Thought: ask the helper.\n```python\nproduct = helper(task='What is 17 times 23?')\nprint(product)\n```"
    answer = "Thought: add 5 and answer.\n```python\nfinal_answer(f'The answer is {add(a=391, b=5)}.')\n```"
    helper_turns = [
        ScriptedTurn("I multiply.", [ScriptedToolCall("multiply", {"a": 17, "b": 23}, "call_1")]),
        ScriptedTurn("Done.", [ScriptedToolCall("final_answer", {"answer": "391"}, "call_2")]),
    ]

    def turn(body: dict[str, Any]) -> ScriptedTurn:  # the helper calls tools natively; the manager writes code
        if body.get("tools"):
            return helper_turns[assistant_turns(body)]
        return ScriptedTurn([ask, answer][assistant_turns(body)])

    provider, traces = traced.provider, traced.traces
    before = len(traces)
    with ScriptedOpenAIServer(turn) as server:
        model = smolagents.OpenAIServerModel(model_id="scripted-model", api_base=server.base_url, api_key="test")
        helper = smolagents.ToolCallingAgent(
            tools=[multiply], model=model, max_steps=4, verbosity_level=0, name="helper", description="Multiplies."
        )
        manager = smolagents.CodeAgent(
            tools=[add],
            model=model,
            managed_agents=[helper],
            max_steps=4,
            verbosity_level=0,
            code_block_tags="markdown",
        )
        assert manager.run(QUESTION) == ANSWER
    assert provider.force_flush(10_000)
    (trace,) = traces[before:]
    assert trace.final_answer == ANSWER
    assert [(s.kind, s.agent, s.tool_name, s.tool_args, s.tool_result) for s in trace.steps] == [
        (StepKind.REASONING, "CodeAgent.run", None, {}, None),
        (StepKind.TOOL_CALL, "helper.run", "multiply", {"a": 17, "b": 23}, "391"),
        (StepKind.MESSAGE, "helper.run", "final_answer", {"answer": "391"}, "391"),
        (StepKind.TOOL_CALL, "CodeAgent.run", "add", {"a": 391, "b": 5}, "396"),
        (StepKind.FINAL_ANSWER, "CodeAgent.run", "final_answer", {"args": [ANSWER]}, ANSWER),
    ]
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_file(traced, trace, tmp_path)
