"""The fleet across a real network: PostgreSQL, collectors, workers, the agents and the LLM endpoint each on a host
of its own (network namespaces joined by veth links, :mod:`reflect_otel.testing.fleet`), with links cut and
restored mid-job, the database restarted, and the endpoint throttled and stalled. Each test holds one promise of
``docs/scale-out.md`` ("What each part does when the network fails"). They need root to make namespaces and skip
saying so without it; CI runs them as root."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reflect_otel.testing.fleet import Fleet, FleetModel, trace_of

pytest.importorskip("procrastinate")
pytest.importorskip("psycopg")
pytestmark = pytest.mark.slow
WRONG = "Lyon"


@pytest.fixture(scope="module")
def can_cut() -> None:
    from reflect_otel.testing.netns import namespaces_missing
    from reflect_otel.testing.postgres import postgres_binaries

    reason = namespaces_missing()
    if reason is not None:
        pytest.skip(f"hosts cannot be cut apart here: {reason}")
    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql); .ci/run installs it")


@pytest.fixture
def folder(tmp_path: Path, can_cut: None) -> Iterator[Path]:
    yield tmp_path / "fleet"


def _attributions(fleet: Fleet) -> dict[str, int]:
    return dict(fleet.query("SELECT trace_id, count(*) FROM attributions GROUP BY 1"))  # type: ignore[arg-type]


def _attempts(fleet: Fleet, trace_id: str) -> tuple[str, int]:
    rows = fleet.query("SELECT status, attempts FROM attribution_jobs WHERE trace_id = %s", [trace_id])
    return rows[0] if rows else ("", 0)  # type: ignore[return-value]


def test_a_collector_cut_off_from_the_store_keeps_what_it_acknowledged_and_stores_it_when_the_store_returns(
    folder: Path,
) -> None:
    with Fleet(folder, collectors=("c1",), workers=("w1",)) as fleet:
        assert fleet.lab is not None
        fleet.lab.cut("c1", "db")
        sent = fleet.send(range(12), right={0, 4, 8}, patience_s=60)
        assert len(sent.acked) == 12 and not sent.given_up  # the agents are not held up by the store's absence
        time.sleep(12)  # past the TCP user timeout: the collector's writes fail and wait, they are not dropped
        assert fleet.query("SELECT count(*) FROM traces") == [(0,)]
        fleet.lab.restore("c1", "db")
        fleet.wait(lambda: fleet.settled(sent.acked), 120, "every acknowledged run stored and done")
        assert set(dict(fleet.query("SELECT trace_id, 1 FROM traces"))) == set(sent.acked)
        assert _attributions(fleet) == {trace_of(n): 1 for n in range(12) if n % 4}  # the 9 wrong runs, once each
        log = fleet.log("c1")
        assert "is out of reach; its writes wait" in log and "is back after" in log
        assert "c1" in fleet.running()  # no restart of its own


def test_a_collector_stopped_while_cut_off_names_the_file_that_restores_every_acknowledged_run(folder: Path) -> None:
    with Fleet(folder, collectors=("c1",), workers=("w1",)) as fleet:
        assert fleet.lab is not None
        fleet.lab.cut("c1", "db")
        sent = fleet.send(range(5), patience_s=60)
        assert len(sent.acked) == 5
        assert fleet.stop("c1", timeout_s=120) == 1  # it says it could not store them, and how to
        log = fleet.log("c1")
        assert "could not reach the store before exit" in log and "--reingest" in log
        fleet.lab.restore("c1", "db")
        reingest = subprocess.run(
            fleet.lab.hosts["c1"].command([sys.executable, "-m", "reflect_otel", "collect", "--reingest",
                                           str(folder / "c1.jsonl"), "--store", fleet.store_url("c1"),
                                           "--attribute"]),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert reingest.returncode == 0, reingest.stderr
        # the workers queue runs left pending without a job
        fleet.wait(lambda: fleet.settled(sent.acked), 120, "every acknowledged run attributed")
        assert _attributions(fleet) == dict.fromkeys(sent.acked, 1)


def test_a_worker_cut_off_mid_job_leaves_it_to_another_and_spends_nothing_more_on_it(folder: Path) -> None:
    with Fleet(folder, collectors=("c1",), workers=("w1",), model=FleetModel(delay_s=3.0)) as fleet:
        assert fleet.lab is not None
        first = fleet.running()["w1"]
        fleet.send([0])
        fleet.wait(lambda: fleet.requests_from("w1") == 1, 60, "w1's model call in flight")
        fleet.lab.cut("w1", "db")  # the call ends, but w1 cannot write what it found
        fleet.start_worker("w2")
        fleet.wait(lambda: _attempts(fleet, trace_of(0)) == ("done", 2), 120, "the job done by w2")
        fleet.lab.restore("w1", "db")
        fleet.wait(lambda: "is another worker's now" in fleet.log("w1"), 60, "w1 told the job is w2's")
        assert _attempts(fleet, trace_of(0)) == ("done", 2)  # w1's late writes did not take the job back
        assert _attributions(fleet) == {trace_of(0): 1}
        assert fleet.requests_from("w1") == 1 and fleet.requests_from("w2") == 1  # w1 spent nothing more on it
        assert fleet.queue_left() == 0
        # w1 came back by itself and takes work again
        sent = fleet.send([1, 2, 3, 4])
        fleet.wait(lambda: fleet.settled(sent.acked), 120, "the next runs done")
        assert fleet.running()["w1"] == first


def test_the_endpoint_throttled_or_stalled_keeps_the_runs_queued_and_fails_none(folder: Path) -> None:
    with Fleet(folder, collectors=("c1",), workers=("w1", "w2"), model=FleetModel(timeout_s=2.0)) as fleet:
        fleet.faults.throttle(10, status=429, retry_after_s=1)
        sent = fleet.send(range(6))
        fleet.wait(lambda: fleet.faults.refused >= 4, 60, "the endpoint refusing")
        stats = subprocess.run(
            [sys.executable, "-m", "reflect_otel", "stats", "--store", fleet.store_socket_url],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert stats.returncode == 0, stats.stderr
        backlog = next(line for line in stats.stdout.splitlines() if line.startswith("attribution backlog:"))
        assert "run(s) waiting" in backlog and "the oldest has waited" in backlog
        fleet.wait(lambda: fleet.settled(sent.acked), 120, "the runs done once the endpoint answers")
        fleet.faults.throttle(5, status=503, retry_after_s=1)
        more = fleet.send(range(6, 9))
        fleet.wait(lambda: fleet.settled(more.acked), 120, "the runs done after the 503s")
        assert fleet.faults.answered == 9  # a refused request costs no tokens: each run's one call, answered once
        fleet.faults.stall(6, hold_s=4)  # longer than the workers' 2 s timeout: every try times out meanwhile
        stalled = fleet.send(range(9, 12))
        fleet.wait(lambda: fleet.settled(stalled.acked), 120, "the runs done after the stall")
        assert fleet.jobs() == {"done": 12}  # nothing failed for the endpoint's slowness
        assert _attributions(fleet) == {trace_of(n): 1 for n in range(12)}
        # the held requests were answered after their clients gave up: tokens an endpoint spends all the same
        assert fleet.faults.answered >= 12


def test_a_concurrency_limit_shared_through_the_database_keeps_the_workers_within_the_endpoints_slots(
    folder: Path,
) -> None:
    # the endpoint refuses (429) a second request in flight; the workers hold one slot between them
    with Fleet(folder, collectors=("c1",), model=FleetModel(delay_s=0.5, max_concurrent=1, concurrency=1)) as fleet:
        sent = fleet.send(range(8))
        fleet.wait(lambda: fleet.settled(sent.acked), 120, "the runs done")
        assert fleet.requests_from("w1") > 0 and fleet.requests_from("w2") > 0  # both took work
        assert fleet.faults.over_limit == 0 and fleet.faults.peak == 1
        assert _attributions(fleet) == {trace_of(n): 1 for n in range(8)}


def test_a_database_restart_mid_run_is_ridden_out_without_restarting_anything(folder: Path) -> None:
    with Fleet(folder, model=FleetModel(delay_s=0.2)) as fleet:
        assert fleet.db is not None
        before = fleet.running()
        sent = fleet.send(range(10), right={0, 5})
        later = threading.Thread(target=lambda: fleet.send(range(10, 20), right={10, 15}, sent=sent))
        fleet.db.restart()  # fast: every session is ended, the server is back in a moment
        later.start()
        later.join()
        assert len(sent.acked) == 20 and not sent.given_up
        fleet.wait(lambda: fleet.settled(sent.acked), 180, "every run done after the restart")
        wrong = {trace_of(n) for n in range(20) if n % 5}
        assert _attributions(fleet) == dict.fromkeys(wrong, 1)
        assert fleet.running() == before  # the same processes: none exited, none was restarted
