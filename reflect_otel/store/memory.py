"""The reference store: the whole :class:`~reflect_otel.store.AttributionStore` contract in memory (as LangGraph's
``InMemorySaver`` is for its checkpointers), for tests, notebooks and short runs that need no file. Nothing outlives
the process, and there is no SQL: the dashboards and the ``sql``/``stats``/``report`` commands read the DuckDB and
PostgreSQL stores. The conformance suite runs it first."""

from __future__ import annotations

import itertools
import threading

from reflect_otel.record import AttributionRecord
from reflect_otel.store._protocol import JOB_RANK, AttributionJob, StoreStats, moves_on
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = ["InMemoryStore"]


class InMemoryStore:
    """Writes are applied at once under a lock (so ``force_flush`` has nothing to wait for), each an idempotent
    upsert by the same keys as the other backends: a trace by its id, a verdict by (trace, verifier), a record by
    (trace, method), a job by its trace, never taken back (:func:`~reflect_otel.store.moves_on`). Values are frozen,
    so what is read back is what was written. ``stats`` counts as the other backends do (``dropped``, ``errors``
    and ``unstored`` stay 0: memory neither fills up nor goes away)."""

    def __init__(self) -> None:
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._traces: dict[str, StructuredTrace] = {}
        self._verdicts: dict[tuple[str, str], Verdict] = {}
        self._records: dict[tuple[str, str], AttributionRecord] = {}
        self._jobs: dict[str, tuple[int, AttributionJob]] = {}
        """Each job with the order of its last applied write (``pending_jobs`` lists the oldest first)."""
        self._order = itertools.count()

    # -- writes ----------------------------------------------------------------------------------------------
    def write_trace(self, trace: StructuredTrace) -> None:
        if not isinstance(trace, StructuredTrace):
            self._reject()
            return
        with self._lock:
            self._traces[trace.trace_id] = trace
            self.stats.traces += 1

    def write_verdict(self, trace_id: str, verdict: Verdict) -> None:
        if not isinstance(verdict, Verdict) or not trace_id:
            self._reject()
            return
        with self._lock:
            self._verdicts[(trace_id, verdict.verifier)] = verdict
            self.stats.verdicts += 1

    def write_record(self, record: AttributionRecord) -> None:
        if not isinstance(record, AttributionRecord):
            self._reject()
            return
        with self._lock:
            self._records[(record.trace_id, record.method)] = record
            self.stats.records += 1

    def write_job(self, job: AttributionJob) -> None:
        if not isinstance(job, AttributionJob) or not job.trace_id or job.status not in JOB_RANK:
            self._reject()
            return
        with self._lock:
            held = self._jobs.get(job.trace_id)
            if moves_on(job.status, job.attempts, (held[1].status, held[1].attempts) if held else None):
                self._jobs[job.trace_id] = (next(self._order), job)
            self.stats.jobs += 1  # counted as applied, as the other backends count a write that changed nothing

    def _reject(self) -> None:
        with self._lock:
            self.stats.rejected += 1

    # -- reads -----------------------------------------------------------------------------------------------
    def pending_jobs(self, limit: int) -> list[AttributionJob]:
        with self._lock:
            waiting = sorted(
                (order, job.trace_id, job) for order, job in self._jobs.values() if job.status in ("pending", "running")
            )
        return [job for _, _, job in waiting[: max(0, limit)]]

    def read_job(self, trace_id: str) -> AttributionJob | None:
        with self._lock:
            held = self._jobs.get(trace_id)
        return held[1] if held else None

    def read_trace(self, trace_id: str) -> StructuredTrace | None:
        with self._lock:
            return self._traces.get(trace_id)

    def recent_records(self, limit: int, *, excluding: str = "") -> list[tuple[str, AttributionRecord]]:
        """As :class:`~reflect_otel.store.ReadsRecords` says: newest first, then by trace and method."""
        with self._lock:
            found = [
                (self._traces[record.trace_id].question, record)
                for record in self._records.values()
                if record.method != excluding and record.root_cause.strip() and record.trace_id in self._traces
            ]
        found.sort(key=lambda pair: (pair[1].trace_id, pair[1].method))
        found.sort(key=lambda pair: pair[1].created_at, reverse=True)
        return found[: max(0, limit)]

    # -- lifecycle -------------------------------------------------------------------------------------------
    def failed_writes(self) -> tuple[int, str]:
        return 0, ""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every write was applied when it returned

    def shutdown(self) -> None:
        """Nothing to release; what was written stays readable until the store is dropped."""
