"""Grouping spans into traces, and the worker that assembles them off the caller's thread.

Shared by the in-process :class:`ReflectSpanProcessor` and the OTLP receiver, so both bound memory and count
losses the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Generic, TypeVar

from reflect_otel._worker import Admission, BatchWorker, QueueBounds
from reflect_otel.errors import ConfigError
from reflect_otel.reading.assembly import AssemblyLimits, assemble_trace
from reflect_otel.reading.semconv import ReflectAttributes
from reflect_otel.reading.spans import SpanRecord, approx_bytes
from reflect_otel.trace import StructuredTrace, TraceWarning, WarningCode

__all__ = ["Admission", "BufferLimits", "CollectorStats", "TraceCollector", "TraceSink"]

_log = logging.getLogger("reflect_otel.collectors")

TraceSink = Callable[[StructuredTrace], None]
"""Receives each assembled trace on the collector's worker thread; exceptions are caught and counted."""

ItemT = TypeVar("ItemT")


@dataclass(frozen=True, slots=True)
class BufferLimits:
    """Bounds on a collector's memory, and how long it waits for a trace to complete."""

    max_queue_size: int = 65_536
    """Spans waiting for the worker; beyond it new spans are dropped and counted."""
    max_traces: int = 2_048
    """Traces being gathered at once; spans of further traces are dropped and counted."""
    max_spans_per_trace: int = 20_000
    """Spans kept for one trace; further spans are dropped, counted and noted on the trace."""
    max_bytes_per_trace: int = 32 * 1024 * 1024
    """Bytes (:func:`~reflect_otel.reading.spans.approx_bytes`) kept for one trace; further spans are dropped, counted and
    noted on the trace."""
    max_buffered_bytes: int = 256 * 1024 * 1024
    """Bytes held in the queue and the traces being gathered. Beyond it, :meth:`TraceCollector.offer` refuses a
    batch (the receiver answers 429 / RESOURCE_EXHAUSTED, so the sender retries) and spans of new traces from
    :meth:`TraceCollector.submit` are dropped and counted."""
    grace_s: float = 0.25
    """How long after its root ends a trace waits for late children."""
    ttl_s: float = 300.0
    """How long a trace whose root never ends is kept before it is assembled as incomplete."""
    assembly: AssemblyLimits | None = None
    """Bounds on each assembled trace (steps, text); None: :class:`~reflect_otel.reading.assembly.AssemblyLimits`'s
    defaults."""

    def __post_init__(self) -> None:
        for name in (
            "max_queue_size",
            "max_traces",
            "max_spans_per_trace",
            "max_bytes_per_trace",
            "max_buffered_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"BufferLimits.{name} must be at least 1, got {getattr(self, name)}")
        if self.grace_s < 0 or self.ttl_s <= 0:
            raise ConfigError("BufferLimits.grace_s must be >= 0 and ttl_s > 0")


@dataclass(slots=True)
class CollectorStats:
    """Counters since start. ``spans_taken`` = spans the worker took from the queue."""

    spans_taken: int = 0
    spans_dropped_queue_full: int = 0
    spans_dropped_trace_limit: int = 0
    spans_dropped_span_limit: int = 0
    spans_dropped_memory_limit: int = 0
    """Spans of new traces dropped because the buffered bytes were at ``max_buffered_bytes``."""
    spans_dropped_at_shutdown: int = 0
    """Spans submitted while the collector shut down (in process only; the receiver refuses them instead)."""
    spans_dropped_late: int = 0
    spans_dropped_invalid: int = 0
    spans_in_traces: int = 0
    traces_assembled: int = 0
    traces_skipped_replays: int = 0
    """Replay runs reflect-otel made itself (any span marked ``reflect.replay``, so a fragment whose root never
    came is skipped too): not application runs."""
    traces_expired: int = 0
    traces_incomplete_at_shutdown: int = 0
    assembly_errors: int = 0
    sink_errors: int = 0
    peak_queue_depth: int = 0
    peak_buffered_spans: int = 0
    peak_buffered_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class _Gathering:
    spans: list[SpanRecord] = field(default_factory=list)
    first_seen: float = 0.0
    root_ended_at: float | None = None
    dropped: int = 0
    bytes: int = 0


class _TraceBuffer:
    """Spans grouped by trace id. Owned by the worker thread alone, so it takes no locks."""

    def __init__(self, limits: BufferLimits, stats: CollectorStats) -> None:
        self.limits = limits
        self.stats = stats
        self.traces: OrderedDict[str, _Gathering] = OrderedDict()
        self.completed: OrderedDict[str, None] = OrderedDict()  # recent trace ids, to recognise late spans
        self.buffered = 0
        self.bytes = 0
        """Bytes of the spans buffered (read by producers without a lock: an int read is atomic)."""

    def add(self, span: SpanRecord, size: int, now: float) -> bool:
        """Buffer ``span`` of ``size`` bytes; True when it ended a root (a trace may now be complete)."""
        gathering = self.traces.get(span.trace_id)
        if gathering is None:
            if span.trace_id in self.completed:
                self.stats.spans_dropped_late += 1
                return False
            if len(self.traces) >= self.limits.max_traces:
                self.stats.spans_dropped_trace_limit += 1
                return False
            if self.bytes + size > self.limits.max_buffered_bytes:
                self.stats.spans_dropped_memory_limit += 1
                return False
            gathering = self.traces[span.trace_id] = _Gathering(first_seen=now)
        if (
            len(gathering.spans) >= self.limits.max_spans_per_trace
            or gathering.bytes + size > self.limits.max_bytes_per_trace
        ):
            gathering.dropped += 1
            self.stats.spans_dropped_span_limit += 1
            return False
        gathering.spans.append(span)
        gathering.bytes += size
        self.buffered += 1
        self.bytes += size
        self.stats.peak_buffered_spans = max(self.stats.peak_buffered_spans, self.buffered)
        self.stats.peak_buffered_bytes = max(self.stats.peak_buffered_bytes, self.bytes)
        if span.is_local_root and gathering.root_ended_at is None:
            gathering.root_ended_at = now
            return True
        return False

    def pop_ready(
        self, now: float, *, ignore_grace: bool = False, everything: bool = False
    ) -> list[tuple[str, _Gathering, bool]]:
        """Traces to assemble now, as (trace id, gathering, complete)."""
        ready = []
        for trace_id, gathering in list(self.traces.items()):
            ended = gathering.root_ended_at
            if ended is not None and (ignore_grace or now - ended >= self.limits.grace_s):
                ready.append((trace_id, gathering, True))
            elif ended is None and (everything or now - gathering.first_seen >= self.limits.ttl_s):
                ready.append((trace_id, gathering, False))
        for trace_id, gathering, _ in ready:
            del self.traces[trace_id]
            self.buffered -= len(gathering.spans)
            self.bytes -= gathering.bytes
            self.completed[trace_id] = None
        while len(self.completed) > 4 * self.limits.max_traces:
            self.completed.popitem(last=False)
        return ready


class TraceCollector(Generic[ItemT]):
    """Queue -> worker thread -> per-trace buffer -> assembly -> sink (the queue and thread:
    :class:`~reflect_otel._worker.BatchWorker`).

    ``submit`` (the in-process hot path) is O(1), never blocks and never raises: it appends to a bounded deque
    (``deque.append`` is atomic) or counts a drop. Conversion of submitted items to :class:`SpanRecord`
    (``convert``) happens on the worker, so the producer's hot path does no work beyond the append.

    ``offer`` (the receiver's path) takes a whole batch or none of it: it refuses when the collector is stopping or
    the batch would pass the queue's span or byte bounds, so a sender is told to retry instead of being
    acknowledged and then dropped. ``shutdown`` first stops admitting, then assembles everything admitted.
    """

    def __init__(
        self,
        sink: TraceSink,
        *,
        convert: Callable[[ItemT], SpanRecord | None],
        collector_name: str,
        limits: BufferLimits | None = None,
        assembly_limits: AssemblyLimits | None = None,
        tick_s: float = 0.05,
    ) -> None:
        self._sink = sink
        self._convert = convert
        self._collector_name = collector_name
        self._limits = limits or BufferLimits()
        self._assembly_limits = assembly_limits or self._limits.assembly
        self._stats = CollectorStats()
        self._drop_lock = threading.Lock()
        self._exited = False
        self._buffer = _TraceBuffer(self._limits, self._stats)
        self._queue: BatchWorker[ItemT] = BatchWorker(
            self._take,
            name=f"reflect-otel-{collector_name}",
            bounds=QueueBounds(
                max_items=self._limits.max_queue_size,
                max_bytes=self._limits.max_buffered_bytes,
                held_bytes=lambda: self._buffer.bytes,
                max_batch=None,
            ),
            tick_s=tick_s,
            idle=self._emit_ready,
        ).start()
        self._append = self._queue.append

    # -- producer side (any thread) ---------------------------------------------------------------------------
    def submit(self, item: ItemT) -> None:
        """Queue one item for the worker, or count it dropped when the queue is full or the collector stopped."""
        answer = self._append(item)  # its size is counted once converted, on the worker
        if answer != "ok":
            with self._drop_lock:
                if answer == "stopping":
                    self._stats.spans_dropped_at_shutdown += 1
                else:
                    self._stats.spans_dropped_queue_full += 1

    def submit_many(self, items: Iterable[ItemT]) -> None:
        for item in items:
            self.submit(item)
        self._queue.wake()

    def has_room(self, size: int) -> bool:
        """Whether ``size`` more bytes would fit now (a hint before costly decoding; :meth:`offer` decides)."""
        return self._queue.has_room(size)

    def offer(self, items: Sequence[ItemT], sizes: Sequence[int]) -> Admission:
        """Queue all of ``items`` (``sizes`` in bytes, one per item) or none: ``"stopping"`` once shutdown has
        begun, ``"full"`` when the queue's spans or the bytes held (queued and buffered) would pass their bounds.
        A refused batch is not counted as dropped: the caller answers so that the sender retries."""
        return self._queue.put_all(items, sizes)

    def stats(self) -> CollectorStats:
        """A snapshot of the counters."""
        with self._drop_lock:
            return CollectorStats(**self._stats.as_dict())

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Process everything queued so far and assemble every trace whose root has ended. True when done in time."""
        return self._queue.force_flush(timeout_millis, then=lambda: self._emit_now(everything=False))

    def stop_admitting(self) -> None:
        """Refuse every later :meth:`offer` (``"stopping"``) and drop later :meth:`submit` s (counted); what was
        admitted is still assembled by :meth:`shutdown`."""
        self._queue.stop_admitting()  # under offer()'s lock: the shutdown flush sees every admitted span

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        """Stop accepting spans, assemble everything admitted (incomplete traces marked so), stop the worker,
        waiting up to ``timeout_millis`` for each."""
        if self._exited:
            return
        self.stop_admitting()
        done = self._queue.force_flush(timeout_millis, then=lambda: self._emit_now(everything=True))
        self._exited = True
        self._queue.shutdown(timeout_millis, drain=False)
        left = self._queue.discard()  # submit() raced the flush: counted, never silently lost
        if left:
            with self._drop_lock:
                self._stats.spans_dropped_at_shutdown += left
        if not done or self._queue.running:
            _log.warning("the collector did not finish assembling within %d ms", timeout_millis)

    # -- worker ----------------------------------------------------------------------------------------------
    def _take(self, batch: list[tuple[ItemT, int]]) -> None:
        """Convert and buffer ``batch`` (everything queued when the worker looked)."""
        if len(batch) > self._stats.peak_queue_depth:
            self._stats.peak_queue_depth = len(batch)
        now = time.monotonic()
        for item, size in batch:
            self._stats.spans_taken += 1
            try:
                record = self._convert(item)
            except Exception:
                record = None
            if record is None:
                self._stats.spans_dropped_invalid += 1
                continue
            self._buffer.add(record, size or approx_bytes(record), now)

    def _emit_ready(self) -> bool:
        """Assemble the traces whose grace period or time to live has passed (the worker's idle work)."""
        self._emit(self._buffer.pop_ready(time.monotonic()))
        return False

    def _emit_now(self, *, everything: bool) -> None:
        """Assemble every trace whose root has ended (and, with ``everything``, the others as incomplete)."""
        self._emit(self._buffer.pop_ready(time.monotonic(), ignore_grace=True, everything=everything))

    def _emit(self, ready: list[tuple[str, _Gathering, bool]]) -> None:
        for trace_id, gathering, complete in ready:
            if any(s.attributes.get(ReflectAttributes.REPLAY) is True for s in gathering.spans):
                self._stats.traces_skipped_replays += 1
                continue
            warnings = []
            if gathering.dropped:
                warnings.append(
                    TraceWarning(
                        code=WarningCode.DROPPED_SPANS,
                        message=f"{gathering.dropped} span(s) over the per-trace limits of "
                        f"{self._limits.max_spans_per_trace} spans and {self._limits.max_bytes_per_trace} bytes were "
                        "dropped; raise BufferLimits.max_spans_per_trace or max_bytes_per_trace",
                    )
                )
            if not complete:
                if self._queue.refusing or gathering.first_seen + self._limits.ttl_s > time.monotonic():
                    self._stats.traces_incomplete_at_shutdown += 1
                else:
                    self._stats.traces_expired += 1
                warnings.append(
                    TraceWarning(
                        code=WarningCode.ROOT_NEVER_ENDED,
                        message="the root span had not ended when the trace was assembled; steps may be missing",
                    )
                )
            try:
                trace = assemble_trace(
                    gathering.spans,
                    collector=self._collector_name,
                    limits=self._assembly_limits,
                    warnings=warnings,
                )
            except Exception:
                self._stats.assembly_errors += 1
                _log.exception("could not assemble trace %s", trace_id)
                continue
            self._stats.traces_assembled += 1
            self._stats.spans_in_traces += len(gathering.spans)
            try:
                self._sink(trace)
            except Exception:
                self._stats.sink_errors += 1
                _log.exception("trace sink failed for trace %s", trace_id)
