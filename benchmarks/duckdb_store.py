"""DuckDB store: ingest through ``DuckDBStore`` against DuckDB's own bulk-insert limit, and the latency of each
statistics view on a store of 1,000,000 steps.

Ingest: ``--ingest-traces`` traces of 20 steps (assembled from synthetic ReAct spans, as the collector writes
them) go through ``DuckDBStore.write_trace`` and ``flush``; the limit, timed in the same run, is the same rows
(already built) inserted into an empty file as one Arrow table per table in one transaction, with no Python per
row. Then as many attribution records. Target: at least 20,000 steps/s.

Views: a store of ``--steps`` steps written through the store's own write path (so it holds what the store
writes, whatever its schema), with a verdict per trace and a record (replays and LLM calls) for every third, spread
over 7 agents, 90 days, both statuses and three error types for the views to group; the baseline is
``SELECT count(*) FROM steps``. Target: every view under 200 ms.
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

from benchmarks._common import add_smoke_option, smoke_sizes, synthetic_trace
from reflect_otel.exporters._store_rows import trace_rows
from reflect_otel.exporters.duckdb_store import VIEWS, DuckDBStore, migrate
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.record import AttributionStatus, ErrorType
from reflect_otel.testing.examples import verified_attribution
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

_DAY_NS = 86_400 * 10**9
_START_NS = 1_767_225_600 * 10**9  # 2026-01-01
_ERROR_TYPES = (ErrorType.TOOL_ERROR, ErrorType.HALLUCINATION, ErrorType.GOAL_DEVIATION)


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


def populate(path: Path, traces: int) -> int:
    """Write ``traces`` traces of 20 steps to a new store at ``path`` through ``DuckDBStore`` (see the module's
    docstring for how they vary); the number of steps written."""
    template = assemble_trace(synthetic_trace(0, tool_calls=19))
    _trace, record = verified_attribution()
    with DuckDBStore(path) as store:
        for t in range(traces):
            if t % 1_000 == 999:
                assert store.flush(600)  # keep the queue short: a write that waits on a full one is dropped
            trace_id = f"{t:032x}"
            store.write_trace(
                template.model_copy(
                    update={
                        "trace_id": trace_id,
                        "agent": f"agent_{t % 7}",
                        "start_time_ns": _START_NS + t % 90 * _DAY_NS,
                    }
                )
            )
            store.write_verdict(trace_id, Verdict(verifier="oracle", is_correct=t % 3 != 0, confidence=1.0, label="a"))
            if t % 3 == 0:
                status = AttributionStatus.VERIFIED if t % 2 == 0 else AttributionStatus.UNVERIFIED
                store.write_record(
                    record.model_copy(
                        update={
                            "trace_id": trace_id,
                            "status": status,
                            "step_index": 1 + t % 20,
                            "error_type": _ERROR_TYPES[t % 3],
                        }
                    )
                )
        assert store.flush(3_600)
        assert store.stats.traces == traces and store.stats.errors == 0, store.stats
    return traces * len(template.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--ingest-traces", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=5)
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, steps=2_000, ingest_traces=20, repeats=1)
    with tempfile.TemporaryDirectory() as folder:
        rate = ingest(Path(folder), args.ingest_traces)
        path = Path(folder) / "views.duckdb"
        start = time.perf_counter()
        written = populate(path, args.steps // 20)
        print(f"store for the views: {written:,} steps written in {time.perf_counter() - start:.0f} s")
        with duckdb.connect(str(path), read_only=True) as db:
            count = db.execute("SELECT count(*) FROM steps").fetchone()[0]  # type: ignore[index]
            assert count == written, (count, written)
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
