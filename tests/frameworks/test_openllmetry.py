"""OpenLLMetry's OpenAI instrumentation (``opentelemetry-instrumentation-openai``) on a plain tool loop whose tools
have no spans, against a scripted OpenAI-compatible server: its spans carry the conversation as indexed
``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` attributes and no OpenInference kind, the tool results only as
the next call's tool messages. The run is rebuilt exactly, live and from the same spans as OTLP/JSON (imported and received)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflect_otel.trace import StructuredTrace
from tests.frameworks.script import ANSWER, QUESTION, STEPS, steps_of
from tests.frameworks.tracing import run_app, same_trace_from_otlp_json

pytestmark = pytest.mark.frameworks
pytest.importorskip("opentelemetry.instrumentation.openai")


def test_openllmetry_openai_instrumentation(tmp_path: Path) -> None:
    run = run_app("tests.frameworks.openllmetry_app", timeout_s=120)
    assert run["answer"] == ANSWER
    (trace,) = [StructuredTrace.model_validate(t) for t in run["traces"]]
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert steps_of(trace) == STEPS
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_json(run["otlp"], trace, tmp_path)
