"""The one queue-and-thread under the online runtime, the attribution worker, the stores' writer and the span
collector: bounded, never blocking a producer that does not ask to wait, never dying of a failing batch, and
flushing and closing as its users rely on."""

from __future__ import annotations

import threading
import time

from reflect_otel._worker import BatchWorker, QueueBounds
from reflect_otel.testing import wait_until


class Recorder:
    """A handler that records each batch, optionally held at a gate and failing on chosen items."""

    def __init__(self, gate: threading.Event | None = None, fail_on: frozenset[int] = frozenset()) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[str] = set()
        self.gate = gate
        self.fail_on = fail_on
        self.entered = threading.Event()

    def __call__(self, batch: list[tuple[int, int]]) -> None:
        self.entered.set()
        self.threads.add(threading.current_thread().name)
        if self.gate is not None:
            self.gate.wait(30)
        items = [item for item, _ in batch]
        self.batches.append(items)
        if self.fail_on & set(items):
            raise ValueError(f"bad item in {items}")

    @property
    def handled(self) -> list[int]:
        return [item for batch in self.batches for item in batch]


def test_a_full_queue_refuses_at_once_and_a_waiting_put_gets_the_room_the_thread_makes() -> None:
    gate = threading.Event()
    handler = Recorder(gate)
    worker = BatchWorker(handler, name="test-worker", bounds=QueueBounds(max_items=2)).start()
    assert worker.put(0) == "ok"
    assert handler.entered.wait(10)  # item 0 is in hand, held at the gate
    assert (worker.put(1), worker.put(2)) == ("ok", "ok")
    started = time.monotonic()
    assert worker.put(3) == "full" and worker.append(3) == "full"
    assert time.monotonic() - started < 1.0  # refused, not blocked
    waiting: list[str] = []
    putter = threading.Thread(target=lambda: waiting.append(worker.put(3, timeout_s=30)))
    putter.start()
    gate.set()  # the thread takes items 1 and 2: room for 3
    putter.join(30)
    assert waiting == ["ok"]
    assert worker.force_flush(10_000)
    assert handler.handled == [0, 1, 2, 3]
    assert handler.threads == {"test-worker"}
    worker.shutdown(10_000)
    assert not worker.running


def test_bytes_are_held_until_their_batch_is_handled_and_a_batch_goes_in_whole_or_not_at_all() -> None:
    gate = threading.Event()
    held = [0]
    handler = Recorder(gate)
    worker = BatchWorker(
        handler,
        name="test-bytes",
        bounds=QueueBounds(max_items=100, max_bytes=100, held_bytes=lambda: held[0], max_batch=None),
    ).start()
    assert worker.put_all([1, 2], [40, 40]) == "ok"
    assert handler.entered.wait(10)  # taken, held at the gate: not yet handled, so their bytes still count
    assert worker.backlog == 0 and worker.queued_bytes == 80
    assert worker.put_all([3, 4], [10, 20]) == "full"  # 80 + 30 > 100: neither is queued
    assert worker.put_all([3], [20]) == "ok"
    assert worker.queued_bytes == 100 and not worker.has_room(1)
    gate.set()
    assert worker.force_flush(10_000)
    assert handler.handled == [1, 2, 3] and worker.queued_bytes == 0
    held[0] = 90  # what the handler keeps of them counts against the bound too
    assert worker.put(5, 20) == "full"
    held[0] = 0
    assert worker.put(6, 500) == "ok"  # over the bound, but nothing is held: one item is never refused for ever
    worker.shutdown(10_000)
    assert not worker.running


def test_a_failing_batch_is_reported_and_the_thread_goes_on() -> None:
    handler = Recorder(fail_on=frozenset({2}))
    failed: list[tuple[list[int], str]] = []
    worker = BatchWorker(
        handler,
        name="test-errors",
        bounds=QueueBounds(max_items=10),
        on_error=lambda batch, error: failed.append(([item for item, _ in batch], str(error))),
    ).start()
    for item in range(5):
        assert worker.put(item) == "ok"
    assert worker.force_flush(10_000)
    assert handler.handled == [0, 1, 2, 3, 4]
    assert failed == [([2], "bad item in [2]")]
    worker.shutdown(10_000)
    assert not worker.running


def test_flush_runs_its_work_on_the_thread_after_everything_queued_before_it() -> None:
    handler = Recorder()
    worker = BatchWorker(
        handler, name="test-flush", tick_s=60, bounds=QueueBounds(max_items=100, max_batch=None)
    ).start()
    for item in range(10):
        assert worker.append(item) == "ok"  # no wake-up: only the flush brings the thread round before its tick
    seen: list[tuple[list[int], str]] = []
    assert worker.force_flush(10_000, then=lambda: seen.append((handler.handled, threading.current_thread().name)))
    assert seen == [(list(range(10)), "test-flush")]
    worker.shutdown(10_000)
    assert not worker.running


def test_idle_work_runs_when_the_queue_is_empty_and_again_while_it_finds_some() -> None:
    work = [3]

    def idle() -> bool:
        if work[0] == 0:
            return False
        work[0] -= 1
        return True

    worker = BatchWorker(Recorder(), name="test-idle", tick_s=0.05, idle=idle, bounds=QueueBounds(max_items=10)).start()
    wait_until(lambda: work[0] == 0, 10, "the idle work done")
    worker.shutdown(10_000)
    assert not worker.running


def test_shutdown_drains_what_is_queued_or_stops_after_the_batch_in_hand() -> None:
    drained = Recorder()
    worker = BatchWorker(drained, name="test-drain", tick_s=60, bounds=QueueBounds(max_items=100)).start()
    for item in range(20):
        worker.append(item)
    worker.shutdown(10_000)
    assert not worker.running  # drain: every item handled, though the thread was never woken for them
    assert drained.handled == list(range(20))
    assert worker.put(99) == "stopping" and worker.append(99) == "stopping"

    gate = threading.Event()
    stopped = Recorder(gate)
    worker = BatchWorker(stopped, name="test-stop", bounds=QueueBounds(max_items=100)).start()
    for item in range(5):
        worker.put(item)
    assert stopped.entered.wait(10)
    worker.shutdown(100, drain=False)
    assert worker.running  # item 0 is in hand at the gate
    gate.set()
    worker.shutdown(10_000, drain=False)
    assert not worker.running
    assert stopped.handled == [0]
    assert worker.discard() == 4


def test_stop_admitting_refuses_new_items_and_still_handles_the_queued_ones() -> None:
    handler = Recorder()
    worker = BatchWorker(handler, name="test-admit", bounds=QueueBounds(max_items=10, max_batch=None)).start()
    assert worker.put_all([1, 2], [0, 0]) == "ok"
    worker.stop_admitting()
    assert worker.put_all([3], [0]) == "stopping" and worker.put(3) == "stopping"
    assert worker.force_flush(10_000)
    assert handler.handled == [1, 2]
    worker.shutdown(10_000)
    assert not worker.running
