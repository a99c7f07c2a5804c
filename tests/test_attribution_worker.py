"""The collector's attribution worker: nothing acknowledged is lost when attribution falls behind, runs wait in the
store (pending) and are taken later, and a stop leaves the rest pending for the next process."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb

from reflect_otel.attribution.methods import method_spec
from reflect_otel.attribution.service import AttributionService
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.llm.factory import NoModel
from reflect_otel.online.work import AttributionWorker
from reflect_otel.store import AttributionJob
from reflect_otel.testing import make_trace, wait_until
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict


class _SlowOracle(OracleVerifier):
    """The oracle, taking ``delay`` per run: attribution slower than runs arrive."""

    def __init__(self, delay: float, gate: threading.Event | None = None) -> None:
        self.delay = delay
        self.gate = gate
        self.entered = threading.Event()

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        time.sleep(self.delay)
        return super().verify(trace, expected=expected)


def _run(number: int, answer: str = "Lyon") -> StructuredTrace:
    trace = make_trace(
        "What is the capital of France?",
        [{"tool": "search", "args": {"q": f"capital {number}"}, "result": "x" * 2_000}],
        final_answer=answer,
    )
    return trace.model_copy(update={"trace_id": f"{number:032x}", "metadata": {"expected_answer": "Paris"}})


def _service(store: DuckDBStore, verifier: OracleVerifier) -> AttributionService:
    return AttributionService(NoModel(), method_spec("last-step"), verifier=verifier, store=store, triage=True)


def _jobs(path: Path) -> dict[str, int]:
    with duckdb.connect(str(path), read_only=True) as db:
        return dict(db.execute("SELECT status, count(*) FROM attribution_jobs GROUP BY ALL").fetchall())


def test_a_flood_while_attribution_is_slow_waits_in_the_store_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "flood.duckdb"
    store = DuckDBStore(path)
    gate = threading.Event()
    worker = AttributionWorker(_service(store, _SlowOracle(0.002, gate)), store, max_bytes=20_000).start()
    runs = [_run(n, "Lyon" if n % 2 else "Paris") for n in range(200)]
    for run in runs:
        store.write_trace(run)
        worker.offer(run)
    # the memory queue holds what fits in 20 kB; the rest waits in the store, counted as pending
    assert worker.stats.offered == 200 and worker.stats.pending > 150
    assert worker.stats.queued + worker.stats.pending == 200
    gate.set()
    # a bound on a hang, not a speed target: 200 store round trips took 64-85 s on a loaded 2-core machine
    wait_until(lambda: worker.stats.verified == 200, 300, "every run judged")
    worker.shutdown()
    assert worker.stats.flagged == 100 and worker.stats.attributed == 100 and worker.stats.pending == 0
    store.shutdown()
    assert _jobs(path) == {"done": 200}
    with duckdb.connect(str(path), read_only=True) as db:
        assert db.execute("SELECT count(*) FROM attributions").fetchone() == (100,)
        assert db.execute("SELECT count(DISTINCT trace_id) FROM verdicts").fetchone() == (200,)


def test_a_stop_leaves_the_rest_pending_and_the_next_worker_takes_it(tmp_path: Path) -> None:
    path = tmp_path / "stop.duckdb"
    store = DuckDBStore(path)
    gate = threading.Event()
    oracle = _SlowOracle(0.0, gate)
    worker = AttributionWorker(_service(store, oracle), store).start()
    for number in range(5):
        run = _run(number)
        store.write_trace(run)
        worker.offer(run)
    assert oracle.entered.wait(10)
    worker.shutdown(200)  # stopping while the first run is held at the gate
    gate.set()
    worker.shutdown(10_000)  # it finishes that run, and takes no other
    store.shutdown()
    assert _jobs(path) == {"done": 1, "pending": 4}
    store = DuckDBStore(path)
    later = AttributionWorker(_service(store, OracleVerifier()), store)
    stats = later.run_pending()
    store.shutdown()
    assert (stats.verified, stats.flagged, stats.attributed, stats.pending) == (4, 4, 4, 0)
    assert _jobs(path) == {"done": 5}


def test_jobs_are_upserts_and_unknown_statuses_are_rejected(tmp_path: Path) -> None:
    with DuckDBStore(tmp_path / "jobs.duckdb") as store:
        store.write_job(AttributionJob("a" * 32, "pending", expected_answer="Paris"))
        store.write_job(AttributionJob("a" * 32, "running", 1, "Paris"))
        store.write_job(AttributionJob("b" * 32, "lost"))  # type: ignore[arg-type]
        assert store.pending_jobs(10) == [AttributionJob("a" * 32, "running", 1, "Paris")]
        assert store.stats.rejected == 1
        assert store.read_trace("a" * 32) is None
