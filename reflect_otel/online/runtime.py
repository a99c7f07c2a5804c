"""The online worker: finished runs of observed agents go to a bounded queue; one thread hands each to the
attribution service. The agent's side (``register``, ``submit``) never blocks and never raises: when the queue is
full a trace is dropped and counted; a failure in the worker is logged and counted."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import Tracer

from reflect_otel._worker import BatchWorker, QueueBounds
from reflect_otel.attribution.service import AttributionService
from reflect_otel.errors import ReflectError
from reflect_otel.llm.budget import TokenBudget
from reflect_otel.online._tally import OutcomeCounts
from reflect_otel.record import AttributionRecord
from reflect_otel.replay import ReplayAdapter
from reflect_otel.store import AttributionStore, RecordExporter
from reflect_otel.trace import StructuredTrace

__all__ = ["MAX_PENDING", "MAX_RECENT_RECORDS", "MAX_SAID", "OnlineStats", "PendingRun", "Runtime"]

_log = logging.getLogger("reflect_otel.online")
MAX_PENDING = 10_000
"""Runs started but not yet finished that are remembered; the oldest is forgotten beyond this."""
MAX_SAID = 1_000
"""Distinct failure messages remembered so that each is logged once; beyond this they are forgotten (and said again)."""
MAX_RECENT_RECORDS = 1_000
"""Records kept in memory for the process to read (the demo's report); the oldest is let go beyond this. The store
keeps every one."""


@dataclass(slots=True)
class OnlineStats(OutcomeCounts):
    """Counters of the online worker: what became of the runs judged (:class:`OutcomeCounts`, whose ``verified``,
    ``flagged``, ``attributed`` and ``verified_attributions`` read here as ``traces_*``), runs started, traces
    received and dropped (queue full), and worker failures."""

    runs: int = 0
    traces_received: int = 0
    traces_dropped: int = 0
    worker_errors: int = 0

    @property
    def traces_verified(self) -> int:
        return self.verified

    @property
    def traces_flagged(self) -> int:
        return self.flagged

    @property
    def traces_attributed(self) -> int:
        return self.attributed

    @property
    def traces_verified_attributions(self) -> int:
        return self.verified_attributions

    def as_dict(self) -> dict[str, int]:
        return {
            "runs": self.runs,
            "traces_received": self.traces_received,
            "traces_dropped": self.traces_dropped,
            "traces_verified": self.verified,
            "traces_flagged": self.flagged,
            "traces_attributed": self.attributed,
            "traces_verified_attributions": self.verified_attributions,
            "budget_skips": self.budget_skips,
            "export_errors": self.export_errors,
            "worker_errors": self.worker_errors,
            "tokens": self.tokens,
        }


@dataclass(frozen=True, slots=True)
class PendingRun:
    """What ``observe`` knew when the run started: its expected answer and replay adapter."""

    agent: str
    expected: str | None
    replay: ReplayAdapter | None
    context: str = ""
    """What the agent was given besides its question (``observe(context=...)``), shown to the auditor as data."""


class Runtime:
    """The configured online machinery; one per process (see :func:`reflect_otel.configure`).

    ``make_processor(sink)`` builds the span processor that rebuilds finished runs and calls ``sink`` with each;
    it is added to ``provider``. ``service`` verifies (triage), attributes, stores and exports.
    """

    def __init__(
        self,
        provider: TracerProvider,
        service: AttributionService,
        *,
        make_processor: Callable[[Callable[[StructuredTrace], None]], SpanProcessor],
        max_queue: int,
        metrics_shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.provider = provider
        self.service = service
        self.max_queue = max_queue
        self.stats = OnlineStats()
        self._records: deque[AttributionRecord] = deque(maxlen=MAX_RECENT_RECORDS)
        self.records_made = 0
        """Every record made, those let go included."""
        self._pending: OrderedDict[str, PendingRun] = OrderedDict()
        self._lock = threading.Lock()
        self._said: set[str] = set()
        self._worker: BatchWorker[StructuredTrace] = BatchWorker(
            self._handle, name="reflect-otel-online", bounds=QueueBounds(max_items=max_queue), on_error=self._failed
        ).start()
        self._metrics_shutdown = metrics_shutdown
        self.tracer: Tracer = provider.get_tracer("reflect_otel.observe")
        self.processor = make_processor(self.submit)
        provider.add_span_processor(self.processor)

    @property
    def store(self) -> AttributionStore | None:
        return self.service.store

    @property
    def exporters(self) -> dict[str, RecordExporter]:
        return self.service.exporters

    @property
    def budget(self) -> TokenBudget | None:
        return self.service.budget

    # -- the agent's side (never blocks, never raises) -----------------------------------------------------
    def register(self, trace_id: str, run: PendingRun) -> None:
        with self._lock:
            self._pending[trace_id] = run
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
            self.stats.runs += 1

    def submit(self, trace: StructuredTrace) -> None:
        """The span processor's sink: queue the trace for the worker, or drop and count it when full."""
        with self._lock:
            if trace.trace_id not in self._pending:
                return  # a trace of the application that no observed agent started
        self.stats.traces_received += 1
        if self._worker.put(trace) != "ok":
            self.stats.traces_dropped += 1
            _log.warning(
                "reflect-otel's queue is full (%d traces); trace %s was dropped", self.max_queue, trace.trace_id
            )

    # -- the worker ---------------------------------------------------------------------------------------
    def _handle(self, batch: list[tuple[StructuredTrace, int]]) -> None:
        for trace, _ in batch:
            with self._lock:
                run = self._pending.pop(trace.trace_id, None)
            if run is None:
                continue
            try:
                outcome = self.service.process(
                    trace, expected=run.expected, replay=run.replay, domain_context=run.context
                )
            except ReflectError as error:  # the run is recorded even when it could not be judged; the next goes on
                if self.store is not None:
                    self.store.write_trace(trace)
                self._failed([(trace, 0)], error)
                continue
            self.stats.count(outcome)
            if outcome.record is not None:
                with self._lock:
                    self._records.append(outcome.record)
                    self.records_made += 1

    @property
    def records(self) -> list[AttributionRecord]:
        """The latest records, oldest first (see :data:`MAX_RECENT_RECORDS`): a copy, safe while the worker adds."""
        with self._lock:
            return list(self._records)

    def records_after(self, seen: int) -> tuple[list[AttributionRecord], int]:
        """The records made after the first ``seen`` that are still kept, and how many have been made: a reader
        that passes back that count reads each kept record once."""
        with self._lock:
            fresh = min(self.records_made - seen, len(self._records))
            return list(self._records)[len(self._records) - fresh :] if fresh > 0 else [], self.records_made

    def _failed(self, batch: list[tuple[StructuredTrace, int]], error: Exception) -> None:
        """A failure in the worker: counted, and the worker goes on. One of ours (a model that cannot be had, a
        store that refuses) is one line, said once per message; anything else is a bug, logged with its
        traceback."""
        self.stats.worker_errors += len(batch)
        trace_id = batch[0][0].trace_id
        if not isinstance(error, ReflectError):
            _log.error("reflect-otel failed to process trace %s", trace_id, exc_info=error)
            return
        with self._lock:
            first = str(error) not in self._said
            if first and len(self._said) >= MAX_SAID:  # messages that name their run would grow it without end
                self._said.clear()
            self._said.add(str(error))
        if first:
            _log.error(
                "reflect-otel could not process trace %s: %s (said once: later runs that fail the same way are only "
                "counted)",
                trace_id,
                error,
            )

    def force_flush(self, timeout_millis: int = 600_000) -> bool:
        """Wait until every finished run has been processed; True when done in time."""
        self.processor.force_flush(timeout_millis)
        return self._worker.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        """Process what is queued (within ``timeout_millis``), then stop the worker, the service (its exporters and
        store) and the metrics."""
        self.force_flush(timeout_millis)
        self.processor.shutdown()  # it stays registered on the provider (OTel cannot remove one), idle
        self._worker.shutdown(timeout_millis)
        self.service.shutdown()
        if self._metrics_shutdown is not None:
            self._metrics_shutdown()

    def drain(self, timeout_s: float = 600.0) -> bool:
        """Deprecated: :meth:`force_flush` (milliseconds)."""
        return self.force_flush(int(timeout_s * 1000))
