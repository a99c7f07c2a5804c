"""Google ADK with its real instrumentation against a scripted Gemini API server on loopback, in the frameworks' own
environment (:func:`~tests.frameworks.tracing.own_environment`). Four ways a user traces it:

- OpenInference's ADK instrumentor with the instrumentor of the client ADK calls (google-genai): the whole run.
- The ADK instrumentor alone: it records no model call of ADK 2, so the tool steps and the answer are right but
  have no reasoning, and a warning says which instrumentor adds them.
- ADK's own OTel GenAI spans with message content on the spans (``SPAN_ONLY``): the whole run.
- The same with content off: steps without text or arguments, and a warning that names the variable.

ADK writes the question and answer as its own objects (``new_message`` with ``parts``, an ``Event`` with
``content.parts``) and tool results as function responses (``{"id", "name", "response": {"result": ...}}``): the
user's text and the tool's value are taken out by shape, and the recorded value is kept beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reflect_otel.trace import StepKind, StructuredTrace, WarningCode
from tests.frameworks.script import ANSWER, QUESTION, STEPS, steps_of
from tests.frameworks.tracing import run_app, same_trace_from_otlp_json

pytestmark = [pytest.mark.frameworks, pytest.mark.slow]


def _run(kind: str, tmp_path: Path, python: Path) -> tuple[StructuredTrace, dict[str, Any]]:
    run = run_app("tests.frameworks.adk_app", kind, python=python)
    assert run["answer"] == ANSWER
    (trace,) = [StructuredTrace.model_validate(t) for t in run["traces"]]
    same_trace_from_otlp_json(run["otlp"], trace, tmp_path)
    return trace, run


def test_adk_with_openinference(tmp_path: Path, openai2_python: Path) -> None:
    trace, run = _run("openinference", tmp_path, openai2_python)
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert steps_of(trace) == STEPS
    assert not trace.warnings, trace.warnings
    # the function responses as ADK recorded them, kept beside the values taken out of them
    assert trace.steps[0].tool_result_raw == '{"id":"call_1","name":"multiply","response":{"result":391}}'
    assert '"new_message"' in trace.metadata["raw_input"] and '"parts"' in trace.metadata["raw_output"]
    assert run["requests"][0]["contents"][0]["parts"] == [{"text": QUESTION}]  # the model was asked for real


def test_adk_instrumentor_alone_says_the_model_calls_are_missing(tmp_path: Path, openai2_python: Path) -> None:
    trace, _ = _run("openinference-alone", tmp_path, openai2_python)
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert steps_of(trace) == [(k, n, a, r, i, "") for k, n, a, r, i, _ in STEPS[:2]]
    (warning,) = trace.warnings
    assert warning.code is WarningCode.NO_MODEL_CALLS and "Google GenAI" in warning.message


def test_adk_native_genai_spans_with_content(tmp_path: Path, openai2_python: Path) -> None:
    trace, _ = _run("genai", tmp_path, openai2_python)
    assert (trace.question, trace.final_answer, trace.agent) == (QUESTION, ANSWER, "calculator")
    assert steps_of(trace) == STEPS
    assert trace.steps[0].tool_result_raw == '{"result": 391}' and trace.steps[0].model_name == "scripted-gemini"
    assert [t.name for t in trace.tools] == ["multiply", "add"]
    assert not trace.warnings, trace.warnings


def test_adk_native_genai_spans_without_content_name_the_variable(tmp_path: Path, openai2_python: Path) -> None:
    trace, _ = _run("genai-no-content", tmp_path, openai2_python)
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_call_id, s.reasoning) for s in trace.steps] == [
        (StepKind.REASONING, None, {}, None, ""),
        (StepKind.TOOL_CALL, "multiply", {}, "call_1", ""),
        (StepKind.REASONING, None, {}, None, ""),
        (StepKind.TOOL_CALL, "add", {}, "call_2", ""),
        (StepKind.FINAL_ANSWER, None, {}, None, ""),
    ]
    assert (trace.question, trace.final_answer) == ("", None)
    assert [w.code for w in trace.warnings] == [WarningCode.NO_QUESTION, WarningCode.NO_MESSAGE_CONTENT]
    assert trace.warnings[1].message.startswith("3 model call(s) recorded without their messages")
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY" in trace.warnings[1].message
