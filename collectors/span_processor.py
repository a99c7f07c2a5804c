"""In-process collection: an OpenTelemetry ``SpanProcessor`` that hands finished traces to a sink."""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from reflect_otel.collectors.trace_collector import BufferLimits, CollectorStats, TraceCollector, TraceSink
from reflect_otel.reading.assembly import AssemblyLimits
from reflect_otel.reading.spans import span_record_from_readable

__all__ = ["ReflectSpanProcessor"]


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

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        try:
            # no wake-up of the worker (an Event.set() takes a lock that a flood of threads contends for): it
            # polls every tick_s (50 ms), well inside the grace period a finished trace waits anyway
            self._submit(span)
        except Exception:  # the agent's hot path never raises, whatever happens here
            return

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._collector.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._collector.shutdown()

    def stats(self) -> CollectorStats:
        """Counters of spans taken, dropped (by reason) and traces assembled."""
        return self._collector.stats()
