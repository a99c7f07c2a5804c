"""DuckDB store: ingest through ``DuckDBStore`` against DuckDB's own bulk-insert limit, and the latency of each
statistics view on a store of 1,000,000 steps.

Ingest: ``--ingest-traces`` traces of 20 steps (assembled from synthetic ReAct spans, as the collector writes
them) go through ``DuckDBStore.write_trace`` and ``flush``; the limit, timed in the same run, is the same rows
(already built) inserted into an empty file as one Arrow table per table in one transaction, with no Python per
row. Then as many attribution records. Target: at least 20,000 steps/s.

Views: a store of ``--steps`` steps generated in SQL, with matching traces, verdicts, attributions, replays and
LLM calls; the baseline is ``SELECT count(*) FROM steps``. Target: every view under 200 ms.
Last lines: ``duckdb_ingest_steps_per_s=N`` and ``duckdb_slowest_view_ms=N``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa

from benchmarks._common import synthetic_trace
from reflect_otel.assembly import assemble_trace
from reflect_otel.exporters._store_rows import trace_rows
from reflect_otel.exporters.duckdb_store import VIEWS, DuckDBStore, migrate
from reflect_otel.testing.examples import verified_attribution
from reflect_otel.trace import StructuredTrace

GENERATE = """
INSERT INTO traces SELECT printf('%032x', t), NULL, 'agent_' || (t % 7), 'langgraph', 'otlp', 'q', 'a', 20, 0,
    TIMESTAMPTZ '2026-01-01' + INTERVAL (t % 90) DAY, NULL, now(), '{}', '{}' FROM range(?) r(t);
INSERT INTO steps SELECT printf('%032x', t), s, printf('%016x', t * 32 + s), NULL, 'tool_call', 'agent', 'lookup',
    '{}', 'result', 'reasoning', s = 20, 'ok', 10, 5, 'm' FROM range(?) r(t), range(1, 21) q(s);
INSERT INTO verdicts SELECT printf('%032x', t), 'oracle', t % 3 <> 0, NULL, NULL, 1.0, 'a', '', now() FROM range(?) r(t);
INSERT INTO attributions SELECT printf('%032x', t), 'reflect', CASE WHEN t % 2 = 0 THEN 'verified' ELSE 'unverified' END,
    'replay', 1 + t % 20, NULL, ['tool_error', 'hallucination', 'goal_deviation'][1 + t % 3], 0.7, 'e', 'r', 1 + t % 20,
    NULL, 1, '', 9, 4000, 2.5, now(), '{}' FROM range(?) r(t) WHERE t % 3 = 0;
INSERT INTO replays SELECT printf('%032x', t), 'reflect', k, 1, 1 + (t + k) % 20, 1 + t % 20, 0, 0, true, NULL,
    k = 2, 'a', NULL FROM range(?) r(t), range(3) q(k) WHERE t % 3 = 0;
INSERT INTO llm_calls SELECT printf('%032x', t), 'reflect', k, ['localize', 'classify', 'diagnose', 'gate', 'explain'][1 + k % 5],
    'm', 400, 60, 0.5, 1, true, NULL FROM range(?) r(t), range(9) q(k) WHERE t % 3 = 0;
"""


def median_ms(db: duckdb.DuckDBPyConnection, sql: str, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        db.execute(sql).fetchall()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def raw_bulk_insert(path: Path, traces: list[StructuredTrace]) -> float:
    """Seconds to insert the rows of ``traces`` (built beforehand, not timed) as one Arrow table per table."""
    writes = [trace_rows(t) for t in traces]
    tables = {
        name: pa.table({c: [v for w in writes for v in w.tables[name][c]] for c in writes[0].tables[name]})
        for name in ("traces", "steps")
    }
    with duckdb.connect(str(path)) as db:
        migrate(db)
        start = time.perf_counter()
        db.execute("BEGIN TRANSACTION")
        for name, table in tables.items():
            db.register("rows", table)
            db.execute(f"INSERT INTO {name} ({', '.join(table.column_names)}) SELECT * FROM rows")
            db.unregister("rows")
        db.execute("COMMIT")
        return time.perf_counter() - start


def store_ingest(path: Path, traces: list[StructuredTrace]) -> float:
    start = time.perf_counter()
    with DuckDBStore(path) as store:
        for trace in traces:
            store.write_trace(trace)
        assert store.flush(600)
        assert store.stats.traces == len(traces) and store.stats.errors == 0, store.stats
    return time.perf_counter() - start


def ingest(folder: Path, count: int) -> float:
    traces = [assemble_trace(synthetic_trace(n, tool_calls=19)) for n in range(count)]
    steps = sum(len(t.steps) for t in traces)
    limit = raw_bulk_insert(folder / "raw.duckdb", traces)
    ours = store_ingest(folder / "ingest.duckdb", traces)
    print(f"ingest of {count:,} traces, {steps:,} steps ({steps // count} per trace):")
    print(f"  limit, DuckDB bulk insert of the same rows (Arrow): {steps / limit:12,.0f} steps/s")
    print(
        f"  DuckDBStore.write_trace + flush:                   {steps / ours:12,.0f} steps/s "
        f"({limit / ours:.2f} of the limit)"
    )
    _trace, record = verified_attribution()
    start = time.perf_counter()
    with DuckDBStore(folder / "records.duckdb") as store:
        for i in range(count):
            store.write_record(record.model_copy(update={"trace_id": f"{i:032x}"}))
        assert store.flush(600)
    seconds = time.perf_counter() - start
    print(
        f"  DuckDBStore.write_record + flush: {count / seconds:,.0f} records/s ({len(record.replays)} replays, "
        f"{len(record.llm_calls)} LLM calls each)"
    )
    rate = steps / ours
    print(f"target: >= 20,000 steps/s -> {'met' if rate >= 20_000 else 'NOT met'}")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--ingest-traces", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rate = ingest(Path(folder), args.ingest_traces)
        path = Path(folder) / "ingest.duckdb"
        traces = args.steps // 20
        with duckdb.connect(str(path)) as db:
            db.execute(
                "DELETE FROM steps; DELETE FROM traces; DELETE FROM verdicts; DELETE FROM attributions; "
                "DELETE FROM replays; DELETE FROM llm_calls"
            )
            for statement in GENERATE.split(";"):
                if statement.strip():
                    db.execute(statement, [traces])
            count = db.execute("SELECT count(*) FROM steps").fetchone()[0]  # type: ignore[index]
            print(f"generated store: {count:,} steps in {traces:,} traces")
            baseline = median_ms(db, "SELECT count(*) FROM steps", args.repeats)
            print(f"baseline SELECT count(*) FROM steps: {baseline:.1f} ms")
            slowest = 0.0
            for view in VIEWS:
                ms = median_ms(db, f"SELECT * FROM {view}", args.repeats)
                slowest = max(slowest, ms)
                print(
                    f"  {view:<24} {ms:8.1f} ms  ({ms / baseline:.1f}x the baseline)  "
                    f"{'ok' if ms < 200 else 'OVER 200 ms'}"
                )
    print(f"target: every view < 200 ms -> {'met' if slowest < 200 else 'NOT met'}")
    print(f"duckdb_ingest_steps_per_s={rate:.0f}")
    print(f"duckdb_slowest_view_ms={slowest:.1f}")


if __name__ == "__main__":
    main()
