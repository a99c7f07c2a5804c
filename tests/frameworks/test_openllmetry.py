"""OpenLLMetry's OpenAI instrumentation (``opentelemetry-instrumentation-openai``) on a plain tool loop whose tools
have no spans, against a scripted OpenAI-compatible server: its spans carry the conversation as indexed
``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` attributes and no OpenInference kind, the tool results only as
the next call's tool messages. The run is rebuilt exactly, live and from the same spans as OTLP/JSON (imported and received)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflect_otel.trace import StepKind, StructuredTrace
from tests.frameworks.script import ANSWER, QUESTION
from tests.frameworks.tracing import run_app, same_trace_from_otlp_json

pytestmark = pytest.mark.frameworks
pytest.importorskip("opentelemetry.instrumentation.openai")


def test_openllmetry_openai_instrumentation(tmp_path: Path) -> None:
    run = run_app("tests.frameworks.openllmetry_app", timeout_s=120)
    assert run["answer"] == ANSWER
    (trace,) = [StructuredTrace.model_validate(t) for t in run["traces"]]
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.tool_call_id, s.reasoning) for s in trace.steps] == [
        (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", "call_1", "I multiply first."),
        (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", "call_2", "Now add 5."),
        (StepKind.FINAL_ANSWER, None, {}, None, None, ANSWER),
    ]
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_json(run["otlp"], trace, tmp_path)
