"""One bounded queue and one thread: what the online runtime, the collector's attribution worker, the stores'
writer and the span collector each run (as the OTel SDK runs one ``BatchProcessor`` under its span, log and
metric processors).

Producers :meth:`~BatchWorker.put` one item or :meth:`~BatchWorker.put_all` a batch (all or none) from any thread.
Neither raises, and neither blocks unless asked to wait for room (``timeout_s``): a full or stopping queue answers
``"full"`` or ``"stopping"``, and the caller counts its drop or tells its sender to retry. The agent's hot path
(a span processor's ``on_end``) uses :meth:`~BatchWorker.append`: no size, no wait, no wake-up, no lock (a deque's
append is atomic; the bound may be passed by one item per racing thread).

The thread takes what is queued in batches and hands each to ``handle``, each item with the bytes it was put with;
an exception there goes to ``on_error`` and the thread goes on. When the queue is empty it calls ``idle`` (work of
its own, such as assembling traces whose grace period has passed; True when it did some, to look again at once),
then sleeps until woken or for ``tick_s``. :meth:`~BatchWorker.force_flush` waits until everything queued before it was
handled, and runs ``then`` on the thread at that point. :meth:`~BatchWorker.shutdown` refuses further items, then
stops the thread after what is queued (``drain=True``) or after the batch in hand.

Bounds (a :class:`QueueBounds`): ``max_items`` queued items, and ``max_bytes`` of the sizes given with them, counted until their batch has
been handled, plus ``held_bytes()`` (what the handler keeps of them afterwards, such as spans being gathered into
traces). When nothing is held an item or batch over ``max_bytes`` is still taken, so that one cannot be refused
for ever. ``max_batch`` items go to ``handle`` at a time (None: everything queued); with ``linger_s`` the thread
waits that long after the first item for a batch to fill, unless a flush or stop is waiting.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Generic, Literal, TypeVar

__all__ = ["Admission", "BatchWorker", "QueueBounds"]

_log = logging.getLogger("reflect_otel.worker")

T = TypeVar("T")
Admission = Literal["ok", "full", "stopping"]
"""A put's answer: queued; refused because the queue is at a bound; refused because the worker is stopping."""
_size_of = itemgetter(1)


class _Flush:
    """A mark in the queue: everything before it has been handled once the thread reaches it."""

    __slots__ = ("done", "then")

    def __init__(self, then: Callable[[], None] | None) -> None:
        self.then = then
        self.done = threading.Event()


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """How much a :class:`BatchWorker` queues and how it batches (see the module's docstring)."""

    max_items: int | None = None
    max_bytes: int | None = None
    held_bytes: Callable[[], int] | None = None
    """Bytes the handler still holds of items it took (counted against ``max_bytes``)."""
    max_batch: int | None = 1
    linger_s: float = 0.0


class BatchWorker(Generic[T]):
    """A bounded queue of ``T`` and the one thread that handles it (see the module's docstring). ``refusing`` is
    True once puts are refused (:meth:`stop_admitting`, :meth:`shutdown`); ``stopping`` once :meth:`shutdown` was called,
    when work of the thread's own (``idle``) should end soon."""

    def __init__(
        self,
        handle: Callable[[list[tuple[T, int]]], None],
        *,
        name: str,
        bounds: QueueBounds = QueueBounds(),
        tick_s: float | None = None,
        idle: Callable[[], bool] | None = None,
        on_error: Callable[[list[tuple[T, int]], Exception], None] | None = None,
    ) -> None:
        self._handle = handle
        self._max_bytes = bounds.max_bytes
        self._held_bytes = bounds.held_bytes
        self._max_batch = bounds.max_batch
        self._linger_s = bounds.linger_s
        self._tick_s = tick_s
        self._idle = idle
        self._on_error = on_error
        self._queue: deque[tuple[T, int] | _Flush] = deque()
        self._limit = sys.maxsize if bounds.max_items is None else bounds.max_items
        self._bytes = 0
        self._flushes = 0
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._wake = threading.Event()
        self.refusing = False
        self.stopping = False
        self._drain = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> BatchWorker[T]:
        self._thread.start()
        return self

    # -- producers (any thread; never raise) ------------------------------------------------------------------
    def append(self, item: T) -> Admission:
        """Queue ``item`` for the thread's next tick: the hot path (see the module's docstring)."""
        if self.refusing:
            return "stopping"
        if len(self._queue) >= self._limit:
            return "full"
        self._queue.append((item, 0))
        return "ok"

    def put(self, item: T, size: int = 0, *, timeout_s: float = 0.0) -> Admission:
        """Queue ``item`` of ``size`` bytes, waiting up to ``timeout_s`` for room, and wake the thread."""
        with self._room:
            deadline = time.monotonic() + timeout_s
            while (answer := self._admits(1, size)) == "full" and (left := deadline - time.monotonic()) > 0:
                self._room.wait(left)
            if answer != "ok":
                return answer
            self._queue.append((item, size))
            self._bytes += size
        self._wake.set()
        return "ok"

    def put_all(self, items: Sequence[T], sizes: Sequence[int]) -> Admission:
        """Queue all of ``items`` (``sizes`` in bytes, one per item) or none of them; never waits."""
        total = sum(sizes)
        with self._lock:
            answer = self._admits(len(items), total)
            if answer != "ok":
                return answer
            self._queue.extend(zip(items, sizes, strict=True))
            self._bytes += total
        self._wake.set()
        return "ok"

    def _admits(self, count: int, size: int) -> Admission:
        """Whether ``count`` items of ``size`` bytes fit now (under the lock)."""
        if self.refusing:
            return "stopping"
        if len(self._queue) + count > self._limit:
            return "full"
        return "ok" if self.has_room(size) else "full"

    def has_room(self, size: int) -> bool:
        """Whether ``size`` more bytes would fit now (a hint: a put decides)."""
        if self._max_bytes is None:
            return True
        held = self._bytes + (self._held_bytes() if self._held_bytes is not None else 0)
        return held == 0 or held + size <= self._max_bytes

    def wake(self) -> None:
        """Wake the thread now (after :meth:`append` s)."""
        self._wake.set()

    @property
    def backlog(self) -> int:
        """Items queued and not yet taken (approximate: for progress lines and benchmarks)."""
        return len(self._queue)

    def queued(self) -> list[T]:
        """The items queued and not yet taken, oldest first (a snapshot)."""
        with self._lock:
            return [entry[0] for entry in self._queue if not isinstance(entry, _Flush)]

    @property
    def queued_bytes(self) -> int:
        """Bytes of the items queued or in the batch being handled."""
        return self._bytes

    # -- control ------------------------------------------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30_000, *, then: Callable[[], None] | None = None) -> bool:
        """Wait until everything queued before this call has been handled, ``then`` run on the thread after it;
        True when done within ``timeout_millis``. False at once when the thread is not running."""
        if not self._thread.is_alive():
            return False
        mark = _Flush(then)
        with self._lock:
            self._queue.append(mark)
            self._flushes += 1
        self._wake.set()
        return mark.done.wait(max(0, timeout_millis) / 1000)

    def stop_admitting(self) -> None:
        """Refuse every later put (``"stopping"``); what was queued is still handled."""
        with self._room:
            self.refusing = True
            self._room.notify_all()

    @property
    def running(self) -> bool:
        """Whether the thread is running (after :meth:`start`, until :meth:`shutdown` has stopped it)."""
        return self._thread.is_alive()

    def shutdown(self, timeout_millis: int = 30_000, *, drain: bool = True) -> None:
        """Refuse further items and stop the thread: after handling what is queued (``drain``), else after the batch
        in hand (the rest stays queued, see :meth:`discard`), waiting up to ``timeout_millis`` (:attr:`running`
        says whether it stopped)."""
        self.stop_admitting()
        self._drain = drain and self._drain
        self.stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(max(0, timeout_millis) / 1000)

    def discard(self) -> int:
        """Empty the queue (after :meth:`shutdown`); how many items were in it."""
        with self._lock:
            marks = [entry for entry in self._queue if isinstance(entry, _Flush)]
            left = len(self._queue) - len(marks)
            for mark in marks:
                mark.done.set()
            self._queue.clear()
            self._bytes = 0
        return left

    # -- the thread -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if not self.stopping:
                self._wake.wait(self._tick_s)
            self._wake.clear()
            try:
                self._cycle()
            except Exception:  # a bug here must not stop the thread and silently stop the work
                _log.exception("%s: worker error; continuing", self._thread.name)
            if self.stopping and (not self._drain or not self._queue):
                return

    def _cycle(self) -> None:
        """Handle batches while they come full (or up to a flush mark), then ``idle`` while it finds work. What is
        queued meanwhile waits for the next wake-up or tick, as in the SDK's ``BatchProcessor``: a producer adding
        without a wake-up is not raced item by item."""
        while not (self.stopping and not self._drain):
            batch, size, mark = self._take()
            if batch:
                try:
                    self._handle(batch)
                except Exception as error:
                    self._failed(batch, error)
                finally:
                    if size:
                        with self._room:
                            self._bytes -= size
                            self._room.notify_all()
            if mark is not None:
                self._finish(mark)
                continue
            if batch and self._max_batch is not None and len(batch) >= self._max_batch:
                continue
            if self.stopping or self._idle is None or not self._idle():
                return

    def _take(self) -> tuple[list[tuple[T, int]], int, _Flush | None]:
        """The next batch (up to ``max_batch`` items, up to a flush mark), its bytes, and the mark reached."""
        limit = self._max_batch
        if self._linger_s > 0 and self._queue:
            deadline = time.monotonic() + self._linger_s
            while (
                limit is not None
                and len(self._queue) < limit
                and not self._flushes
                and not self.stopping
                and (left := deadline - time.monotonic()) > 0
            ):
                self._wake.wait(left)
                self._wake.clear()
        batch: list[tuple[T, int]] = []
        mark: _Flush | None = None
        with self._room:
            queue = self._queue
            count = len(queue) if limit is None else min(limit, len(queue))
            if not self._flushes:  # no mark in the queue: take the items straight (the collector's every tick)
                batch = [queue.popleft() for _ in range(count)]  # type: ignore[misc]
            else:
                while count > 0 and queue:
                    entry = queue.popleft()
                    if isinstance(entry, _Flush):
                        mark = entry
                        break
                    batch.append(entry)
                    count -= 1
            if batch:
                self._room.notify_all()  # room by count (the bytes of a batch are freed once it is handled)
        return batch, sum(map(_size_of, batch)), mark

    def _failed(self, batch: list[tuple[T, int]], error: Exception) -> None:
        if self._on_error is None:
            _log.error("%s: handling %d item(s) failed", self._thread.name, len(batch), exc_info=error)
            return
        try:
            self._on_error(batch, error)
        except Exception:
            _log.exception("%s: the error handler failed", self._thread.name)

    def _finish(self, mark: _Flush) -> None:
        with self._lock:
            self._flushes -= 1
        try:
            if mark.then is not None:
                mark.then()
        except Exception:
            _log.exception("%s: the work after a flush failed", self._thread.name)
        finally:
            mark.done.set()
