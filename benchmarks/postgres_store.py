"""PostgreSQL store: ingest through ``PostgresStore`` against PostgreSQL's own COPY of the same rows, and N
collectors + M workers sharing one server (``--fleet``).

Ingest: ``--traces`` traces of 20 steps go through ``PostgresStore.write_trace`` and ``flush``; the baseline,
timed in the same run on the same server, COPYs the same rows (built beforehand, not timed) into an empty copy of
the tables in one transaction. Last line: ``postgres_ingest_ratio=R`` (store steps/s over COPY's).

Fleet: for each N, M in ``--fleet`` (e.g. ``1x1,2x2,4x4``), N real ``collect --attribute`` processes and M real
``worker`` processes on one server, a scripted model on loopback answering at once, ``--runs`` wrong runs posted
round-robin to the collectors; jobs/s until every job is done, and a check that none was lost or done twice.
Needs PostgreSQL's binaries (a server is started in a temporary folder; ``--url`` names a running one instead) and
``reflect-otel[postgresql]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._common import add_smoke_option, smoke_sizes, synthetic_trace
from reflect_otel.exporters._store_rows import PARENT, trace_rows
from reflect_otel.exporters.postgres_store import PostgresStore, connect_postgres
from reflect_otel.llm.local import free_port
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
from reflect_otel.testing.otlp_bodies import wrong_run_body
from reflect_otel.testing.postgres import PostgresServer


def _database(server: str, name: str) -> str:
    """A new, empty database ``name`` on the server at URL ``server`` (dropped first if it is there); its URL."""
    with connect_postgres(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    return server.rsplit("/", 1)[0] + f"/{name}"


@contextmanager
def _server(url: str | None) -> Iterator[str]:
    """The server at ``url``, else one started in a temporary folder for the run."""
    if url:
        yield url
        return
    with PostgresServer() as server:
        yield server.url


def ingest(server: str, count: int) -> float:
    traces = [assemble_trace(synthetic_trace(n, tool_calls=19)) for n in range(count)]
    steps = sum(len(t.steps) for t in traces)
    store = PostgresStore(_database(server, "bench_store"))
    start = time.perf_counter()
    for trace in traces:
        store.write_trace(trace)
    assert store.flush(600)
    store_s = time.perf_counter() - start
    assert store.stats.traces == count and store.stats.errors == 0, store.stats
    store.close()

    url = _database(server, "bench_copy")
    PostgresStore(url).close()  # the same tables, empty
    writes = [trace_rows(t) for t in traces]
    with connect_postgres(url) as db:
        start = time.perf_counter()
        with db.transaction(), db.cursor() as cursor:
            for table in writes[0].tables:
                names = list(writes[0].tables[table])
                with cursor.copy(f"COPY {table} ({', '.join(names)}) FROM STDIN") as copy:
                    for write in writes:
                        part = write.tables[table]
                        for row in zip(*(part[c] for c in names), strict=True):
                            copy.write_row(row)
        copy_s = time.perf_counter() - start
    assert PARENT["trace"] == "traces"
    print(f"ingest: {count} traces, {steps} steps")
    print(f"  PostgreSQL COPY of the same rows (baseline): {steps / copy_s:>9,.0f} steps/s")
    print(f"  PostgresStore (DELETE by key + COPY):        {steps / store_s:>9,.0f} steps/s")
    return (steps / store_s) / (steps / copy_s)


def fleet(server: str, collectors: int, workers: int, runs: int, wait_s: float = 900) -> tuple[float, int, int]:
    """(jobs/s, jobs done, jobs done more than once), waiting up to ``wait_s`` for every job to be done."""
    url = _database(server, f"bench_fleet_{collectors}x{workers}")
    PostgresStore(url).close()
    reply = {"error_step": 1, "responsible_agent": None, "reason": "r", "error_type": "tool_error", "confidence": 0.5}
    processes: list[subprocess.Popen[Any]] = []
    with (
        ScriptedOpenAIServer(lambda body: ScriptedTurn(text=json.dumps(reply))) as model,
        tempfile.TemporaryDirectory(prefix="reflect-fleet-") as folder,  # each collector's --out file
    ):
        env = os.environ | {"REFLECT_LLM_BASE_URL": model.base_url, "REFLECT_LLM_API_KEY": "t",
                            "REFLECT_LLM_MODEL": "scripted", "PYTHONUNBUFFERED": "1"}  # fmt: skip
        ports = []
        try:
            for number in range(collectors):
                port = free_port()
                ports.append(port)
                process = subprocess.Popen(
                    [sys.executable, "-m", "reflect_otel", "collect", "--http", f"127.0.0.1:{port}", "-o",
                     str(Path(folder) / f"runs-{number}.jsonl"), "--store", url, "--attribute", "--grace", "0.1"],
                    stderr=subprocess.PIPE, text=True, env=env,
                )  # fmt: skip
                processes.append(process)
                line = process.stderr.readline() if process.stderr is not None else ""
                assert "listening" in line, f"collect {number} did not start: {line}"
            for _ in range(workers):
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "reflect_otel", "worker", "--store", url, "--method", "aao"],
                        stderr=subprocess.DEVNULL,
                        env=env,
                    )
                )
            start = time.perf_counter()
            for number in range(runs):
                request = urllib.request.Request(
                    f"http://127.0.0.1:{ports[number % collectors]}/v1/traces", wrong_run_body(number),
                    {"Content-Type": "application/json"}, method="POST",
                )  # fmt: skip
                with urllib.request.urlopen(request, timeout=30) as response:
                    assert response.status == 200
            with connect_postgres(url, autocommit=True) as db:
                while time.perf_counter() - start < wait_s:
                    row = db.execute("SELECT count(*) FROM attribution_jobs WHERE status = 'done'").fetchone()
                    if row and row[0] >= runs:
                        break
                    time.sleep(0.2)
                seconds = time.perf_counter() - start
                done, twice = db.execute(
                    "SELECT count(*), count(*) FILTER (WHERE attempts > 1) FROM attribution_jobs WHERE status = 'done'"
                ).fetchone() or (0, 0)
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
    return runs / seconds, int(done), int(twice)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=int, default=2_000)
    parser.add_argument("--fleet", default="", help="N collectors x M workers, e.g. 1x1,2x2,4x4 (default: none)")
    parser.add_argument("--runs", type=int, default=200, help="runs per fleet set-up")
    parser.add_argument("--url", help="a running server (its bench_* databases are made again); default: start one")
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, traces=20, fleet="1x1", runs=2)
    with _server(args.url) as server:
        ratio = ingest(server, args.traces)
        for shape in [s for s in args.fleet.split(",") if s]:
            collectors, workers = (int(x) for x in shape.lower().split("x"))
            rate, done, twice = fleet(server, collectors, workers, args.runs, wait_s=120 if args.smoke else 900)
            print(f"fleet {collectors} collector(s) x {workers} worker(s): {rate:6.1f} jobs/s; "
                  f"{done} of {args.runs} done, {twice} done more than once")  # fmt: skip
            assert not args.smoke or (done, twice) == (args.runs, 0), (done, twice)
        print(f"postgres_ingest_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
