"""The DuckDB store: idempotent upserts, views, crash safety, the sql and stats commands."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reflect_otel.cli import main
from reflect_otel.exporters._store_rows import record_rows, trace_rows, verdict_rows
from reflect_otel.exporters.duckdb_store import SCHEMA_VERSION, DuckDBStore, _arrow_types
from reflect_otel.record import AttributionRecord
from reflect_otel.testing.examples import five_step_trace, verified_attribution


def _record() -> AttributionRecord:
    return verified_attribution()[1]


def _counts(path: Path) -> dict[str, int]:
    with duckdb.connect(str(path), read_only=True) as db:
        return {
            t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
            for t in ("traces", "steps", "verdicts", "attributions", "replays", "llm_calls")
        }


def _fill(path: Path, times: int = 1) -> AttributionRecord:
    record = _record()
    with DuckDBStore(path) as store:
        for _ in range(times):
            store.write_trace(five_step_trace())
            assert record.original_verdict is not None
            store.write_verdict(record.trace_id, record.original_verdict)
            store.write_record(record)
    return record


def test_writes_are_idempotent(tmp_path: Path) -> None:
    record = _fill(tmp_path / "s.duckdb", times=3)
    counts = _counts(tmp_path / "s.duckdb")
    assert counts == {
        "traces": 1,
        "steps": 5,
        "verdicts": 1,
        "attributions": 1,
        "replays": len(record.replays),
        "llm_calls": len(record.llm_calls),
    }
    _fill(tmp_path / "s.duckdb")  # reopening and re-writing changes nothing either
    assert _counts(tmp_path / "s.duckdb") == counts


def test_every_column_written_has_an_arrow_type_from_the_file(tmp_path: Path) -> None:
    """The writer builds typed Arrow arrays from the file's column types (inference is slow, see ``_arrow_types``):
    a column the writes carry that the file's types miss would fall back to inference unnoticed."""
    record = _record()
    assert record.original_verdict is not None
    writes = [trace_rows(five_step_trace()), verdict_rows(record.trace_id, record.original_verdict)]
    writes.append(record_rows(record))
    DuckDBStore(tmp_path / "s.duckdb").shutdown()
    with duckdb.connect(str(tmp_path / "s.duckdb")) as db:
        types = _arrow_types(db)
    for write in writes:
        for table, columns in write.tables.items():
            assert set(columns) <= set(types[table]), (table, set(columns) - set(types[table]))


def test_views_compute_the_statistics(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    record = _fill(path)
    with duckdb.connect(str(path), read_only=True) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert db.execute("SELECT traces, failed, failure_rate FROM failure_stats").fetchall() == [(1, 1, 1.0)]
        assert db.execute("SELECT error_type, attributions, share FROM error_types").fetchall() == [
            ("incorrect_problem_identification", 1, 1.0)
        ]
        assert db.execute(
            "SELECT step_index, step_count, relative_position FROM decisive_step_position"
        ).fetchall() == [(2, 5, 0.4)]
        assert db.execute("SELECT method, verified, verified_share FROM verified_share").fetchall() == [
            ("reflect", 1, 1.0)
        ]
        # the localized step was 2: its control, the intervention that flipped, then its sensitivity arm (the step
        # changed in text only), which did not
        assert db.execute("SELECT rollback_offset, arm, replays, flips FROM flip_rate_by_offset").fetchall() == [
            (0, "control", 1, 0),
            (0, "intervention", 1, 1),
            (0, "sensitivity", 1, 0),
        ]
        assert db.execute("SELECT service, agent, controls, reproduced, fidelity FROM replay_fidelity").fetchall() == [
            (None, "unknown", 1, 1, 1.0)
        ]
        assert db.execute(
            "SELECT service, agent, points, sensitive, sensitive_share FROM replay_sensitivity"
        ).fetchall() == [(None, "unknown", 1, 0, 0.0)]
        assert db.execute(
            "SELECT effect_step, effect_intervention_flips, effect_intervention_replays, effect_control_flips, "
            "effect_control_replays, effect_sensitivity_flips, effect_sensitivity_replays, fidelity_controls, "
            "fidelity_reproduced, claim, localization_test, obstacle FROM attributions"
        ).fetchall() == [(2, 1, 1, 0, 1, 0, 1, 1, 1, "decisive", "untested", None)]
        assert db.execute("SELECT method, verified, localized, decisive_only FROM verified_claims").fetchall() == [
            ("reflect", 1, 0, 1)
        ]
        assert db.execute("SELECT arm, change FROM replays ORDER BY seq").fetchall() == [
            ("control", None),
            ("intervention", "changed"),
            ("sensitivity", "same_effect"),
        ]
        stages = dict(db.execute("SELECT stage, calls FROM cost_per_stage").fetchall())
        assert stages == {c.stage: c.calls for c in record.cost}
        assert db.execute("SELECT tokens FROM cost_per_trace").fetchone() == (record.total_tokens,)
        # what proved it: the agent's own step 2 under the auditor's plan, executed as an action
        assert db.execute("SELECT method, source, kind, verified FROM verified_by_source").fetchall() == [
            ("reflect", "proposal:llm", "action", 1)
        ]
        assert db.execute(
            "SELECT replaced_step, correction_source, correction_kind, original_call, replacement_call FROM replays "
            "WHERE flipped"
        ).fetchall() == [(2, "proposal:llm", "action", 'read({"x": 7})', 'multiply({"a": 6, "b": 7})')]


def test_invalid_input_is_rejected_and_counted(tmp_path: Path) -> None:
    with DuckDBStore(tmp_path / "s.duckdb") as store:
        store.write_trace({"trace_id": "x"})  # type: ignore[arg-type]
        store.write_record("not a record")  # type: ignore[arg-type]
        store.write_verdict("", None)  # type: ignore[arg-type]
        assert store.force_flush()
        assert store.stats.rejected == 3 and store.stats.errors == 0
    assert _counts(tmp_path / "s.duckdb")["traces"] == 0


_WRITER = """
import sys
from reflect_otel.exporters.duckdb_store import DuckDBStore
from tests.test_store import _record
from tests.test_pipeline import five_step_trace
record = _record()
store = DuckDBStore(sys.argv[1])
i = 0
while True:
    i += 1
    trace = five_step_trace().model_copy(update={"trace_id": f"{i:032x}"})
    store.write_trace(trace)
    store.write_record(record.model_copy(update={"trace_id": trace.trace_id}))
    if i == 20:
        store.force_flush()
        print("ready", flush=True)
    if i == 200:  # well past the flush: the store's writer is busy with batches when the kill lands
        print("busy", flush=True)
"""


def test_a_killed_writer_leaves_a_readable_file_and_no_half_record(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    process = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    assert process.stdout.readline().strip() == "busy"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    with duckdb.connect(str(path)) as db:  # replays the WAL
        traces, attributions = db.execute(
            "SELECT (SELECT count(*) FROM traces), (SELECT count(*) FROM attributions)"
        ).fetchone()  # type: ignore[misc]
        assert traces >= 20 and attributions >= 20
        record = _record()
        # every attribution has all its replays and calls: a record is all there or not at all
        partial = db.execute(
            "SELECT count(*) FROM attributions a WHERE (SELECT count(*) FROM replays r WHERE r.trace_id = a.trace_id) <> ? "
            "OR (SELECT count(*) FROM llm_calls c WHERE c.trace_id = a.trace_id) <> ?",
            [len(record.replays), len(record.llm_calls)],
        ).fetchone()
        assert partial == (0,)
        assert db.execute(
            "SELECT count(*) FROM traces t WHERE (SELECT count(*) FROM steps s WHERE s.trace_id = t.trace_id) <> 5"
        ).fetchone() == (0,)


def test_sql_and_stats_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.duckdb"
    _fill(path)
    assert main(["sql", "SELECT method, status, step_index FROM attributions", "--store", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"method": "reflect", "status": "verified", "step_index": 2}]
    assert main(["sql", "SELECT error_type, attributions FROM error_types", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "incorrect_problem_identification  1" in out and "(1 row)" in out
    assert main(["stats", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 traces, 1 verdicts, 1 attributions" in out and "verified_share" in out and "flip_rate_by_offset" in out
    # per agent, how often a tested point flips on a change of text alone (the sensitivity arms)
    assert "unknown: 0 of 1 tested points flip on a change of text alone" in out
    assert "verified_claims" in out and "replay_sensitivity" in out
    assert main(["sql", "DELETE FROM traces", "--store", str(path)]) == 2
    assert "read-only" in capsys.readouterr().err.lower()
    assert main(["sql", "SELEC nonsense", "--store", str(path)]) == 2
    assert "query failed" in capsys.readouterr().err
    assert main(["stats", "--store", str(tmp_path / "missing.duckdb")]) == 2
    assert "no store there" in capsys.readouterr().err


def test_store_in_use_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb,sys,time; c=duckdb.connect(sys.argv[1]); print('ok', flush=True); time.sleep(30)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        assert main(["stats", "--store", str(path)]) == 2
        assert "another process has it open" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()


def test_attribute_writes_to_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    traces = tmp_path / "t.jsonl"
    assert main(["import", "--example", "-o", str(traces)]) == 0
    monkeypatch.setenv("REFLECT_STORE", str(tmp_path / "env.duckdb"))

    assert main(["attribute", str(traces), "--method", "last-step", "-o", str(tmp_path / "r.jsonl")]) == 0
    counts = _counts(tmp_path / "env.duckdb")  # REFLECT_STORE was used
    assert counts["traces"] == counts["attributions"] == 5 and counts["steps"] == 18


def test_a_version_1_store_is_migrated_in_place(tmp_path: Path) -> None:
    from reflect_otel.exporters.duckdb_store import _MIGRATIONS

    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as db:  # a store as the first release wrote it
        db.execute("CREATE TABLE schema_version (version INTEGER)")
        for statement in _MIGRATIONS[0].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("INSERT INTO schema_version VALUES (1)")
    record = _fill(path)
    with duckdb.connect(str(path), read_only=True) as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        calls = db.execute("SELECT count(*), count(cached_prompt_tokens) FROM llm_calls").fetchone()
    assert calls == (len(record.llm_calls), 0)  # the scripted model reports no cache use: NULL, not 0
