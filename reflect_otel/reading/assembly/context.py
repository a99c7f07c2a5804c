"""What every step of one span shares (:class:`StepContext`), and the span readings several passes use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from reflect_otel import _values
from reflect_otel.reading.semconv import LangGraphMetadataKeys, SpanAttributes
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.trace import StepStatus

from .scrub import Scrubber

__all__ = ["StepContext", "span_metadata", "tool_name"]

_STATUS = {"ok": StepStatus.OK, "error": StepStatus.ERROR}


class StepContext(NamedTuple):
    """Who took a span's steps, when, how they ended, and where in a LangGraph run."""

    agent: str | None
    start_time_ns: int
    end_time_ns: int | None
    status: StepStatus
    status_message: str | None
    langgraph_step: int | None
    langgraph_node: str | None
    metadata: Mapping[str, Any]
    """The span's parsed ``metadata`` attribute (empty when it has none)."""
    agent_span_id: str | None = None
    """The enclosing AGENT span (:attr:`.tree.Placed.agent_span_id`): whose answer a last call may hand back."""

    @classmethod
    def of(
        cls, span: SpanRecord, agent: str | None, scrubber: Scrubber, agent_span_id: str | None = None
    ) -> StepContext:
        """``agent`` is the enclosing AGENT span's name (``agent_span_id`` its id); without one, the LangGraph node
        that ran the span."""
        metadata = span_metadata(span)
        node = metadata.get(LangGraphMetadataKeys.NODE)
        return cls(
            agent=agent if agent is not None else (str(node) if node else None),
            start_time_ns=span.start_ns,
            end_time_ns=span.end_ns,
            status=_STATUS.get(span.status, StepStatus.UNSET),
            status_message=scrubber.clean(span.status_message) if span.status_message else None,
            langgraph_step=_values.to_int(metadata.get(LangGraphMetadataKeys.STEP)),
            langgraph_node=str(node) if node else None,
            metadata=metadata,
            agent_span_id=agent_span_id,
        )


def span_metadata(span: SpanRecord) -> Mapping[str, Any]:
    """The span's ``metadata`` attribute as a JSON object; empty when it has none or it is not one."""
    parsed = _values.parse_json(span.attributes.get(SpanAttributes.METADATA))
    return parsed if isinstance(parsed, Mapping) else {}


def tool_name(name: str) -> str:
    """A tool's name as its author wrote it: instrumentations that wrap a callable object name it ``X.__call__``."""
    return name.removesuffix(".__call__")
