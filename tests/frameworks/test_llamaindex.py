"""LlamaIndex's FunctionAgent and ReActAgent with their real OpenInference instrumentation against a scripted server on loopback.
LlamaIndex needs ``openai<3`` where most other frameworks need ``openai>=3``, so the agent runs in an environment of
its own (:func:`~tests.frameworks.tracing.own_environment`). The run is rebuilt exactly, live and from an OTLP/JSON file of the same spans: the
framework's preparation step (an LLM-kind span that calls no model) is no step, tool results are what the model
was shown (not the ``ToolOutput`` wrapper), the question is the user's message (not the workflow's state) and the
answer the text inside the ``StopEvent`` repr."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflect_otel.trace import StepKind, StructuredTrace
from tests.frameworks.script import ANSWER, QUESTION
from tests.frameworks.tracing import run_app, same_trace_from_otlp_json

pytestmark = [pytest.mark.frameworks, pytest.mark.slow]


def _run(kind: str, tmp_path: Path, python: Path) -> StructuredTrace:
    run = run_app("tests.frameworks.llamaindex_app", kind, python=python)
    assert run["answer"] == ANSWER
    (trace,) = [StructuredTrace.model_validate(t) for t in run["traces"]]
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert not trace.warnings, trace.warnings
    assert trace.metadata["raw_input"].startswith('{"init_state"')  # the root's own value is kept
    same_trace_from_otlp_json(run["otlp"], trace, tmp_path)
    return trace


def test_llamaindex_function_agent(tmp_path: Path, openai2_python: Path) -> None:
    trace = _run("function", tmp_path, openai2_python)
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.tool_call_id, s.reasoning) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", "call_1", "I multiply first."),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", "call_2", "Now add 5."),
        (StepKind.FINAL_ANSWER, None, {}, None, None, ANSWER),
    ]


def test_llamaindex_react_agent(tmp_path: Path, openai2_python: Path) -> None:
    """The model writes its calls as text (``Action: multiply``); the reply that wrote one is that tool call."""
    from tests.frameworks.llamaindex_app import REACT

    trace = _run("react", tmp_path, openai2_python)
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.reasoning) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", REACT[0]),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", REACT[1]),
        (StepKind.FINAL_ANSWER, None, {}, None, REACT[2]),
    ]
