"""The online worker: finished runs of observed agents go to a bounded queue; one thread hands each to the
attribution service. The agent's side (``register``, ``submit``) never blocks and never raises: when the queue is
full a trace is dropped and counted; a failure in the worker is logged and counted."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import Tracer

from reflect_otel.llm.budget import TokenBudget
from reflect_otel.record import AttributionRecord, AttributionStatus
from reflect_otel.replay import ReplayAdapter
from reflect_otel.service import AttributionService
from reflect_otel.store import AttributionStore, RecordExporter
from reflect_otel.trace import StructuredTrace

__all__ = ["MAX_PENDING", "OnlineStats", "PendingRun", "Runtime"]

_log = logging.getLogger("reflect_otel.online")
MAX_PENDING = 10_000
"""Runs started but not yet finished that are remembered; the oldest is forgotten beyond this."""


@dataclass(slots=True)
class OnlineStats:
    """Counters of the online worker."""

    runs: int = 0
    traces_received: int = 0
    traces_dropped: int = 0
    traces_verified: int = 0
    traces_flagged: int = 0
    traces_attributed: int = 0
    traces_verified_attributions: int = 0
    budget_skips: int = 0
    export_errors: int = 0
    worker_errors: int = 0
    tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


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
        self.records: list[AttributionRecord] = []
        self._pending: OrderedDict[str, PendingRun] = OrderedDict()
        self._lock = threading.Lock()
        self._queue: queue.Queue[StructuredTrace | None] = queue.Queue(maxsize=max_queue)
        self._metrics_shutdown = metrics_shutdown
        self.tracer: Tracer = provider.get_tracer("reflect_otel.observe")
        self.processor = make_processor(self.submit)
        provider.add_span_processor(self.processor)
        self._worker = threading.Thread(target=self._work, name="reflect-otel-online", daemon=True)
        self._worker.start()

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
        try:
            self._queue.put_nowait(trace)
        except queue.Full:
            self.stats.traces_dropped += 1
            _log.warning(
                "reflect-otel's queue is full (%d traces); trace %s was dropped", self.max_queue, trace.trace_id
            )

    # -- the worker ---------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            trace = self._queue.get()
            if trace is None:
                self._queue.task_done()
                return
            try:
                self._handle(trace)
            except Exception:  # a bug here must not stop the worker
                self.stats.worker_errors += 1
                _log.exception("reflect-otel failed to process trace %s", trace.trace_id)
            finally:
                self._queue.task_done()

    def _handle(self, trace: StructuredTrace) -> None:
        with self._lock:
            run = self._pending.pop(trace.trace_id, None)
        if run is None:
            return
        outcome = self.service.process(trace, expected=run.expected, replay=run.replay, domain_context=run.context)
        self.stats.traces_verified += 1
        if not outcome.flagged:
            return
        self.stats.traces_flagged += 1
        if outcome.budget_skipped:
            self.stats.budget_skips += 1
        elif outcome.record is not None:
            self.stats.tokens += outcome.tokens
            self.stats.traces_attributed += 1
            if outcome.record.status is AttributionStatus.VERIFIED:
                self.stats.traces_verified_attributions += 1
        self.stats.export_errors += len(outcome.export_failures)
        if outcome.record is not None:
            with self._lock:
                self.records.append(outcome.record)

    def drain(self, timeout_s: float = 600.0) -> bool:
        """Wait until every finished run has been processed; True when done in time."""
        self.processor.force_flush(int(timeout_s * 1000))
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._queue.unfinished_tasks

    def close(self, timeout_s: float = 30.0) -> None:
        self.drain(timeout_s)
        self.processor.shutdown()  # it stays registered on the provider (OTel cannot remove one), idle
        self._queue.put(None)
        self._worker.join(timeout=timeout_s)
        self.service.close()
        if self._metrics_shutdown is not None:
            self._metrics_shutdown()
