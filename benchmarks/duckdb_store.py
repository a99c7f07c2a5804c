"""DuckDB store: ingest rate of steps and records through ``DuckDBStore``, and the latency of each statistics
view on a store of 1,000,000 steps (generated in SQL, with matching traces, verdicts, attributions, replays and
LLM calls). The baseline, timed in the same run, is ``SELECT count(*) FROM steps``. Target: every view under
200 ms. Last line: ``duckdb_slowest_view_ms=N``."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import duckdb

from reflect_otel.exporters.duckdb_store import VIEWS, DuckDBStore
from reflect_otel.testing.examples import verified_attribution

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
    'm', 400, 60, 0.5, 1, true FROM range(?) r(t), range(9) q(k) WHERE t % 3 = 0;
"""


def median_ms(db: duckdb.DuckDBPyConnection, sql: str, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        db.execute(sql).fetchall()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--ingest-traces", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.duckdb"
        trace, record = verified_attribution()
        start = time.perf_counter()
        with DuckDBStore(path) as store:
            for i in range(args.ingest_traces):
                trace_id = f"{i:032x}"
                store.write_trace(trace.model_copy(update={"trace_id": trace_id}))
                store.write_record(record.model_copy(update={"trace_id": trace_id}))
            store.flush(600)
        ingest = time.perf_counter() - start
        print(
            f"ingest through DuckDBStore: {args.ingest_traces} traces ({args.ingest_traces * 5} steps) and "
            f"{args.ingest_traces} records in {ingest:.2f} s = {args.ingest_traces * 5 / ingest:,.0f} steps/s, "
            f"{args.ingest_traces / ingest:,.0f} records/s"
        )
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
    print(f"duckdb_slowest_view_ms={slowest:.1f}")


if __name__ == "__main__":
    main()
