"""The write path every store backend shares: writes are validated and queued (any thread, never raising for
content), and one writer thread applies them in batches, each batch one transaction, deduplicated by key (the
last write of a key wins). A batch that fails is rolled back and retried one write at a time, so a bad write
cannot take the others down. A backend gives the transaction (:meth:`BatchedStore._write_batch`), a read
(:meth:`BatchedStore._read`) and the closing of its connections.

A store on a server can be out of reach (a cut network, a restart). A backend that says so of an error
(:meth:`BatchedStore._unavailable`) has the batch kept and tried again, after a jittered pause that doubles up to
10 s and a new connection (:meth:`BatchedStore._reconnect`), for as long as it takes: nothing queued is dropped
for the store's absence. Meanwhile writes queue up to ``max_queue``; past it a writer waits for room (the
collector's assembly thread, so its receiver answers 429 once its own buffers fill) instead of dropping. Only a
close gives up, after :data:`CLOSE_WAIT_S`, counting what it could not write (``stats.unstored``)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from typing import Any, Self, TypeVar

from pydantic import BaseModel, ValidationError

from reflect_otel._worker import BatchWorker, QueueBounds
from reflect_otel.exporters._store_rows import (
    COUNTERS,
    JOB_STATUSES,
    StoreStats,
    Write,
    job_rows,
    job_state,
    later_jobs,
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
which then holds spans and answers its senders 429); while the store is out of reach it waits without limit."""
CLOSE_WAIT_S = 15.0
"""How long a close keeps trying a store out of reach before it gives up the writes still queued."""
_MAX_PAUSE_S = 10.0


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
            self._write_all,
            name=thread_name,
            bounds=QueueBounds(max_items=max_queue, max_batch=_BATCH, linger_s=_LINGER_S),
        )
        self.unreachable_since: float | None = None
        """``time.monotonic()`` when the store was found out of reach, while it is; else None."""
        self._give_up_at: float | None = None
        self._closing = threading.Event()
        self._last_failure = ""

    def _start(self) -> None:
        self._writer.start()

    # -- the backend's part ------------------------------------------------------------------------------------
    def _write_batch(self, writes: Sequence[Write]) -> None:
        """Apply ``writes`` (one per key) in one transaction; roll it back and raise on any failure."""
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (``?`` placeholders) on a connection the writer does not use, seeing committed writes."""
        raise NotImplementedError

    def _unavailable(self, error: Exception) -> bool:
        """Whether ``error`` says the store is out of reach (to wait for) rather than that the writes are bad. An
        embedded store is never out of reach."""
        return False

    def _reconnect(self) -> None:
        """A new connection for the writer, after the store was out of reach (may raise: tried again later)."""

    def _release(self) -> None:
        """Close the backend's connections, once the writer has stopped."""

    # -- writes (any thread) ---------------------------------------------------------------------------------
    def _enqueue(self, write: Write) -> None:
        answer = self._writer.put(write, timeout_s=_ROOM_WAIT_S)
        while answer == "full" and self.unreachable_since is not None:  # held, not dropped, while the store is away
            answer = self._writer.put(write, timeout_s=_ROOM_WAIT_S)
        if answer != "ok":
            self.stats.dropped += 1
            self._last_failure = f"the queue of {self.where} is full or closed; a {write.kind} was dropped"
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

    def failed_writes(self) -> tuple[int, str]:
        """Writes dropped, rolled back or given up so far, and why the last of them failed
        (:class:`~reflect_otel.store.ReportsFailures`)."""
        return self.stats.dropped + self.stats.errors + self.stats.unstored, self._last_failure

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._writer.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._stop_writer()
        self._release()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Deprecated: :meth:`force_flush` (milliseconds), the OpenTelemetry SDK's name."""
        return self.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        """Deprecated: :meth:`shutdown`, the OpenTelemetry SDK's name."""
        self.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _stop_writer(self) -> None:
        self._give_up_at = time.monotonic() + CLOSE_WAIT_S
        self._closing.set()  # wakes a pause before the next try
        self._writer.shutdown(timeout_millis=int((CLOSE_WAIT_S + 30) * 1000))
        if self.stats.unstored:
            self._last_failure = f"{self.where} could not be reached before the store closed"
            _log.error(
                "%d write(s) could not reach %s before the store closed; a collector's --out file holds their traces "
                "('collect --reingest FILE' stores them)",
                self.stats.unstored,
                self.where,
            )

    # -- the writer thread -----------------------------------------------------------------------------------
    def _write_all(self, batch: list[tuple[Write, int]]) -> None:
        writes = [write for write, _ in batch]
        if self._apply_waiting(writes) == "bad":
            for one in writes:  # a bad write rolled the batch back: apply one by one to keep the others
                self._apply_waiting([one])

    def _apply_waiting(self, batch: list[Write]) -> str:
        """:meth:`_apply`, tried again while the store is out of reach: ``"ok"``, ``"bad"``, or ``"unstored"``
        when a close gave up first."""
        pause = 0.5
        if self.unreachable_since is not None and self._past_close():
            self.stats.unstored += len(batch)  # the close gave up on the store already: no new try per batch
            return "unstored"
        while (outcome := self._apply(batch)) == "unreachable":
            if self.unreachable_since is None:
                self.unreachable_since = time.monotonic()
                _log.warning("%s is out of reach; its writes wait and are tried again", self.where)
            if self._past_close():
                self.stats.unstored += len(batch)
                self._last_failure = f"{self.where} could not be reached before the store closed"
                return "unstored"
            if self._closing.is_set():
                time.sleep(0.5)
            else:  # jittered, so that collectors and workers do not all come back at once; a close wakes it
                self._closing.wait(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, _MAX_PAUSE_S)
            try:
                self._reconnect()
            except Exception as error:  # still away: the next round tries again
                _log.debug("reconnecting to %s failed: %s", self.where, error)
        if self.unreachable_since is not None and outcome == "ok":
            _log.warning(
                "%s is back after %.0f s; the writes that waited are written",
                self.where,
                time.monotonic() - self.unreachable_since,
            )
            self.unreachable_since = None
        return outcome

    def _past_close(self) -> bool:
        return self._give_up_at is not None and time.monotonic() >= self._give_up_at

    def _apply(self, batch: list[Write]) -> str:
        """All of ``batch`` in one transaction: ``"ok"``; ``"bad"`` (rolled back, counted when alone) when it
        failed; ``"unreachable"`` when the store could not be reached (nothing counted)."""
        latest: dict[tuple[str, tuple[str, ...]], Write] = {}
        for write in batch:  # the same trace or record twice in a batch: the last one wins; a job's furthest state
            key = (write.kind, write.key)
            if (
                write.kind == "job"
                and key in latest
                and not later_jobs([write], {write.key[0]: job_state(latest[key])})
            ):
                continue
            latest[key] = write
        try:
            self._write_batch(list(latest.values()))
        except Exception as error:
            if self._unavailable(error):
                return "unreachable"
            if len(batch) == 1:
                self.stats.errors += 1
                self._last_failure = f"writing a {batch[0].kind} to {self.where} failed: {error}"
                _log.exception("writing a %s to %s failed; it was rolled back", batch[0].kind, self.where)
            return "bad"
        for write in batch:
            counter = COUNTERS[write.kind]
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        return "ok"
