"""The collector's attribution worker: runs received from other processes are verified and, when flagged,
attributed, off the receive path, without ever losing one that was acknowledged.

Every run offered is first written to the store as an :class:`~reflect_otel.store.AttributionJob` (``pending``):
the store is the work list. The worker keeps up to ``max_bytes`` of runs in memory to avoid reading them back;
when attribution falls behind, further runs wait in the store only, and the worker reads them back (oldest first)
once the memory queue is empty. A stop leaves whatever was not done ``pending`` (a job cut short stays
``running`` and counts as pending), for the next ``collect --attribute`` or ``attribute --pending`` to take.
``offer`` never blocks on attribution and never raises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields

from reflect_otel._worker import BatchWorker, QueueBounds
from reflect_otel.attribution.service import AttributionService
from reflect_otel.online._tally import OutcomeCounts
from reflect_otel.store import AttributionJob, AttributionStore
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, StructuredTrace

__all__ = ["AttributionWorker", "WorkerStats", "expected_answer_of"]

_log = logging.getLogger("reflect_otel.online.work")
_BATCH = 16
"""Jobs read back from the store at a time."""
_COUNT_AT_START = 100_000
"""Runs waiting from before that ``start`` counts (the status line's pending figure; all are taken regardless)."""


def expected_answer_of(trace: StructuredTrace) -> str | None:
    """The answer the run's root span says it should give (``reflect.expected_answer``), else None."""
    return trace.metadata.get(EXPECTED_ANSWER_FIELD) or None


def _size(trace: StructuredTrace) -> int:
    """Bytes a queued trace holds, roughly: the text of its steps and answer (what dominates)."""
    text = sum(len(s.tool_result or "") + len(s.reasoning or "") + len(str(s.tool_args)) for s in trace.steps)
    return 1_024 + text + len(trace.question) + len(trace.final_answer or "")


@dataclass(slots=True)
class WorkerStats(OutcomeCounts):
    """What the status line shows: the outcomes counted (:class:`OutcomeCounts`), runs offered, queued in memory
    (and their bytes), ``pending`` (waiting in the store only, not in memory) and failed."""

    offered: int = 0
    queued: int = 0
    queued_bytes: int = 0
    pending: int = 0
    failed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class AttributionWorker:
    """One thread that hands stored runs to ``service`` (which triages, attributes, stores and exports)."""

    def __init__(self, service: AttributionService, store: AttributionStore, *, max_bytes: int = 64 << 20) -> None:
        self.service = service
        self.store = store
        self.max_bytes = max_bytes
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        self._in_store = True  # runs left by an earlier process may be waiting: look once at start
        self._memory: BatchWorker[StructuredTrace] = BatchWorker(
            self._attribute_queued,
            name="reflect-otel-attribution",
            bounds=QueueBounds(max_bytes=max_bytes),
            tick_s=1.0,
            idle=lambda: self._in_store and self._from_store(),
        )

    def start(self) -> AttributionWorker:
        """Start the thread; runs an earlier process left pending are counted and taken first."""
        self.stats.pending = len(self.store.pending_jobs(_COUNT_AT_START))
        self._memory.start()
        return self

    # -- the receive side (never blocks on attribution, never raises) ------------------------------------------
    def offer(self, trace: StructuredTrace) -> None:
        """Store ``trace``'s job as pending (the trace itself is written by the caller), and queue it in memory
        when there is room."""
        try:
            self.store.write_job(AttributionJob(trace.trace_id, "pending", expected_answer=expected_answer_of(trace)))
            size = _size(trace)
            with self._lock:
                self.stats.offered += 1
                if self._memory.put(trace, size) == "ok":
                    self.stats.queued += 1
                    self.stats.queued_bytes += size
                else:  # back-pressure: the run waits in the store, never dropped
                    self._in_store = True
                    self.stats.pending += 1
        except Exception:  # the receiver must go on; the trace is in the --out file and the store
            _log.exception("queueing trace %s for attribution failed", trace.trace_id)

    # -- the worker thread ---------------------------------------------------------------------------------
    def _attribute_queued(self, batch: list[tuple[StructuredTrace, int]]) -> None:
        for trace, size in batch:
            try:
                self._attribute(trace, expected_answer_of(trace), attempts=0)
            finally:
                with self._lock:
                    self.stats.queued -= 1
                    self.stats.queued_bytes -= size

    def _from_store(self) -> bool:
        """Attribute a batch of runs waiting in the store; False when none is left."""
        with self._lock:
            in_memory = {trace.trace_id for trace in self._memory.queued()}
            self._in_store = False
        jobs = [j for j in self.store.pending_jobs(_BATCH + len(in_memory)) if j.trace_id not in in_memory]
        for job in jobs[:_BATCH]:
            if self._memory.stopping:
                break
            trace = self.store.read_trace(job.trace_id)
            if trace is None:
                self.store.write_job(
                    AttributionJob(
                        job.trace_id, "failed", job.attempts, job.expected_answer, "the trace is not in the store"
                    )
                )
                self.stats.failed += 1
                continue
            self._attribute(trace, job.expected_answer, attempts=job.attempts)
            with self._lock:
                self.stats.pending = max(0, self.stats.pending - 1)
        if jobs:
            with self._lock:
                self._in_store = True  # there may be more
        return bool(jobs)

    def attribute(self, trace: StructuredTrace, expected: str | None, *, attempts: int) -> None:
        """Judge and (when flagged) attribute one run now, in the calling thread, its job's status kept in the
        store: ``running`` (attempt ``attempts + 1``), then ``done`` or ``failed``."""
        self._attribute(trace, expected, attempts=attempts)

    def _attribute(self, trace: StructuredTrace, expected: str | None, *, attempts: int) -> None:
        self.store.write_job(AttributionJob(trace.trace_id, "running", attempts + 1, expected))
        try:
            outcome = self.service.process(trace, expected=expected, trace_stored=True)  # the caller stored it
        except Exception as error:  # a bug must not stop the worker; the job says what happened
            _log.exception("attributing trace %s failed", trace.trace_id)
            self.stats.failed += 1
            self.store.write_job(
                AttributionJob(trace.trace_id, "failed", attempts + 1, expected, f"{type(error).__name__}: {error}")
            )
            return
        self.stats.count(outcome)
        reason = None
        if not outcome.flagged:
            reason = "not flagged: judged correct, or not judged"
        elif outcome.budget_skipped:
            reason = outcome.record.reason if outcome.record is not None else "budget spent"
        self.store.write_job(AttributionJob(trace.trace_id, "done", attempts + 1, expected, reason))

    def run_pending(self, progress: Callable[[WorkerStats], None] | None = None) -> WorkerStats:
        """Attribute every run waiting in the store, in the calling thread (``attribute --pending``); calls
        ``progress`` after each batch. Without :meth:`start`."""
        self.stats.pending = len(self.store.pending_jobs(_COUNT_AT_START))
        self._in_store = True
        while self._from_store():
            if progress is not None:
                progress(self.stats)
        return self.stats

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait until the runs queued in memory are attributed; True when done in time."""
        return self._memory.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        """Stop after the run being attributed (waiting up to ``timeout_millis``); what is left stays pending."""
        self._memory.shutdown(timeout_millis, drain=False)
