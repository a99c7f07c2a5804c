"""The fleet soak: agents send ``--runs`` runs through 2 collectors to 2 workers while a schedule of faults plays,
then the store is checked. Hosts are network namespaces joined by veth links (``reflect_otel.testing.fleet``; it
needs root, and skips saying why without it): PostgreSQL, c1, c2, w1, w2, the agents and the LLM endpoint (the
scripted OpenAI double, answering an all-at-once attribution after ``--llm-delay`` seconds; a double, not a model).

The schedule: each of the 8 links cut once and restored (agents-c1, c1-db, w1-db, w1-llm, then the same for c2 and
w2; a worker's links the moment the endpoint receives a request of that worker, so the cut lands mid-job), the
database restarted once (``pg_ctl restart -m fast``), and the endpoint refusing every request (429,
``Retry-After: 1``) for ``--throttle`` seconds, with ``--gap`` seconds between faults. The agents post runs at a
steady rate over the whole schedule, each to c1 or c2 and to the other when it gets no answer, retrying until it
is acknowledged (as an OTLP exporter retries); a third of the runs answer right (not flagged, not attributed).

The same runs go first through a fault-free fleet, whose endpoint's tokens are the baseline. Then the checks: every
acknowledged run stored exactly once, every flagged one attributed exactly once, no job left pending or running
(nor waiting in procrastinate), none failed, and the tokens the endpoint served (each answered completion reports
60) against the fault-free run's. One line per fault, then the total line, which is also the last:
``fleet_faults runs=N acked=A stored=S records=R duplicates=D pending=P token_ratio=X``. Exit status 1 when
acknowledged runs were lost or duplicated, work was left, a flagged run was not attributed once, or the token ratio
is off by more than 10%.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks._common import add_smoke_option, smoke_sizes
from reflect_otel.testing.fleet import Fleet, FleetModel, Sent, trace_of
from reflect_otel.testing.netns import NetworkLab, namespaces_missing
from reflect_otel.testing.openai_server import USAGE_TOKENS

LINK_CUTS = (("agents", "c1"), ("c1", "db"), ("w1", "db"), ("w1", "llm"), ("agents", "c2"), ("c2", "db"),
             ("w2", "db"), ("w2", "llm"))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    seconds: float
    start: Callable[[Fleet], None]
    end: Callable[[Fleet], None]


def schedule(cut_s: float, throttle_s: float) -> list[Fault]:
    """The faults in the order they play: the links of c1 and w1, the database's restart, those of c2 and w2,
    then the endpoint's throttle."""

    def cut(a: str, b: str) -> Fault:
        def start(fleet: Fleet) -> None:
            if a.startswith("w"):  # a worker's link is cut while its model call is in flight: mid-job
                _call_begins(fleet, a)
            _lab(fleet).cut(a, b)

        name = f"cut {a}-{b}" + (" mid-call" if a.startswith("w") else "")
        return Fault(name, cut_s, start, lambda f: _lab(f).restore(a, b))

    def restart(fleet: Fleet) -> None:
        assert fleet.db is not None
        fleet.db.restart()

    faults = [cut(a, b) for a, b in LINK_CUTS[:4]]
    faults.append(Fault("restart the database", 0.0, restart, lambda f: None))
    faults += [cut(a, b) for a, b in LINK_CUTS[4:]]
    faults.append(Fault("throttle the endpoint (429)", throttle_s,
                        lambda f: f.faults.throttle(throttle_s, status=429, retry_after_s=1), lambda f: None))  # fmt: skip
    return faults


def _lab(fleet: Fleet) -> NetworkLab:
    assert fleet.lab is not None
    return fleet.lab


def _call_begins(fleet: Fleet, worker: str, timeout_s: float = 30.0) -> None:
    """Return as soon as the endpoint receives a new request from ``worker`` (or after ``timeout_s``)."""
    before = fleet.requests_from(worker)
    deadline = time.monotonic() + timeout_s
    while fleet.requests_from(worker) == before and time.monotonic() < deadline:
        time.sleep(0.02)


def _right(runs: int) -> set[int]:
    return {n for n in range(runs) if n % 3 == 0}


def _status(fleet: Fleet) -> str:
    jobs = fleet.jobs()
    stored = fleet.query("SELECT count(*) FROM traces")
    waiting = jobs.get("pending", 0) + jobs.get("running", 0)
    return f"{stored[0][0] if stored else 0} stored, {jobs.get('done', 0)} done, {waiting} waiting"


def _backlog(fleet: Fleet) -> str:
    """The ``stats`` command's backlog line, read over the server's socket."""
    stats = subprocess.run(
        [sys.executable, "-m", "reflect_otel", "stats", "--store", fleet.store_socket_url],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = [line for line in stats.stdout.splitlines() if line.startswith("attribution backlog:")]
    return lines[0] if lines else "attribution backlog: none"


def baseline(folder: Path, runs: int, llm_delay_s: float) -> int:
    """Tokens the endpoint served for the runs with no fault."""
    with Fleet(folder / "baseline", model=FleetModel(delay_s=llm_delay_s)) as fleet:
        sent = fleet.send(range(runs), right=_right(runs), patience_s=600)
        fleet.wait(lambda: fleet.settled(sent.acked), 900, "the fault-free runs done")
        return fleet.faults.answered * USAGE_TOKENS


def soak(fleet: Fleet, args: argparse.Namespace) -> tuple[Sent, threading.Thread]:
    """Start the agents, play the schedule (printing a line per fault) and return once it is over."""
    faults = schedule(args.cut, args.throttle)
    length = sum(f.seconds for f in faults) + args.gap * (len(faults) + 1)
    sent = Sent()
    right = _right(args.runs)
    started = time.monotonic()

    def agents() -> None:  # a steady rate over the whole schedule, in groups of 4
        for first in range(0, args.runs, 4):
            due = started + length * first / args.runs
            time.sleep(max(0.0, due - time.monotonic()))
            fleet.send(range(first, min(first + 4, args.runs)), right=right, patience_s=600, sent=sent)

    sending = threading.Thread(target=agents, name="agents", daemon=True)
    sending.start()
    for number, fault in enumerate(faults, 1):
        time.sleep(args.gap)
        before = (len(sent.acked), sent.unanswered, sent.refused)
        fault.start(fleet)
        began = time.monotonic() - started
        backlog = ""
        if fault.seconds:
            time.sleep(fault.seconds / 2)
            if "throttle" in fault.name:
                backlog = f"; mid-way: {_backlog(fleet)}"
            time.sleep(fault.seconds / 2)
        fault.end(fleet)
        acked, unanswered, refused = (
            len(sent.acked) - before[0],
            sent.unanswered - before[1],
            sent.refused - before[2],
        )
        print(
            f"fault {number}/{len(faults)} {fault.name} for {fault.seconds:.0f} s from {began:.0f} s: "
            f"{acked} run(s) acknowledged meanwhile ({unanswered} post(s) unanswered, {refused} refused){backlog}; "
            f"after it: {_status(fleet)}",
            flush=True,
        )
    return sent, sending


def check(fleet: Fleet, sent: Sent, runs: int, tokens_without_faults: int, *, smoke: bool) -> tuple[str, bool]:
    """The store against what the agents saw acknowledged; the total line, and whether it meets the bounds (the
    token ratio not held to 10% in a smoke run, where one job done twice is 1 in 8)."""
    acked = set(sent.acked)
    stored_rows = dict(fleet.query("SELECT trace_id, count(*) FROM traces GROUP BY 1"))
    stored = len(acked & set(stored_rows))
    records = dict(fleet.query("SELECT trace_id, count(*) FROM attributions GROUP BY 1"))
    duplicates = sum(count - 1 for count in stored_rows.values()) + sum(count - 1 for count in records.values())
    flagged = {trace_of(n) for n in range(runs) if n not in _right(runs)} & acked
    attributed_once = {t for t in flagged if records.get(t) == 1}
    jobs = fleet.jobs()
    pending = jobs.get("pending", 0) + jobs.get("running", 0) + fleet.queue_left()
    failed = jobs.get("failed", 0)
    redone = fleet.query("SELECT count(*) FROM attribution_jobs WHERE attempts > 1")[0][0]
    tokens = fleet.faults.answered * USAGE_TOKENS
    ratio = tokens / tokens_without_faults if tokens_without_faults else 0.0
    print(
        f"acknowledged {len(acked)} of {runs} runs ({len(sent.given_up)} given up by the agents); {stored} stored, "
        f"{len(acked) - stored} lost; {len(flagged)} flagged, {len(attributed_once)} attributed exactly once; "
        f"jobs {dict(sorted(jobs.items()))}, {redone} taken more than once; {failed} failed; endpoint: "
        f"{fleet.faults.answered} answered, {fleet.faults.refused} refused; {tokens} tokens against "
        f"{tokens_without_faults} without faults"
    )
    ok = (
        stored == len(acked)
        and duplicates == 0
        and pending == 0
        and failed == 0
        and attributed_once == flagged
        and (smoke or abs(ratio - 1) <= 0.10)
    )
    total = (
        f"fleet_faults runs={runs} acked={len(acked)} stored={stored} records={sum(records.values())} "
        f"duplicates={duplicates} pending={pending} token_ratio={ratio:.3f}"
    )
    return total, ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--cut", type=float, default=20.0, help="seconds each link stays cut (default 20)")
    parser.add_argument("--throttle", type=float, default=60.0, help="seconds the endpoint refuses (default 60)")
    parser.add_argument("--gap", type=float, default=5.0, help="seconds between faults (default 5)")
    parser.add_argument("--llm-delay", type=float, default=0.5, help="seconds the endpoint takes per answer")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs in this folder (default: removed)")
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, runs=12, cut=2.0, throttle=4.0, gap=0.5, llm_delay=0.05)
    reason = namespaces_missing()
    if reason is not None:
        print(f"fleet_faults needs hosts it can cut apart: {reason}", file=sys.stderr)
        raise SystemExit(2)
    with tempfile.TemporaryDirectory(prefix="fleet-faults-") as scratch:
        folder = args.logs or Path(scratch)
        started = time.monotonic()
        tokens_without_faults = baseline(folder, args.runs, args.llm_delay)
        print(f"fault-free run: {args.runs} runs, {tokens_without_faults} tokens, {time.monotonic() - started:.0f} s")
        with Fleet(folder / "faults", model=FleetModel(delay_s=args.llm_delay)) as fleet:
            sent, sending = soak(fleet, args)
            sending.join()
            try:
                fleet.wait(lambda: fleet.settled(sent.acked), 900, "every acknowledged run done after the faults")
            except AssertionError as error:  # the check says what is left
                print(str(error).splitlines()[0], file=sys.stderr)
            total, ok = check(fleet, sent, args.runs, tokens_without_faults, smoke=args.smoke)
    print(f"{time.monotonic() - started:.0f} s in all")
    print(total)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
