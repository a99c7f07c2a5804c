"""CrewAI with its real OpenInference instrumentation against a scripted server on loopback, in the environment the
``openai<3`` frameworks share (:func:`~tests.frameworks.tracing.own_environment`).

As OpenInference documents for CrewAI, the model calls are traced by the model client's instrumentor: with it the
run is rebuilt exactly, live and from an OTLP/JSON file of the same spans. The question is the task as CrewAI put it
to the model (its framing around the task's description is part of what the agent was asked), and the answer is
the text under the crew output's ``raw`` key. With CrewAI's instrumentor alone no model call is on the trace: the
tool steps and the answer are still right, and warnings say the question and the model calls are missing and how to
get them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reflect_otel.trace import StepKind, StructuredTrace, WarningCode
from tests.frameworks.script import ANSWER, QUESTION
from tests.frameworks.tracing import run_app, same_trace_from_otlp_json

pytestmark = [pytest.mark.frameworks, pytest.mark.slow]


def _run(kind: str, tmp_path: Path, python: Path) -> tuple[StructuredTrace, dict[str, Any]]:
    run = run_app("tests.frameworks.crewai_app", kind, python=python)
    assert run["answer"] == ANSWER
    (trace,) = [StructuredTrace.model_validate(t) for t in run["traces"]]
    assert trace.final_answer == ANSWER
    assert trace.metadata["raw_output"].startswith('{"raw": "The answer is 396."')  # the root's own value is kept
    same_trace_from_otlp_json(run["otlp"], trace, tmp_path)
    return trace, run


def test_crewai_with_the_model_client_instrumented(tmp_path: Path, openai2_python: Path) -> None:
    trace, run = _run("with-openai", tmp_path, openai2_python)
    (task,) = [m["content"] for m in run["requests"][0]["messages"] if m["role"] == "user"]
    assert QUESTION in task
    assert trace.question == task
    assert not trace.warnings, trace.warnings
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.tool_call_id, s.reasoning) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", "call_1", "I multiply first."),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", "call_2", "Now add 5."),
        (StepKind.FINAL_ANSWER, None, {}, None, None, ANSWER),
    ]


def test_crewai_instrumentor_alone_says_the_question_is_missing(tmp_path: Path, openai2_python: Path) -> None:
    trace, _ = _run("alone", tmp_path, openai2_python)
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391"),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396"),
    ]
    assert trace.question == ""
    assert [w.code for w in trace.warnings] == [WarningCode.NO_QUESTION, WarningCode.NO_MODEL_CALLS]
    assert all("OpenAI" in w.message for w in trace.warnings)
