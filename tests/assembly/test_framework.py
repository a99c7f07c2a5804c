"""Which framework made a trace, guessed from its metadata, span names and instrumentation scopes."""

from __future__ import annotations

import pytest

from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.assembly.framework import trace_source
from reflect_otel.reading.assembly.tree import SpanTree
from tests.assembly.recorded import (
    LANGGRAPH_OBSERVED,
    LANGGRAPH_REACT,
    LITELLM,
    OPENAI_TOOL_LOOP,
    SMOLAGENTS_TOOLS,
    recorded_spans,
)
from tests.spans import span


@pytest.mark.parametrize(
    ("recording", "framework"),
    [
        (LANGGRAPH_REACT, "langgraph"),
        (LANGGRAPH_OBSERVED, "langgraph"),
        (SMOLAGENTS_TOOLS, "smolagents"),
        (OPENAI_TOOL_LOOP, "openai"),
        (LITELLM, "unknown"),
    ],
)
def test_recorded_runs(recording: str, framework: str) -> None:
    spans = recorded_spans(recording)
    source = assemble_trace(spans, collector="file").source  # with the run's metadata, as assembly finds it
    assert source.framework == framework and source.collector == "file"
    assert list(source.instrumentation) == sorted({s.scope for s in spans if s.scope})


def test_a_langgraph_root_span_or_a_smolagents_agent_attribute_names_the_framework() -> None:
    assert trace_source(SpanTree.of([span("CHAIN", name="LangGraph")]), {}, collector="x").framework == "langgraph"
    agent = span("AGENT", **{"smolagents.max_steps": 5})
    assert trace_source(SpanTree.of([agent]), {}, collector="x").framework == "smolagents"


def test_langgraph_metadata_names_langgraph_whatever_the_scopes_say() -> None:
    tree = SpanTree.of([span("CHAIN")])
    assert trace_source(tree, {"langgraph_step": 1}, collector="otlp").framework == "langgraph"
    assert trace_source(tree, {}, collector="otlp").framework == "unknown"
