"""The store contract, run against every backend: the in-memory reference store first, then DuckDB (embedded) and
PostgreSQL (a real server, started for the session). The same writes give the same rows in every table and view
(the SQL backends); writes are idempotent; bad writes are rejected and counted; jobs, traces and records read
back."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.exporters.duckdb_store import VIEWS, DuckDBStore
from reflect_otel.store import AttributionJob, ReadsRecords
from reflect_otel.store.memory import InMemoryStore
from reflect_otel.testing.store_conformance import StoreUnderTest, sample_writes, schema, view_rows, write_sample

BACKENDS = ["memory", "duckdb", "postgresql"]
SQL_BACKENDS = ["duckdb", "postgresql"]
TABLES = ("traces", "steps", "verdicts", "attributions", "replays", "llm_calls", "attribution_jobs")
_databases = itertools.count()


@pytest.fixture
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreUnderTest]:
    if request.param == "memory":
        memory = InMemoryStore()
        yield StoreUnderTest(memory)
        memory.shutdown()
        return
    if request.param == "duckdb":
        store = DuckDBStore(tmp_path / "conformance.duckdb")

        def query(sql: str) -> list[tuple[Any, ...]]:
            store.force_flush()
            return store._read(sql, [])

        yield StoreUnderTest(store, query)
        store.shutdown()
        return
    server = request.getfixturevalue("postgres_server")
    from reflect_otel.exporters.postgres_store import PostgresStore, connect_postgres

    name = f"conformance_{next(_databases)}"
    with connect_postgres(server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    pg = PostgresStore(server.url.rsplit("/", 1)[0] + f"/{name}")

    def pg_query(sql: str) -> list[tuple[Any, ...]]:
        pg.force_flush()
        return pg._read(sql, [])

    yield StoreUnderTest(pg, pg_query)
    pg.shutdown()


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
def test_every_table_and_view_holds_what_the_reference_backend_holds(backend: StoreUnderTest, tmp_path: Path) -> None:
    write_sample(backend.store)
    reference = DuckDBStore(tmp_path / "reference.duckdb")
    write_sample(reference, twice=False)
    for table in TABLES:
        counted = backend.query(f"SELECT count(*) FROM {table}")[0][0]
        expected = reference._read(f"SELECT count(*) FROM {table}", [])[0][0]
        assert counted == expected, table  # written twice, stored once
    for view in VIEWS:
        assert view_rows(backend.query, view) == view_rows(lambda sql: reference._read(sql, []), view), view
    reference.shutdown()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_everything_written_twice_reads_back_as_written_once(backend: StoreUnderTest) -> None:
    traces, _, records, jobs = sample_writes()
    write_sample(backend.store)  # twice
    assert [backend.store.read_trace(t.trace_id) for t in traces] == traces
    assert [backend.store.read_job(j.trace_id) for j in jobs] == jobs
    with_cause = {(r.trace_id, r.method) for r in records if r.root_cause.strip()}
    assert sorted((r.trace_id, r.method) for _, r in backend.store.recent_records(100)) == sorted(with_cause)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_jobs_and_traces_read_back_and_bad_writes_are_counted(backend: StoreUnderTest) -> None:
    store = backend.store
    traces, _, _, jobs = sample_writes()
    write_sample(store, twice=False)
    pending = store.pending_jobs(10)
    assert {(j.trace_id, j.status) for j in pending} == {
        (j.trace_id, j.status) for j in jobs if j.status in ("pending", "running")
    }
    assert store.pending_jobs(1) == pending[:1]
    assert store.read_trace(traces[0].trace_id) == traces[0]
    assert store.read_trace("e" * 32) is None
    store.write_job(AttributionJob("f" * 32, "lost"))  # type: ignore[arg-type]
    store.write_trace("not a trace")  # type: ignore[arg-type]
    assert store.force_flush(30_000)
    assert store.stats.rejected == 2


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_jobs_state_never_goes_back_so_late_writes_change_nothing(backend: StoreUnderTest) -> None:
    """A worker cut off from the store writes late: its 'running' and even its 'done' of attempt 1 arrive after
    another worker's 'done' of attempt 2, and a collector may offer the run again ('pending'). None of them takes
    the job back, in a batch of its own or in one batch; a later attempt does move it on."""
    store = backend.store
    job = "c" * 32
    for write in (AttributionJob(job, "pending"), AttributionJob(job, "running", 1), AttributionJob(job, "running", 2),
                  AttributionJob(job, "done", 2, reason="w2")):  # fmt: skip
        store.write_job(write)
        assert store.force_flush(30_000)
    late = (
        AttributionJob(job, "running", 1),
        AttributionJob(job, "done", 1, reason="w1"),
        AttributionJob(job, "pending"),
    )
    for write in late:
        store.write_job(write)
        assert store.force_flush(30_000)
    assert store.read_job(job) == AttributionJob(job, "done", 2, reason="w2")
    for write in (AttributionJob(job, "done", 2, reason="again"), *late):  # the same in one batch
        store.write_job(write)
    assert store.force_flush(30_000)
    assert store.read_job(job) == AttributionJob(job, "done", 2, reason="again")  # an equal state: the last wins
    store.write_job(AttributionJob(job, "running", 3))
    assert store.read_job(job) == AttributionJob(job, "running", 3)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_the_latest_records_read_back_with_their_questions(backend: StoreUnderTest) -> None:
    store = backend.store
    assert isinstance(store, ReadsRecords)  # the built-in stores give their records back (the placebo's plans)
    traces, _, records, _ = sample_writes()
    write_sample(store, twice=False)
    questions = {t.trace_id: t.question for t in traces}
    with_cause = {(r.trace_id, r.method) for r in records if r.root_cause.strip()}
    read = store.recent_records(10)
    assert with_cause and {(r.trace_id, r.method) for _, r in read} == with_cause
    assert all(question == questions[r.trace_id] and r in records for question, r in read)
    assert {r.method for _, r in store.recent_records(10, excluding="aao")} == {m for _, m in with_cause} - {"aao"}
    assert len(store.recent_records(1)) == 1 and store.recent_records(0) == []
    # the newest first: a record written an hour later, of a trace that is stored; one whose trace is not, left out
    latest = records[0].model_copy(update={"method": "late", "created_at": records[0].created_at + timedelta(hours=1)})
    orphan = latest.model_copy(update={"trace_id": "9" * 32})
    store.write_record(latest)
    store.write_record(orphan)
    assert [r for _, r in store.recent_records(1)] == [latest]
    assert "9" * 32 not in {r.trace_id for _, r in store.recent_records(100)}


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
def test_a_write_that_fails_does_not_take_its_batch_down(backend: StoreUnderTest) -> None:
    """A trace whose rows the backend refuses (a NUL character: PostgreSQL's text cannot hold one; DuckDB's can)
    is rolled back alone; the other writes of its batch are kept."""
    traces, verdicts, _, _ = sample_writes()
    bad = traces[1].model_copy(update={"question": "a\x00b"})
    backend.store.write_trace(traces[0])
    backend.store.write_trace(bad)
    backend.store.write_verdict(*verdicts[0])
    assert backend.store.force_flush(30_000)
    kept = {row[0] for row in backend.query("SELECT trace_id FROM traces")}
    assert traces[0].trace_id in kept
    assert backend.query("SELECT count(*) FROM verdicts")[0][0] == 1
    assert (bad.trace_id in kept) != (backend.store.stats.errors == 1)


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
def test_every_table_and_view_has_the_reference_backends_columns(backend: StoreUnderTest, tmp_path: Path) -> None:
    """Each backend writes its own DDL and views (``duckdb_schema``, ``postgres_schema``): the same tables with the
    same columns in the same order and of the same kind, the same views with the same columns, the same version."""
    reference = DuckDBStore(tmp_path / "reference.duckdb")
    expected = schema(lambda sql: reference._read(sql, []))
    version = reference._read("SELECT version FROM schema_version", [])
    reference.shutdown()
    assert set(expected) == {*TABLES, *VIEWS, "schema_version"}
    assert not [c for columns in expected.values() for c in columns if c[1].startswith("unexpected")]
    assert schema(backend.query) == expected
    assert backend.query("SELECT version FROM schema_version") == version


def test_a_postgresql_store_made_from_duckdbs_ddl_migrates_to_the_same_columns(
    postgres_server: Any, tmp_path: Path
) -> None:
    """PostgreSQL stores made before its DDL was written out took DuckDB's with the types replaced (``VARCHAR``
    kept): they migrate on from where they are, to the reference columns, and take writes like a new one."""
    from reflect_otel.exporters import duckdb_schema
    from reflect_otel.exporters.postgres_store import PostgresStore, connect_postgres

    with connect_postgres(postgres_server.url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE made_at_v5")
    url = postgres_server.url.rsplit("/", 1)[0] + "/made_at_v5"
    with connect_postgres(url) as db, db.transaction():
        db.execute("CREATE TABLE schema_version (version INTEGER)")
        for ddl in duckdb_schema.MIGRATIONS[:5]:
            for statement in ddl.replace(" DOUBLE", " DOUBLE PRECISION").replace(" JSON", " JSONB").split(";"):
                if statement.strip():
                    db.execute(statement)
        db.execute("INSERT INTO schema_version (version) VALUES (5)")
    with PostgresStore(url) as store:
        write_sample(store)
        found = schema(lambda sql: store._read(sql, []))
        assert store._read("SELECT count(*) FROM attributions", []) == [(len(sample_writes()[2]),)]
    assert found["replays"][-4:] == (
        ("arm", "text"),
        ("changed_step", "boolean"),
        ("reproduced", "boolean"),
        ("change", "text"),
    )
    with DuckDBStore(tmp_path / "reference.duckdb") as reference:
        assert found == schema(lambda sql: reference._read(sql, []))


def test_views_have_the_same_names_in_both_backends() -> None:
    from reflect_otel.exporters.postgres_store import PG_VIEWS

    assert set(PG_VIEWS) == set(VIEWS)


def test_sql_stats_and_report_read_a_postgresql_store(
    postgres_server: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--store postgresql://...`` for the commands: writes through the PostgreSQL backend, reads in read-only
    transactions, one statement per query."""
    from reflect_otel.cli import main
    from reflect_otel.exporters.postgres_store import PostgresStore, connect_postgres

    with connect_postgres(postgres_server.url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE commands")
    url = postgres_server.url.rsplit("/", 1)[0] + "/commands"
    with PostgresStore(url) as store:
        write_sample(store)
    assert (
        main(["sql", "SELECT method, status FROM attributions ORDER BY method, status", "--store", url, "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out) == [
        {"method": "aao", "status": "unverified"},
        {"method": "evidence", "status": "unverified"},
        {"method": "last-step", "status": "unverified"},
        {"method": "reflect", "status": "skipped"},
        {"method": "reflect", "status": "verified"},
    ]
    assert main(["stats", "--store", url]) == 0
    out = capsys.readouterr().out
    assert "4 traces, 3 verdicts, 5 attributions, 2 run(s) pending attribution" in out and "verified_share" in out
    assert "1 of 4 trace(s) were never judged right or wrong" in out and "no_step" in out
    assert main(["sql", "DELETE FROM traces", "--store", url]) == 2
    assert "read-only" in capsys.readouterr().err
    assert main(["sql", "SELECT 1; DELETE FROM traces", "--store", url]) == 2
    assert "query failed" in capsys.readouterr().err
    assert main(["sql", "SELECT pg_read_file('/etc/hostname')", "--store", url]) == 2  # even for a superuser URL
    assert "permission denied" in capsys.readouterr().err
    assert main(["sql", "SELECT count(*) AS n FROM traces", "--store", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 4}]
    report = tmp_path / "report.html"
    assert main(["report", "0", "--store", url, "-o", str(report), "--method", "reflect"]) == 0
    assert "verified" in report.read_text()


_KILLED_WRITER = """
import sys
from reflect_otel.exporters.postgres_store import PostgresStore
from reflect_otel.testing.store_conformance import sample_writes
traces, _, records, _ = sample_writes()
store = PostgresStore(sys.argv[1])
print("writing", flush=True)
number = 0
while True:
    number += 1
    tid = f"{number:032x}"
    store.write_trace(traces[0].model_copy(update={"trace_id": tid}))
    store.write_record(records[0].model_copy(update={"trace_id": tid}))
"""


def test_kill_9_leaves_every_postgresql_write_whole_or_absent(postgres_server: Any) -> None:
    import subprocess
    import sys
    import time

    from reflect_otel.exporters.postgres_store import connect_postgres

    with connect_postgres(postgres_server.url, autocommit=True) as admin:
        admin.execute("CREATE DATABASE killed")
    url = postgres_server.url.rsplit("/", 1)[0] + "/killed"
    writer = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, url], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
    deadline = time.monotonic() + 120  # a loaded machine gives the writer little time: wait for its writes, not a clock
    with connect_postgres(url, autocommit=True) as db:
        while time.monotonic() < deadline and writer.poll() is None:
            row = db.execute("SELECT count(*) FROM attributions").fetchone()
            if row is not None and row[0] > 10:
                break
            time.sleep(0.2)
    writer.kill()
    writer.wait(timeout=30)
    with connect_postgres(url, autocommit=True) as db:
        traces = db.execute("SELECT trace_id, step_count FROM traces").fetchall()
        steps = dict(db.execute("SELECT trace_id, count(*) FROM steps GROUP BY 1").fetchall())
        records = db.execute("SELECT trace_id, record_json FROM attributions").fetchall()
        replays = dict(db.execute("SELECT trace_id, count(*) FROM replays GROUP BY 1").fetchall())
        calls = dict(db.execute("SELECT trace_id, count(*) FROM llm_calls GROUP BY 1").fetchall())
    assert len(traces) > 10 and records  # it was writing when killed
    assert all(steps.get(trace_id) == count for trace_id, count in traces)
    for trace_id, record in records:
        assert replays.get(trace_id, 0) == len(record["replays"]) and calls.get(trace_id, 0) == len(record["llm_calls"])


def test_a_postgresql_store_waits_out_a_server_restart_and_loses_no_write(postgres_server: Any) -> None:
    """A server restarted under the store (every session ended): the writes queued meanwhile are kept and written on
    a new connection, and reads open one too; nothing is counted as an error or dropped. (A server of its own: the
    session's serves the other tests.)"""
    from reflect_otel.exporters.postgres_store import PostgresStore
    from reflect_otel.testing.postgres import PostgresServer

    traces, verdicts, _, _ = sample_writes()
    with PostgresServer() as server:
        store = PostgresStore(server.url)
        store.write_trace(traces[0])
        assert store.force_flush(30_000)
        server.restart(mode="immediate")  # as a crash: no goodbye to the sessions
        store.write_trace(traces[1])
        store.write_verdict(*verdicts[0])
        assert store.force_flush(60_000)
        assert store.read_trace(traces[1].trace_id) == traces[1]
        assert (store.stats.traces, store.stats.verdicts, store.stats.errors, store.stats.dropped) == (2, 1, 0, 0)
        store.shutdown()
