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

Across a network, where the database, a worker or the LLM endpoint can be cut off and come back:

- A collector defers a run's job only once the run's rows are written (a store flush), from a thread of its own,
  trying again with a jittered backoff while the database is away; its receive path never waits on procrastinate.
  A job it could not defer before it stopped stays ``pending`` in the store, and workers queue every run left
  pending without a procrastinate job (``_queue_forgotten``).
- A worker holds a *lease* on its job: before each model request (and while it waits for the store) it checks that
  procrastinate still has the job ``doing`` under its worker id. Cut off from the database for longer than the
  heartbeat timeout, or finding the job taken by another worker meanwhile, it stops the job where it is
  (:class:`~reflect_otel.llm.patient.JobReleased`): no more model calls, its job left to the other worker. Its end
  is recorded only while the job is still its own (procrastinate would otherwise finish, or queue again, a job
  another worker is doing), and the store's job rows never go back (attempt numbers only rise), so late writes of
  the worker that lost the job change nothing the other finished.
- A worker whose procrastinate worker stopped (a heartbeat or the listener met a dead connection: the database
  restarted, or the link was cut) opens a new one when the database answers again, in the same process.
- The LLM endpoint's 429 / 503 / stalls are waited out (:class:`~reflect_otel.llm.patient.PatientLLM`), the job
  kept; ``--llm-concurrency N`` (``REFLECT_LLM_CONCURRENCY``) caps the requests in flight to one model across
  every worker of the store with N advisory locks on the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from reflect_otel._worker import BatchWorker, QueueBounds
from reflect_otel.llm.patient import JobReleased
from reflect_otel.online.work import AttributionWorker, WorkerStats
from reflect_otel.store import AttributionJob, AttributionStore
from reflect_otel.trace import StructuredTrace

__all__ = ["QUEUE", "SharedQueue", "TraceNotStoredYet"]

_log = logging.getLogger("reflect_otel.online.shared")
QUEUE = "reflect_otel_attribution"
TASK = "reflect_otel.attribute_run"
_SCHEMA_LOCK = 0x5EF1EC8
_MAX_PAUSE_S = 10.0
_HOLDS = "SELECT 1 FROM procrastinate_jobs WHERE id = %(id)s AND status = 'doing' AND worker_id = %(worker)s"
_FORGOTTEN = """
SELECT j.trace_id FROM attribution_jobs j
WHERE j.status IN ('pending', 'running') AND j.updated_at < now() - make_interval(secs => %(age)s)
  AND EXISTS (SELECT 1 FROM traces t WHERE t.trace_id = j.trace_id)
  AND NOT EXISTS (SELECT 1 FROM procrastinate_jobs p WHERE p.queue_name = %(queue)s
                  AND p.status IN ('todo', 'doing') AND p.args ->> 'trace_id' = j.trace_id)
ORDER BY j.updated_at LIMIT 500"""
"""Runs waiting in the store (pending, or running with no worker on them) that have no procrastinate job: their
collector stopped before it could defer them, or a job was lost. Runs whose trace never reached the store are
left out (a worker could not attribute them)."""


class TraceNotStoredYet(Exception):
    """The job arrived before its run's write committed (the collector writes and defers at once): retried."""


def _backoff(start: float = 0.5) -> Iterator[float]:
    """Jittered pauses doubling from ``start`` up to :data:`_MAX_PAUSE_S` (each between half and all of it)."""
    pause = start
    while True:
        yield pause * random.uniform(0.5, 1.0)
        pause = min(pause * 2, _MAX_PAUSE_S)


class _Lease:
    """The job a worker has in hand (one at a time), checked on a connection of its own that also holds the
    endpoint's concurrency slots (session advisory locks: released by the server if the connection dies)."""

    def __init__(self, queue: SharedQueue, job_id: int, worker_id: int | None) -> None:
        self.queue = queue
        self.job_id = job_id
        self.worker_id = worker_id
        self.confirmed_at = time.monotonic()  # procrastinate has just handed it over

    @property
    def fresh(self) -> bool:
        """Confirmed within the last :meth:`SharedQueue.fresh_s` seconds: a tenth of the heartbeat timeout (at
        most 1 s), well before another worker could take the job, so a fast job costs no query per request."""
        return time.monotonic() - self.confirmed_at < self.queue.fresh_s

    def confirm(self) -> None:
        """Return when the job is still this worker's; wait while the store is out of reach; raise
        :class:`JobReleased` when another worker has it, when the store stayed away longer than the heartbeat
        timeout (another worker has it by now), or when the worker is stopping."""
        if self.fresh:
            return
        queue = self.queue
        gave_up_at: float | None = None
        tries = 0
        while True:
            tries += 1
            try:
                row = queue.lease_query(
                    "SELECT status = 'doing' AND worker_id IS NOT DISTINCT FROM %s FROM procrastinate_jobs WHERE id = %s",
                    [self.worker_id, self.job_id],
                )
            except Exception as error:
                if tries == 1:
                    continue  # a connection that died while idle (the server restarted): a new one at once
                now = time.monotonic()
                if gave_up_at is None:
                    gave_up_at = now + queue.stalled_after_s
                    _log.warning("job %s: the store is out of reach (%s); waiting for it", self.job_id, error)
                if now >= gave_up_at:
                    raise JobReleased(
                        f"the store was out of reach for {queue.stalled_after_s:.0f} s, the heartbeat timeout: another "
                        "worker has the job by now"
                    ) from None
                if queue.stopping.wait(1.0):
                    raise JobReleased("the worker is stopping") from None
                continue
            if row is None or not row[0]:
                raise JobReleased("another worker took the job (this one was taken for stopped)")
            self.confirmed_at = time.monotonic()
            queue.confirmed[self.job_id] = self.confirmed_at
            return

    def take_slot(self, key: int, slots: int) -> int:
        """One of the endpoint's ``slots`` concurrency slots, waiting for one (confirming the job meanwhile)."""
        while True:
            self.confirm()
            for slot in random.sample(range(slots), slots):
                with contextlib.suppress(Exception):  # out of reach: confirm() waits for the store
                    row = self.queue.lease_query("SELECT pg_try_advisory_lock(%s, %s)", [key, slot])
                    if row is not None and row[0]:
                        return slot
            if self.queue.stopping.wait(random.uniform(0.05, 0.25)):
                raise JobReleased("the worker is stopping")

    def give_back(self, key: int, slot: int) -> None:
        with contextlib.suppress(Exception):  # a dead session's locks are the server's to drop
            self.queue.lease_query("SELECT pg_advisory_unlock(%s, %s)", [key, slot])


class SharedQueue:
    """The procrastinate app over the store's PostgreSQL server: ``offer`` (the collector's side) and
    ``run_worker`` (the worker's side). A worker's :class:`~reflect_otel.llm.patient.PatientLLM` takes this object
    as its gate (:meth:`request`, :meth:`pause`)."""

    def __init__(self, url: str) -> None:
        try:
            import procrastinate
        except ImportError:
            from reflect_otel.errors import ConfigError

            raise ConfigError(
                "shared attribution needs procrastinate: pip install 'reflect-otel[postgresql]'"
            ) from None
        from reflect_otel.exporters.postgres_store import connection_options

        self.url = url
        self.stats = WorkerStats()
        self.stopping = threading.Event()
        """Set by SIGINT / SIGTERM in a worker: waits end, the job in hand is queued again."""
        self.stalled_after_s = 30.0
        self._handler: Callable[[Any, str], None] | None = None
        connector = procrastinate.PsycopgConnector(conninfo=url, kwargs=connection_options(url))
        self.app = procrastinate.App(connector=connector)
        retry = procrastinate.RetryStrategy(max_attempts=5, wait=2, retry_exceptions={TraceNotStoredYet})
        self.task = self.app.task(name=TASK, queue=QUEUE, retry=retry, pass_context=True)(self._run)
        self._store: AttributionStore | None = None
        self._deferrer: BatchWorker[str] | None = None
        self._lease: _Lease | None = None
        self._lease_db: Any = None
        self._lease_lock = threading.Lock()
        self._released: dict[int, str] = {}
        self.confirmed: dict[int, float] = {}
        """When each job in hand was last confirmed this worker's (its end is recorded without asking again when
        that was under :attr:`fresh_s` ago)."""
        self._worker: Any = None
        self._slot_key = 0
        self._slots = 0

    def _run(self, context: Any, trace_id: str) -> None:
        if self._handler is None:
            raise RuntimeError("this process defers attribution jobs; 'reflect-otel worker' runs them")
        self._handler(context, trace_id)

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
    def open(self, store: AttributionStore | None = None) -> SharedQueue:
        """Ready to defer jobs; with ``store``, each only once the run's rows are written to it."""
        self.apply_schema()
        self.app.open()
        self._store = store
        self._deferrer = BatchWorker(
            self._defer,
            name="reflect-otel-defer",
            bounds=QueueBounds(max_items=1_000_000, max_batch=500, linger_s=0.02),
        ).start()
        return self

    def offer(self, trace: StructuredTrace, store: AttributionStore, expected: str | None) -> None:
        """The run's job, pending in the store, and a procrastinate job for it once the run is written (never
        raises or waits: a run whose job could not be deferred stays pending in the store, and workers queue it)."""
        try:
            store.write_job(AttributionJob(trace.trace_id, "pending", expected_answer=expected))
            self.stats.offered += 1
            if self._deferrer is None or self._deferrer.put(trace.trace_id) != "ok":
                _log.warning("run %s stays pending in the store; a worker queues it", trace.trace_id)
        except Exception:
            self.stats.failed += 1
            _log.exception("queueing the attribution of %s failed; it stays pending in the store", trace.trace_id)

    def _defer(self, batch: list[tuple[str, int]]) -> None:
        """Defer ``batch`` once the store holds its runs, trying again while the database is away (until close)."""
        waiting = [trace_id for trace_id, _ in batch]
        pauses = _backoff()
        said = False
        while waiting:
            try:
                if self._store is not None and not self._store.force_flush(10_000):
                    raise TimeoutError("the store has not written the runs yet")
                while waiting:
                    self._defer_one(waiting[0])
                    waiting.pop(0)
            except Exception as error:
                assert self._deferrer is not None
                if self._deferrer.stopping:
                    _log.warning(
                        "%d run(s) left pending in the store, not yet queued: a worker queues them", len(waiting)
                    )
                    return
                if not said:
                    said = True
                    _log.warning("queueing jobs waits for the store (%s); trying again", error)
                time.sleep(next(pauses))
        if said:
            _log.warning("the store is back; the waiting jobs are queued")

    def _defer_one(self, trace_id: str) -> None:
        try:
            self.task.configure(queueing_lock=trace_id).defer(trace_id=trace_id)
            self.stats.pending += 1
        except Exception as error:
            if type(error).__name__ != "AlreadyEnqueued":  # the run is waiting already (re-sent spans of a trace)
                raise

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait until the runs offered so far are deferred (or left pending); True when done in time."""
        return self._deferrer.force_flush(timeout_millis) if self._deferrer is not None else True

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        if self._deferrer is not None:
            self._deferrer.shutdown(timeout_millis)
        self.app.close()

    # -- the worker's side: the gate of its model (reflect_otel.llm.patient.CallGate) -------------------------
    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Around each model request of the job in hand: the job confirmed still this worker's, and one of the
        endpoint's concurrency slots held when there is a limit."""
        lease = self._lease
        if lease is None:
            yield
            return
        slot = lease.take_slot(self._slot_key, self._slots) if self._slots else None
        if slot is None:
            lease.confirm()
        try:
            yield
        finally:
            if slot is not None:
                lease.give_back(self._slot_key, slot)

    def pause(self, seconds: float) -> None:
        """Between tries of a request the endpoint refused as busy: a stop ends the wait (the job is queued
        again), and the job is confirmed still this worker's."""
        if self.stopping.wait(seconds):
            raise JobReleased("the worker is stopping")
        if self._lease is not None:
            self._lease.confirm()

    def lease_query(self, sql: str, params: list[Any]) -> tuple[Any, ...] | None:
        """One row of ``sql`` on the lease connection (made again after a failure)."""
        from reflect_otel.exporters.postgres_store import connect_postgres

        with self._lease_lock:
            try:
                if self._lease_db is None:
                    self._lease_db = connect_postgres(self.url, autocommit=True)
                row = self._lease_db.execute(sql, params).fetchone()
                return tuple(row) if row is not None else None
            except Exception:
                if self._lease_db is not None:
                    with contextlib.suppress(Exception):
                        self._lease_db.close()
                self._lease_db = None
                raise

    # -- the worker's side -----------------------------------------------------------------------------------
    def run_worker(
        self,
        worker: AttributionWorker,
        *,
        stalled_after_s: float = 30.0,
        wait: bool = True,
        name: str = "worker",
        llm_concurrency: int | None = None,
        endpoint: str = "",
    ) -> None:
        """Process jobs until stopped (SIGINT/SIGTERM), or until none is left with ``wait=False``. Every
        ``stalled_after_s / 3`` seconds, jobs of workers silent for ``stalled_after_s`` are queued again, and runs
        left pending without a job are queued. ``llm_concurrency`` caps the requests in flight to ``endpoint``
        (a name every worker of one endpoint gives alike: the CLI gives the model's) across every worker of the
        store."""
        store = worker.store
        self.stalled_after_s = stalled_after_s
        if llm_concurrency:
            self._slots = llm_concurrency
            self._slot_key = zlib.crc32(endpoint.encode()) - 2**31  # a signed int4, the same in every worker

        def handle(context: Any, trace_id: str) -> None:
            job_id = context.job.id
            self._lease = _Lease(self, job_id, context.job.worker_id)
            self.confirmed[job_id] = self._lease.confirmed_at
            try:
                self._attribute(trace_id, worker, store, retaken=context.job.attempts)
            except JobReleased as released:
                self._released[job_id] = str(released)
                _log.warning("job %s (run %s) stopped: %s", job_id, trace_id, released)
            finally:
                self._lease = None

        self._handler = handle
        self.apply_schema()
        asyncio.run(self._work(stalled_after_s, wait, name))

    def _reading(self, read: Callable[[], Any]) -> Any:
        """``read()`` of the store, tried again while the store is out of reach and the job still this worker's."""
        from reflect_otel.exporters.postgres_store import out_of_reach

        while True:
            try:
                return read()
            except Exception as error:
                if not out_of_reach(error) or self._lease is None:
                    raise
                self._lease.confirm()

    def _attribute(self, trace_id: str, worker: AttributionWorker, store: AttributionStore, *, retaken: int) -> None:
        """Attribute the run, unless it is done already. ``retaken``: procrastinate's count of the job's earlier
        attempts, which also counts an attempt whose 'running' never reached the store (its worker was cut off)."""
        job = self._reading(lambda: store.read_job(trace_id))
        if job is not None and job.status == "done":
            _log.info("run %s is attributed already (another worker finished it); no model call", trace_id)
            return
        trace = self._reading(lambda: store.read_trace(trace_id))
        if trace is None:
            raise TraceNotStoredYet(trace_id)
        attempts = max(job.attempts if job else 0, retaken)
        worker.attribute(trace, job.expected_answer if job else None, attempts=attempts)
        while not store.force_flush(5_000):  # the record and the job's end are written before procrastinate hears of it
            if self._lease is not None:
                self._lease.confirm()

    @property
    def fresh_s(self) -> float:
        return min(1.0, self.stalled_after_s / 10)

    def _stop(self) -> None:
        self.stopping.set()
        if self._worker is not None:
            self._worker.stop()

    async def _work(self, stalled_after_s: float, wait: bool, name: str) -> None:
        loop = asyncio.get_running_loop()
        handled = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
                loop.add_signal_handler(sig, self._stop)
                handled.append(sig)
        worker_class = _lease_keeping_worker(self)
        heartbeat = max(0.5, stalled_after_s / 3)
        pauses = _backoff(1.0)
        try:
            while not self.stopping.is_set():
                started = time.monotonic()
                try:
                    async with self.app.open_async():
                        self._worker = worker_class(
                            app=self.app,
                            queues=[QUEUE],
                            name=name,
                            concurrency=1,
                            wait=wait,
                            update_heartbeat_interval=heartbeat,
                            stalled_worker_timeout=stalled_after_s,
                            fetch_job_polling_interval=1.0,
                            delete_jobs="successful",
                            install_signal_handlers=False,
                        )
                        recovery = asyncio.create_task(self._recover(stalled_after_s, heartbeat))
                        try:
                            await self._worker.run()
                        finally:
                            recovery.cancel()
                    if not wait or self.stopping.is_set():
                        return
                    reason = "a heartbeat or the listener lost the store"
                except Exception as error:
                    if self.stopping.is_set():
                        return
                    reason = f"{type(error).__name__}: {error}"
                if time.monotonic() - started > 60:
                    pauses = _backoff(1.0)  # it ran a while: a new outage starts with short pauses again
                pause = next(pauses)
                _log.warning("the worker stopped taking jobs (%s); taking them again in %.1f s", reason, pause)
                resume = time.monotonic() + pause
                while time.monotonic() < resume and not self.stopping.is_set():
                    await asyncio.sleep(0.1)
        finally:
            self._worker = None
            for sig in handled:
                loop.remove_signal_handler(sig)
            if self._lease_db is not None:
                with contextlib.suppress(Exception):
                    self._lease_db.close()

    async def _recover(self, stalled_after_s: float, every_s: float) -> None:
        """Queue again the jobs of workers silent for ``stalled_after_s``, and runs left pending without a job."""
        manager: Any = self.app.job_manager
        while True:
            try:
                for job in await manager.get_stalled_jobs(queue=QUEUE, seconds_since_heartbeat=stalled_after_s):
                    _log.warning("job %s (%s) was held by a worker that stopped; queued again", job.id, job.task_kwargs)
                    await manager.retry_job_by_id_async(job.id, retry_at=datetime.now(UTC))
                await self._queue_forgotten(max(10.0, 2 * stalled_after_s))
            except Exception as error:  # the next round tries again; the worker goes on
                _log.warning("looking for stalled attribution jobs failed (%s); trying again", error)
            await asyncio.sleep(every_s)

    async def _queue_forgotten(self, older_than_s: float) -> None:
        rows = await self.app.connector.execute_query_all_async(_FORGOTTEN, age=older_than_s, queue=QUEUE)
        for row in rows:
            try:
                await self.task.configure(queueing_lock=row["trace_id"]).defer_async(trace_id=row["trace_id"])
                _log.warning(
                    "run %s was waiting with no job queued for it (its collector could not queue it yet, or stopped); "
                    "queued",
                    row["trace_id"],
                )
            except Exception as error:
                if type(error).__name__ != "AlreadyEnqueued":
                    raise

    async def holds(self, job_id: int, worker_id: int | None) -> bool:
        """Whether procrastinate still has ``job_id`` doing under ``worker_id`` (raises when it cannot say)."""
        rows = await self.app.connector.execute_query_all_async(_HOLDS, id=job_id, worker=worker_id)
        return bool(rows)


def _lease_keeping_worker(queue: SharedQueue) -> Any:
    """procrastinate's worker, recording a job's end only while the job is still this worker's: one taken by
    another worker (this one was cut off past the heartbeat timeout) is left to it, untouched; one released
    (:class:`JobReleased`) while still this worker's is queued again; and a store out of reach is waited for."""
    from procrastinate import worker as procrastinate_worker

    class LeaseKeepingWorker(procrastinate_worker.Worker):
        async def _persist_job_status(
            self, job: Any, status: Any, retry_decision: Any, context: Any, job_result: Any
        ) -> None:
            released = queue._released.pop(job.id, None)
            confirmed = queue.confirmed.pop(job.id, None)
            fresh = released is None and confirmed is not None and time.monotonic() - confirmed < queue.fresh_s
            pauses = _backoff()
            said = False
            while True:
                try:
                    if not fresh and not await queue.holds(job.id, job.worker_id):
                        _log.warning("job %s is another worker's now; leaving it to that worker", job.id)
                        return
                    if released is not None:
                        await self.app.job_manager.retry_job(job, retry_at=datetime.now(UTC))
                        return
                    await super()._persist_job_status(job, status, retry_decision, context, job_result)
                    return
                except Exception as error:
                    fresh = False  # time passes: ask again
                    if queue.stopping.is_set():
                        _log.warning("job %s: its end is not recorded (%s); it is queued again once this worker's "
                                     "heartbeat stops", job.id, error)  # fmt: skip
                        return
                    if not said:
                        said = True
                        _log.warning("job %s: recording its end waits for the store (%s)", job.id, error)
                    await asyncio.sleep(next(pauses))

    return LeaseKeepingWorker
