"""The write path every store backend shares: writes are validated and queued (any thread, never raising for
content), and one writer thread applies them in batches, each batch one transaction, deduplicated by key (the
last write of a key wins). A batch that fails is rolled back and retried one write at a time, so a bad write
cannot take the others down. A backend gives the transaction (:meth:`BatchedStore._write_batch`), a read
(:meth:`BatchedStore._read`) and the closing of its connections."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from reflect_otel._worker import BatchWorker
from reflect_otel.exporters._store_rows import (
    COUNTERS,
    JOB_STATUSES,
    StoreStats,
    Write,
    job_rows,
    record_rows,
    trace_rows,
    verdict_rows,
)
from reflect_otel.record import AttributionRecord
from reflect_otel.store import AttributionJob
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = ["BatchedStore"]

M = TypeVar("M", bound=BaseModel)

_log = logging.getLogger("reflect_otel.exporters.store")
_BATCH = 2_000
_LINGER_S = 0.05
"""How long the writer waits for more writes after the first of a batch: long enough for a burst to share one
transaction, short enough that a single write is visible at once to the eye."""
_ROOM_WAIT_S = 5.0
"""How long a write waits for room in a full queue before it is dropped (back-pressure on the collector's thread,
which then holds spans and answers its senders 429)."""


def _job(row: Sequence[Any]) -> AttributionJob:
    """A job from (trace_id, status, attempts, expected_answer, reason)."""
    return AttributionJob(row[0], row[1], row[2] or 0, row[3], row[4])


def _parsed(model: type[M], value: object) -> M:
    """A JSON column's value as ``model``: text, or what a driver that decodes JSON columns itself gives."""
    return model.model_validate_json(value) if isinstance(value, str | bytes) else model.model_validate(value)


class BatchedStore:
    """The :class:`~reflect_otel.store.AttributionStore` contract over a backend's transaction and read."""

    where: str = "the store"
    """The store's name in messages (a path, a server)."""

    def __init__(self, *, max_queue: int = 10_000, thread_name: str = "reflect-otel-store") -> None:
        self.stats = StoreStats()
        self._writer: BatchWorker[Write] = BatchWorker(
            self._write_all, name=thread_name, max_items=max_queue, max_batch=_BATCH, linger_s=_LINGER_S
        )

    def _start(self) -> None:
        self._writer.start()

    # -- the backend's part ------------------------------------------------------------------------------------
    def _write_batch(self, writes: Sequence[Write]) -> None:
        """Apply ``writes`` (one per key) in one transaction; roll it back and raise on any failure."""
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (``?`` placeholders) on a connection the writer does not use, seeing committed writes."""
        raise NotImplementedError

    # -- writes (any thread) ---------------------------------------------------------------------------------
    def _enqueue(self, write: Write) -> None:
        if self._writer.put(write, timeout_s=_ROOM_WAIT_S) != "ok":
            self.stats.dropped += 1
            _log.warning("the queue of %s is full or closed; a %s was dropped", self.where, write.kind)

    def write_trace(self, trace: StructuredTrace) -> None:
        if not isinstance(trace, StructuredTrace):
            self.stats.rejected += 1
            return
        self._enqueue(trace_rows(trace))

    def write_verdict(self, trace_id: str, verdict: Verdict) -> None:
        if not isinstance(verdict, Verdict) or not trace_id:
            self.stats.rejected += 1
            return
        self._enqueue(verdict_rows(trace_id, verdict))

    def write_record(self, record: AttributionRecord) -> None:
        if not isinstance(record, AttributionRecord):
            self.stats.rejected += 1
            return
        self._enqueue(record_rows(record))

    def write_job(self, job: AttributionJob) -> None:
        if not isinstance(job, AttributionJob) or not job.trace_id or job.status not in JOB_STATUSES:
            self.stats.rejected += 1
            return
        self._enqueue(job_rows(job))

    # -- reads -----------------------------------------------------------------------------------------------
    def pending_jobs(self, limit: int) -> list[AttributionJob]:
        self.flush()
        rows = self._read(
            "SELECT trace_id, status, attempts, expected_answer, reason FROM attribution_jobs "
            "WHERE status IN ('pending', 'running') ORDER BY updated_at, trace_id LIMIT ?",
            [max(0, limit)],
        )
        return [_job(row) for row in rows]

    def read_job(self, trace_id: str) -> AttributionJob | None:
        self.flush()
        rows = self._read(
            "SELECT trace_id, status, attempts, expected_answer, reason FROM attribution_jobs WHERE trace_id = ?",
            [trace_id],
        )
        return _job(rows[0]) if rows else None

    def read_trace(self, trace_id: str) -> StructuredTrace | None:
        self.flush()
        rows = self._read("SELECT trace_json FROM traces WHERE trace_id = ?", [trace_id])
        if not rows:
            return None
        try:
            return _parsed(StructuredTrace, rows[0][0])
        except ValidationError as error:  # written by another version, or edited by hand
            _log.warning("trace %s in %s is not a valid trace: %s", trace_id, self.where, error)
            return None

    def recent_records(self, limit: int, *, excluding: str = "") -> list[tuple[str, AttributionRecord]]:
        self.flush()
        rows = self._read(
            "SELECT coalesce(t.question, ''), a.trace_id, a.record_json FROM attributions a "
            "JOIN traces t ON t.trace_id = a.trace_id "  # the question, which the placebo must not share
            "WHERE a.method <> ? AND coalesce(a.root_cause, '') <> '' "
            "ORDER BY a.created_at DESC NULLS LAST, a.trace_id, a.method LIMIT ?",
            [excluding, max(0, limit)],
        )
        records: list[tuple[str, AttributionRecord]] = []
        for question, trace_id, text in rows:
            try:
                records.append((question, _parsed(AttributionRecord, text)))
            except ValidationError as error:  # written by another version, or edited by hand
                _log.warning("the record of trace %s in %s is not a valid record: %s", trace_id, self.where, error)
        return records

    @property
    def backlog(self) -> int:
        """Writes queued and not yet taken by the writer thread (approximate, for progress and benchmarks)."""
        return self._writer.backlog

    def flush(self, timeout_s: float = 30.0) -> bool:
        return self._writer.flush(timeout_s)

    def _stop_writer(self) -> None:
        self._writer.close(timeout_s=30)

    # -- the writer thread -----------------------------------------------------------------------------------
    def _write_all(self, batch: list[tuple[Write, int]]) -> None:
        writes = [write for write, _ in batch]
        if not self._apply(writes):
            for one in writes:  # a bad write rolled the batch back: apply one by one to keep the others
                self._apply([one])

    def _apply(self, batch: list[Write]) -> bool:
        """All of ``batch`` in one transaction; False (rolled back, counted when alone) on failure."""
        latest: dict[tuple[str, tuple[str, ...]], Write] = {}
        for write in batch:  # the same trace or record twice in a batch: the last one wins
            latest[(write.kind, write.key)] = write
        try:
            self._write_batch(list(latest.values()))
        except Exception:
            if len(batch) == 1:
                self.stats.errors += 1
                _log.exception("writing a %s to %s failed; it was rolled back", batch[0].kind, self.where)
            return False
        for write in batch:
            counter = COUNTERS[write.kind]
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        return True
