"""The neutral span every collector converts to before assembly.

A plain frozen, slotted dataclass rather than a pydantic model: collectors build hundreds of thousands of these a
second and none crosses a process boundary (traces do), so validation happens once, in the collector that
decodes the untrusted bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reflect_otel._values import utf8_text

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = [
    "MAX_EVENTS_PER_SPAN",
    "AttributeValue",
    "SpanEvent",
    "SpanRecord",
    "approx_bytes",
    "is_span_id",
    "is_trace_id",
    "service_name",
    "span_record_from_readable",
]

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[bool] | Sequence[int] | Sequence[float]

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def is_trace_id(value: str) -> bool:
    """True for a valid, non-zero, lower-case hex OTel trace id."""
    return _TRACE_ID.fullmatch(value) is not None and value != _ZERO_TRACE


def is_span_id(value: str) -> bool:
    """True for a valid, non-zero, lower-case hex OTel span id."""
    return _SPAN_ID.fullmatch(value) is not None and value != _ZERO_SPAN


MAX_EVENTS_PER_SPAN = 128
"""Events kept per span (the SDK's default limit); later ones are dropped at decoding."""


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """A span event: its name and attributes (GenAI conventions before v1.37 put messages there)."""

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One finished span. Ids are lower-case hex; times are Unix nanoseconds; ``status`` is unset, ok or error."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int | None
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    status: str = "unset"
    status_message: str | None = None
    dropped_attributes: int = 0
    scope: str | None = None
    parent_is_remote: bool = False
    """True when the parent lives in another process: this span is then the local root of the trace."""
    events: tuple[SpanEvent, ...] = ()
    service: str | None = None
    """The ``service.name`` of the resource that sent the span (which replay endpoint serves its agent)."""

    @property
    def is_local_root(self) -> bool:
        """True for the span a trace's assembly starts from in this process."""
        return self.parent_id is None or self.parent_is_remote


def span_record_from_readable(span: ReadableSpan) -> SpanRecord | None:
    """Convert an SDK span; None when it has no valid context."""
    context = span.context
    if context is None or not context.is_valid:
        return None
    parent = span.parent
    scope = span.instrumentation_scope
    return SpanRecord(
        trace_id=format(context.trace_id, "032x"),
        span_id=format(context.span_id, "016x"),
        parent_id=format(parent.span_id, "016x") if parent is not None else None,
        parent_is_remote=bool(parent is not None and parent.is_remote),
        name=_utf8(span.name or ""),
        start_ns=span.start_time or 0,
        end_ns=span.end_time,
        attributes=_utf8_attributes(span.attributes or {}),  # type: ignore[arg-type]  # OTel values are ours
        status=span.status.status_code.name.lower(),
        status_message=_utf8(span.status.description) if span.status.description else None,
        dropped_attributes=span.dropped_attributes,
        scope=_utf8(scope.name) if scope is not None else None,
        events=tuple(
            SpanEvent(_utf8(event.name), _utf8_attributes(event.attributes or {}))  # type: ignore[arg-type]
            for event in list(span.events or ())[:MAX_EVENTS_PER_SPAN]
        ),
        service=service_name(span.resource.attributes if span.resource is not None else None),
    )


SERVICE_NAME = "service.name"
MAX_SERVICE_NAME_CHARS = 256


def service_name(resource_attributes: Mapping[str, object] | None) -> str | None:
    """A resource's ``service.name``, as text of at most :data:`MAX_SERVICE_NAME_CHARS`; None when it has none."""
    value = (resource_attributes or {}).get(SERVICE_NAME)
    if not isinstance(value, str) or not value.strip():
        return None
    return _utf8(value.strip()[:MAX_SERVICE_NAME_CHARS])


# An application's Python strings may hold lone surrogates ("\ud800"), which the SDK keeps and no UTF-8 writer
# (the JSONL file, DuckDB) accepts: a trace holding one would be lost at its sink. The checks run on the
# collector's worker thread, never in on_end; ASCII text, nearly all of it, costs one isascii() call.
def _utf8(text: str) -> str:
    return text if text.isascii() else utf8_text(text)


def _utf8_attributes(attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    return {
        _utf8(key): _utf8(value)
        if isinstance(value, str)
        else tuple(_utf8(v) if isinstance(v, str) else v for v in value)
        if isinstance(value, (list, tuple))
        else value
        for key, value in attributes.items()
    }


_SPAN_OVERHEAD_BYTES = 200
"""What a span costs besides its text: ids, times, the record and its dict (measured order of magnitude)."""


def approx_bytes(span: SpanRecord) -> int:
    """The memory a span holds, approximately: its text lengths plus a fixed overhead. Collectors bound memory by
    this, so a few spans with huge attributes count as much as many small ones."""
    size = _SPAN_OVERHEAD_BYTES + len(span.name) + len(span.status_message or "")
    attribute_maps = [span.attributes, *(event.attributes for event in span.events)]
    for key, value in (item for attributes in attribute_maps for item in attributes.items()):
        size += len(key) + 16
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, list | tuple):
            size += sum(len(v) if isinstance(v, str) else 8 for v in value)
    return size
