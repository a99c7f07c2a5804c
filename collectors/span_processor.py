"""In-process collection: an OpenTelemetry ``SpanProcessor`` that hands finished traces to a sink."""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from reflect_otel.assembly import AssemblyLimits
from reflect_otel.collectors._buffer import BufferLimits, CollectorStats, TraceCollector, TraceSink
from reflect_otel.spans import SpanRecord

__all__ = ["ReflectSpanProcessor", "span_record_from_readable"]


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
        name=span.name or "",
        start_ns=span.start_time or 0,
        end_ns=span.end_time,
        attributes=dict(span.attributes or {}),
        status=span.status.status_code.name.lower(),
        status_message=span.status.description,
        dropped_attributes=span.dropped_attributes,
        scope=scope.name if scope is not None else None,
    )


class ReflectSpanProcessor(SpanProcessor):
    """Buffers finished spans per trace and, when a trace's root span ends (plus a grace period for late
    children), assembles it into a ``StructuredTrace`` and calls ``sink`` with it on a worker thread.

    ``on_end`` appends the span to a bounded queue and returns: O(1), no locks on the accepting path, never raises.
    Memory is bounded by :class:`BufferLimits`; what is dropped or evicted is counted in :meth:`stats`.
    """

    def __init__(
        self,
        sink: TraceSink,
        *,
        limits: BufferLimits | None = None,
        assembly_limits: AssemblyLimits | None = None,
    ) -> None:
        self._collector: TraceCollector[ReadableSpan] = TraceCollector(
            sink,
            convert=span_record_from_readable,
            collector_name="span_processor",
            limits=limits,
            assembly_limits=assembly_limits,
        )
        self._submit = self._collector.submit
        self._wake = self._collector._wake.set

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self._submit(span)
            parent = span.parent
            if parent is None or parent.is_remote:  # a root ended: let the worker start its grace period now
                self._wake()
        except Exception:  # the agent's hot path never raises, whatever happens here
            return

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._collector.force_flush(timeout_millis / 1000)

    def shutdown(self) -> None:
        self._collector.shutdown()

    def stats(self) -> CollectorStats:
        """Counters of spans taken, dropped (by reason) and traces assembled."""
        return self._collector.stats()
