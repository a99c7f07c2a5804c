"""Attribution as shared work on a PostgreSQL store, for many collectors and workers on many machines.

The work is handed out by procrastinate (a well-kept task queue on PostgreSQL: ``FOR UPDATE SKIP LOCKED``,
LISTEN/NOTIFY, retries, worker heartbeats, its own schema and migrations), not by a queue of our own. Chosen over
pgqueuer: both use the same locking, but procrastinate runs plain synchronous task functions (the attribution
service is synchronous), has the longer record, and documents stalled-job recovery from worker heartbeats.

``collect --attribute --store postgresql://...`` stores each run with its job ``pending`` in the store's
``attribution_jobs`` and defers one procrastinate job per run (a queueing lock keeps one waiting job per run);
``reflect-otel worker`` processes them. The store's job row says what a user needs (pending, running, done,
failed, attempts); procrastinate's tables say which worker holds what. A worker killed mid-job stops sending
heartbeats; any other worker finds its jobs stalled and queues them again, so each run is attributed to the end
once (the store's upserts make a repeated write of the same record change nothing).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from reflect_otel.online.work import AttributionWorker, WorkerStats
from reflect_otel.store import AttributionJob, AttributionStore
from reflect_otel.trace import StructuredTrace

__all__ = ["QUEUE", "SharedQueue", "TraceNotStoredYet"]

_log = logging.getLogger("reflect_otel.online.shared")
QUEUE = "reflect_otel_attribution"
TASK = "reflect_otel.attribute_run"
_SCHEMA_LOCK = 0x5EF1EC8


class TraceNotStoredYet(Exception):
    """The job arrived before its run's write committed (the collector writes and defers at once): retried."""


class SharedQueue:
    """The procrastinate app over the store's PostgreSQL server: ``offer`` (the collector's side) and
    ``run_worker`` (the worker's side)."""

    def __init__(self, url: str) -> None:
        try:
            import procrastinate
        except ImportError:
            from reflect_otel.errors import ConfigError

            raise ConfigError(
                "shared attribution needs procrastinate: pip install 'reflect-otel[postgresql]'"
            ) from None
        self.url = url
        self.stats = WorkerStats()
        self._handler: Callable[[str], None] | None = None
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
        retry = procrastinate.RetryStrategy(max_attempts=5, wait=2, retry_exceptions={TraceNotStoredYet})
        self.task = self.app.task(name=TASK, queue=QUEUE, retry=retry)(self._run)

    def _run(self, trace_id: str) -> None:
        if self._handler is None:
            raise RuntimeError("this process defers attribution jobs; 'reflect-otel worker' runs them")
        self._handler(trace_id)

    def apply_schema(self) -> None:
        """procrastinate's schema, once (under an advisory lock: collectors and workers may start together)."""
        from reflect_otel.exporters.postgres_store import connect_postgres

        with connect_postgres(self.url) as connection, connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", [_SCHEMA_LOCK])
            row = connection.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
            if row and row[0] is not None:
                return
            connection.execute(self.app.schema_manager.get_schema())

    # -- the collector's side --------------------------------------------------------------------------------
    def open(self) -> SharedQueue:
        self.apply_schema()
        self.app.open()
        return self

    def offer(self, trace: StructuredTrace, store: AttributionStore, expected: str | None) -> None:
        """The run's job, pending in the store, and a procrastinate job for it (never raises: a run whose job
        could not be deferred stays pending in the store, for 'attribute --pending')."""
        try:
            store.write_job(AttributionJob(trace.trace_id, "pending", expected_answer=expected))
            self.stats.offered += 1
            self.task.configure(queueing_lock=trace.trace_id).defer(trace_id=trace.trace_id)
            self.stats.pending += 1
        except Exception as error:
            if type(error).__name__ == "AlreadyEnqueued":
                return  # the run is waiting already (re-sent spans of the same trace)
            self.stats.failed += 1
            _log.exception("deferring the attribution of %s failed; it stays pending in the store", trace.trace_id)

    def close(self) -> None:
        self.app.close()

    # -- the worker's side -----------------------------------------------------------------------------------
    def run_worker(
        self, worker: AttributionWorker, *, stalled_after_s: float = 30.0, wait: bool = True, name: str = "worker"
    ) -> None:
        """Process jobs until stopped (SIGINT/SIGTERM), or until none is left with ``wait=False``. Every
        ``stalled_after_s / 3`` seconds, jobs of workers silent for ``stalled_after_s`` are queued again."""
        store = worker.store

        def handle(trace_id: str) -> None:
            trace = store.read_trace(trace_id)
            if trace is None:
                raise TraceNotStoredYet(trace_id)
            job = store.read_job(trace_id)
            worker.attribute(trace, job.expected_answer if job else None, attempts=job.attempts if job else 0)
            store.flush()

        self._handler = handle
        self.apply_schema()
        asyncio.run(self._work(stalled_after_s, wait, name))

    async def _work(self, stalled_after_s: float, wait: bool, name: str) -> None:
        heartbeat = max(0.5, stalled_after_s / 3)
        async with self.app.open_async():
            recovery = asyncio.create_task(self._recover_stalled(stalled_after_s, heartbeat))
            try:
                await self.app.run_worker_async(
                    queues=[QUEUE],
                    name=name,
                    concurrency=1,
                    wait=wait,
                    update_heartbeat_interval=heartbeat,
                    stalled_worker_timeout=stalled_after_s,
                    fetch_job_polling_interval=1.0,
                    delete_jobs="successful",
                )
            finally:
                recovery.cancel()

    async def _recover_stalled(self, stalled_after_s: float, every_s: float) -> None:
        manager: Any = self.app.job_manager
        while True:
            try:
                for job in await manager.get_stalled_jobs(queue=QUEUE, seconds_since_heartbeat=stalled_after_s):
                    _log.warning("job %s (%s) was held by a worker that stopped; queued again", job.id, job.task_kwargs)
                    await manager.retry_job_by_id_async(job.id, retry_at=datetime.now(UTC))
            except Exception:  # the next round tries again; the worker goes on
                _log.exception("looking for stalled attribution jobs failed")
            await asyncio.sleep(every_s)
