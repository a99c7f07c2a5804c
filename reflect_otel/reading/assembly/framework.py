"""Which framework made the trace, guessed from its metadata, span names and instrumentation scopes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reflect_otel.reading.semconv import VercelAIAttributes
from reflect_otel.trace import TraceSource

from .tree import AGENT, SpanTree

__all__ = ["trace_source"]


def trace_source(tree: SpanTree, metadata: Mapping[str, Any], *, collector: str) -> TraceSource:
    """``metadata``: the run's (the root's, else the first acting span's)."""
    scopes = sorted({s.scope for s in tree.spans.values() if s.scope})
    return TraceSource(
        framework=_framework(tree, metadata, scopes),
        instrumentation=tuple(scopes),
        collector=collector,
        service=tree.root.service,
    )


def _framework(tree: SpanTree, metadata: Mapping[str, Any], scopes: list[str]) -> str:
    if any(str(k).startswith("langgraph") for k in metadata) or any(p.span.name == "LangGraph" for p in tree.order[:1]):
        return "langgraph"
    if any("smolagents" in scope for scope in scopes) or any(
        k.startswith("smolagents.") for p in tree.order if p.kind == AGENT for k in p.span.attributes
    ):
        return "smolagents"
    if any("langchain" in scope for scope in scopes):
        return "langchain"
    if any(VercelAIAttributes.OPERATION_ID in s.attributes for s in tree.spans.values()):
        return "vercel-ai"
    if any(scope.startswith("strands.") for scope in scopes):  # Strands Agents' own tracer
        return "strands"
    if any("openai" in scope for scope in scopes):
        return "openai"
    return "unknown"
