"""LangGraph with ``ChatOpenAI`` in an application that has its own provider and LangChain instrumentation, plus
``observe`` (which turns on the OpenAI client's instrumentation): every model call is recorded twice, by two
instrumentations that do not nest, and reflect-otel still rebuilds one step per decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflect_otel.trace import StructuredTrace
from tests.frameworks.tracing import run_app, same_trace_from_otlp_json

pytestmark = pytest.mark.frameworks


def test_observe_in_an_instrumented_langgraph_app_gives_one_step_per_decision(tmp_path: Path) -> None:
    pytest.importorskip("langchain_openai")
    run = run_app("tests.frameworks.langgraph_app")
    assert run["answer"] == "The answer is 396."  # the application's result, untouched
    assert sorted(run["llm_spans"]) == ["ChatCompletion"] * 3 + ["ChatOpenAI"] * 3  # each call twice
    steps = [
        (s["kind"], s["tool_name"], s["tool_args"], s["tool_result"], s["reasoning"]) for s in run["trace"]["steps"]
    ]
    assert steps == [
        ("tool_call", "multiply", {"a": 17, "b": 23}, "391", "I multiply first."),
        ("tool_call", "add", {"a": 391, "b": 5}, "396", "Now add 5."),
        ("final_answer", None, {}, None, "The answer is 396."),
    ]
    assert run["trace"]["question"] == "What is 17 times 23, plus 5?" and not run["trace"]["warnings"]
    same_trace_from_otlp_json(run["otlp"], StructuredTrace.model_validate(run["trace"]), tmp_path)
