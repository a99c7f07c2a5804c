"""Failure patterns across runs (the ``failure_patterns`` view and ``stats --patterns``), on a store of the live
tables' runs: the stored rows of ``benchmarks/results/wtq-live-controlled-seed48`` (the table agent, five methods)
and ``wtq-live-sql-seed4917`` (the SQL agent, four), each row's trace and each method's record written as the
benchmark's store would hold them (one record per trace and method: the row written last wins)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.cli import main
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.record import AttributionRecord
from reflect_otel.store import AttributionStore
from reflect_otel.testing.store_conformance import view_rows
from reflect_otel.trace import StructuredTrace

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
LIVE = (RESULTS / "wtq-live-controlled-seed48" / "results.jsonl", RESULTS / "wtq-live-sql-seed4917" / "results.jsonl")


def _rows(limit: int | None = None) -> Iterator[dict[str, Any]]:
    for path in LIVE:
        with path.open(encoding="utf-8") as lines:
            for line in itertools.islice(lines, limit):
                yield json.loads(line)


def _write(store: AttributionStore, rows: Iterator[dict[str, Any]]) -> None:
    for row in rows:
        store.write_trace(StructuredTrace.model_validate(row["trace"]))
        for method in row["methods"].values():
            if method.get("record"):
                store.write_record(AttributionRecord.model_validate(method["record"]))
    assert store.flush(120)


@pytest.fixture(scope="module")
def live_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("patterns") / "live.duckdb"
    with DuckDBStore(path) as store:
        _write(store, _rows())
    return path


def test_stats_patterns_lists_the_recurring_failures_of_the_live_runs(live_store: Path, capsys: Any) -> None:
    assert main(["stats", "--patterns", "--store", str(live_store)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "36 failure pattern(s) seen in at least 2 attribution(s), of 63 pattern(s) among the 228 attribution(s) "
        "that localized a step"
    )
    header = out[1].split()
    assert header == [
        "method", "agent", "step", "tool", "arguments", "error_type", "evidence_rule", "runs", "verified",
        "verified_share", "first_seen", "last_seen", "example_trace",
    ]  # fmt: skip
    rows = [line.split() for line in out[3:]]
    assert len(rows) == 36 and all(int(r[-8]) >= 2 for r in rows)
    # the SQL agent's commonest: REFLECT blamed the final answer for a tool error in 14 runs, verified in none
    assert [
        "reflect", "sql_agent", "final_answer", "tool_error", "14", "0", "0%", "2026-11-28", "20:40Z", "2026-11-28",
        "22:20Z", "42002b1a6baa4d7e6af9c26229ef597d",
    ] in rows  # fmt: skip
    # the SQL agent's schema call, localized twice and verified both times; the table agent's lookup by its arguments
    assert any(
        r[:5] == ["reflect", "sql_agent", "tool_call", "schema", "tool_error"] and r[5:8] == ["2", "2", "100%"]
        for r in rows
    )
    assert any(r[:6] == ["reflect", "agent", "tool_call", "lookup", "column,row,table", "hallucination"] for r in rows)

    assert main(["stats", "--patterns", "--min-runs", "1", "--method", "reflect", "--store", str(live_store)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("16 failure pattern(s) seen in at least 1 attribution(s), of 16 pattern(s) among the 50")
    # the evidence rule that fired at the localized step: valid_options at the SQL agent's query
    (query,) = [line.split() for line in out[3:] if " query " in line]
    assert query[:8] == ["reflect", "sql_agent", "tool_call", "query", "sql", "tool_error", "valid_options", "1"]


def test_the_view_reads_the_same_rows_from_a_postgresql_store(
    live_store: Path, postgres_server: Any, tmp_path: Path
) -> None:
    """The same runs in both backends give the same patterns (the first rows of each file: the SQL agent's among
    them carry the evidence rule, and the table agent's the argument names)."""
    from reflect_otel.exporters.postgres_store import PostgresStore, connect_postgres

    with connect_postgres(postgres_server.url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE patterns")
    pg = PostgresStore(postgres_server.url.rsplit("/", 1)[0] + "/patterns")
    duck = DuckDBStore(tmp_path / "few.duckdb")
    try:
        for store in (pg, duck):
            _write(store, _rows(60))
        order = ("method", "agent", "step_kind", "tool_name", "argument_shape", "error_type", "evidence_rule")
        expected = view_rows(lambda sql: duck._read(sql, []), "failure_patterns", order)
        assert any(row[6] == "valid_options" for row in expected) and any(row[4] for row in expected)
        assert view_rows(lambda sql: pg._read(sql, []), "failure_patterns", order) == expected
    finally:
        pg.close()
        duck.close()


def test_a_store_without_attributions_says_so(tmp_path: Path, capsys: Any) -> None:
    with DuckDBStore(tmp_path / "empty.duckdb"):
        pass
    assert main(["stats", "--patterns", "--store", str(tmp_path / "empty.duckdb")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "(no attribution localized a step yet)"
