"""The DuckDB store: an embedded file (default ``./reflect.duckdb``) of traces, steps, verdicts, attributions,
replays and LLM calls, with views for failure statistics. Implements ``reflect_otel.store.AttributionStore``.

One writer thread owns the connection. Each write deletes the rows of its key and inserts them again, so
re-writing the same trace or record changes nothing. Writes are batched by count and time (the path every backend
shares: ``_batched_store.py``) and a batch is one transaction: per table, one DELETE
joined against an Arrow table of the batch's keys and one INSERT from an Arrow table of its rows, so no Python
loop runs per row inside DuckDB. A failing batch is retried one write at a time, so a bad write cannot take the
others down; a killed process leaves each record whole or absent (DuckDB's write-ahead log makes the file
readable again on open).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from reflect_otel.errors import InputError
from reflect_otel.exporters._batched_store import BatchedStore
from reflect_otel.exporters._store_rows import (
    KEYS,
    PARENT,
    Columns,
    Write,
)

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "VIEWS", "DuckDBStore", "connect_read_only"]

_log = logging.getLogger("reflect_otel.exporters.duckdb")

_SCHEMA_V1 = """
CREATE TABLE traces (
    trace_id VARCHAR PRIMARY KEY, session_id VARCHAR, agent VARCHAR, framework VARCHAR, collector VARCHAR,
    question VARCHAR, final_answer VARCHAR, step_count INTEGER, warning_count INTEGER,
    start_time TIMESTAMPTZ, end_time TIMESTAMPTZ, ingested_at TIMESTAMPTZ, metadata JSON, trace_json JSON);
CREATE TABLE steps (
    trace_id VARCHAR, step_index INTEGER, span_id VARCHAR, tool_span_id VARCHAR, kind VARCHAR, agent VARCHAR,
    tool_name VARCHAR, tool_args JSON, tool_result VARCHAR, reasoning VARCHAR, is_final_answer BOOLEAN,
    status VARCHAR, prompt_tokens INTEGER, completion_tokens INTEGER, model_name VARCHAR,
    PRIMARY KEY (trace_id, step_index));
CREATE TABLE verdicts (
    trace_id VARCHAR, verifier VARCHAR, is_correct BOOLEAN, label VARCHAR, score DOUBLE, confidence DOUBLE,
    extracted_answer VARCHAR, reasoning VARCHAR, created_at TIMESTAMPTZ, PRIMARY KEY (trace_id, verifier));
CREATE TABLE attributions (
    trace_id VARCHAR, method VARCHAR, status VARCHAR, mode VARCHAR, step_index INTEGER, span_id VARCHAR,
    error_type VARCHAR, confidence DOUBLE, explanation VARCHAR, root_cause VARCHAR, rollback_point INTEGER,
    corrected_answer VARCHAR, rounds INTEGER, reason VARCHAR, llm_calls INTEGER, tokens INTEGER, seconds DOUBLE,
    created_at TIMESTAMPTZ, record_json JSON, PRIMARY KEY (trace_id, method));
CREATE TABLE replays (
    trace_id VARCHAR, method VARCHAR, seq INTEGER, round INTEGER, rollback_point INTEGER, localized_step INTEGER,
    gate_retry INTEGER, sample INTEGER, faithful BOOLEAN, violation_type VARCHAR, flipped BOOLEAN,
    final_answer VARCHAR, error VARCHAR, PRIMARY KEY (trace_id, method, seq));
CREATE TABLE llm_calls (
    trace_id VARCHAR, method VARCHAR, seq INTEGER, stage VARCHAR, model VARCHAR, prompt_tokens INTEGER,
    completion_tokens INTEGER, seconds DOUBLE, attempts INTEGER, ok BOOLEAN, PRIMARY KEY (trace_id, method, seq));
"""

VIEWS: dict[str, str] = {
    "failure_stats": """
        SELECT CAST(date_trunc('day', coalesce(t.start_time, t.ingested_at)) AS DATE) AS day, t.agent,
               count(*) AS traces,
               count(*) FILTER (WHERE v.is_correct IS NOT NULL) AS judged,
               count(*) FILTER (WHERE v.is_correct = false) AS failed,
               count(*) FILTER (WHERE v.is_correct = false OR v.label = 'HIGH_ERROR_SIGNAL') AS flagged,
               round(count(*) FILTER (WHERE v.is_correct = false)
                     / nullif(count(*) FILTER (WHERE v.is_correct IS NOT NULL), 0), 4) AS failure_rate,
               round(count(*) FILTER (WHERE v.is_correct = false OR v.label = 'HIGH_ERROR_SIGNAL') / count(*), 4)
                   AS flag_rate
        FROM traces t LEFT JOIN (SELECT trace_id, bool_and(is_correct) AS is_correct, max(label) AS label
                                 FROM verdicts GROUP BY trace_id) v USING (trace_id)
        GROUP BY ALL ORDER BY day DESC, agent""",
    "error_types": """
        SELECT coalesce(error_type, CASE WHEN step_index IS NULL THEN 'no_step' ELSE 'unclassified' END) AS error_type,
               count(*) AS attributions,
               round(count(*) / sum(count(*)) OVER (), 4) AS share
        FROM attributions WHERE status <> 'skipped' GROUP BY ALL ORDER BY attributions DESC""",
    "decisive_step_position": """
        SELECT a.trace_id, a.method, a.step_index, t.step_count,
               round(a.step_index / nullif(t.step_count, 0), 4) AS relative_position
        FROM attributions a JOIN traces t USING (trace_id) WHERE a.step_index IS NOT NULL""",
    "verified_share": """
        SELECT method, count(*) AS attributions,
               count(*) FILTER (WHERE status = 'verified') AS verified,
               count(*) FILTER (WHERE status = 'not_attributable') AS not_attributable,
               count(*) FILTER (WHERE status = 'unverified') AS unverified,
               round(count(*) FILTER (WHERE status = 'verified') / nullif(count(*) FILTER (WHERE status <> 'skipped'), 0), 4)
                   AS verified_share
        FROM attributions GROUP BY ALL ORDER BY method""",
    "flip_rate_by_offset": """
        SELECT localized_step - (rollback_point + 1) AS rollback_offset, coalesce(arm, 'intervention') AS arm,
               count(*) AS replays, count(*) FILTER (WHERE flipped) AS flips,
               round(count(*) FILTER (WHERE flipped) / count(*), 4) AS flip_rate
        FROM replays WHERE error IS NULL AND localized_step IS NOT NULL GROUP BY ALL ORDER BY rollback_offset, arm""",
    "replay_fidelity": """
        SELECT json_extract_string(t.trace_json, '$.source.service') AS service, t.agent,
               count(*) AS controls, count(*) FILTER (WHERE r.reproduced) AS reproduced,
               count(*) FILTER (WHERE r.flipped) AS flipped,
               round(count(*) FILTER (WHERE r.reproduced) / count(*), 4) AS fidelity
        FROM replays r JOIN traces t USING (trace_id)
        WHERE r.arm = 'control' AND r.error IS NULL GROUP BY ALL ORDER BY service, agent""",
    "cost_per_trace": """
        SELECT a.trace_id, a.method, a.llm_calls, a.tokens, c.cached_prompt_tokens, a.seconds
        FROM attributions a LEFT JOIN (SELECT trace_id, method, sum(cached_prompt_tokens) AS cached_prompt_tokens
                                       FROM llm_calls GROUP BY ALL) c USING (trace_id, method)
        ORDER BY a.tokens DESC""",
    "cost_per_stage": """
        SELECT stage, count(*) AS calls, sum(prompt_tokens) AS prompt_tokens,
               sum(cached_prompt_tokens) AS cached_prompt_tokens,
               round(sum(cached_prompt_tokens) / nullif(sum(prompt_tokens) FILTER (WHERE cached_prompt_tokens IS NOT NULL), 0), 4)
                   AS cached_share,
               sum(completion_tokens) AS completion_tokens, round(sum(seconds), 3) AS seconds,
               round(avg(prompt_tokens + completion_tokens), 1) AS tokens_per_call
        FROM llm_calls GROUP BY ALL ORDER BY calls DESC""",
    "attribution_queue": """
        SELECT status, count(*) AS runs, sum(attempts) AS attempts
        FROM attribution_jobs GROUP BY ALL ORDER BY status""",
    "verified_by_source": """
        SELECT method, verified_by_source AS source, verified_by_kind AS kind, count(*) AS verified
        FROM attributions WHERE status = 'verified' GROUP BY ALL ORDER BY method, verified DESC""",
}

# v2: prompt tokens the endpoint served from its cache, per call (NULL where the endpoint does not say)
_SCHEMA_V2 = "ALTER TABLE llm_calls ADD COLUMN cached_prompt_tokens INTEGER"

# v3: what proved an attribution (the verifying correction's source and kind), and the correction each replay tested
_SCHEMA_V3 = """
ALTER TABLE attributions ADD COLUMN verified_by_source VARCHAR;
ALTER TABLE attributions ADD COLUMN verified_by_kind VARCHAR;
ALTER TABLE replays ADD COLUMN correction_source VARCHAR;
ALTER TABLE replays ADD COLUMN correction_kind VARCHAR;
ALTER TABLE replays ADD COLUMN replaced_step INTEGER;
ALTER TABLE replays ADD COLUMN original_call VARCHAR;
ALTER TABLE replays ADD COLUMN replacement_call VARCHAR
"""

# v4: the attribution work list (collect --attribute): runs stored and waiting, running, done or failed
_SCHEMA_V4 = """
CREATE TABLE attribution_jobs (
    trace_id VARCHAR PRIMARY KEY, status VARCHAR, attempts INTEGER, expected_answer VARCHAR, reason VARCHAR,
    updated_at TIMESTAMPTZ)
"""

# v5: confidence is measured or NULL; what earlier versions stored there was the auditor's self-report
_SCHEMA_V5 = """
ALTER TABLE attributions ADD COLUMN auditor_confidence DOUBLE;
ALTER TABLE attributions ADD COLUMN confidence_samples INTEGER;
UPDATE attributions SET auditor_confidence = confidence, confidence = NULL
"""

# v6: controlled verification: the effect's two arms (flips, replays, Wilson interval), replay fidelity, and each
# replay's arm and whether it changed the step (a control: whether it reproduced the run)
_SCHEMA_V6 = """
ALTER TABLE attributions ADD COLUMN effect_step INTEGER;
ALTER TABLE attributions ADD COLUMN effect_intervention_replays INTEGER;
ALTER TABLE attributions ADD COLUMN effect_intervention_flips INTEGER;
ALTER TABLE attributions ADD COLUMN effect_intervention_low DOUBLE;
ALTER TABLE attributions ADD COLUMN effect_intervention_high DOUBLE;
ALTER TABLE attributions ADD COLUMN effect_control_replays INTEGER;
ALTER TABLE attributions ADD COLUMN effect_control_flips INTEGER;
ALTER TABLE attributions ADD COLUMN effect_control_low DOUBLE;
ALTER TABLE attributions ADD COLUMN effect_control_high DOUBLE;
ALTER TABLE attributions ADD COLUMN effect_p_value DOUBLE;
ALTER TABLE attributions ADD COLUMN fidelity_controls INTEGER;
ALTER TABLE attributions ADD COLUMN fidelity_reproduced INTEGER;
ALTER TABLE replays ADD COLUMN arm VARCHAR;
ALTER TABLE replays ADD COLUMN changed_step BOOLEAN;
ALTER TABLE replays ADD COLUMN reproduced BOOLEAN
"""

MIGRATIONS: list[str] = [_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3, _SCHEMA_V4, _SCHEMA_V5, _SCHEMA_V6]
"""Each schema version's DDL, in DuckDB's SQL (the PostgreSQL store translates the types)."""
_MIGRATIONS = MIGRATIONS
SCHEMA_VERSION = len(MIGRATIONS)


_ARROW_TYPE_OF = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP WITH TIME ZONE": pa.timestamp("us", tz="UTC"),
}


def _arrow_types(db: duckdb.DuckDBPyConnection) -> dict[str, dict[str, pa.DataType]]:
    """Each table's columns as Arrow types, read from the migrated file. The writer builds its Arrow arrays with
    them: pyarrow's type inference tries to import ``dateutil`` on every call, and where it is not installed that
    is a search of every path entry, holding the GIL (measured: 40 us per column, against 3 us typed)."""
    found: dict[str, dict[str, pa.DataType]] = {}
    rows = db.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns JOIN information_schema.tables "
        "USING (table_catalog, table_schema, table_name) WHERE table_schema = 'main' AND table_type = 'BASE TABLE'"
    ).fetchall()
    for table, column, data_type in rows:
        if data_type in _ARROW_TYPE_OF:
            found.setdefault(table, {})[column] = _ARROW_TYPE_OF[data_type]
    return found


def migrate(db: duckdb.DuckDBPyConnection) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION` and (re)create the views."""
    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
    row = db.execute("SELECT max(version) FROM schema_version").fetchone()
    current = (row[0] if row else None) or 0
    if current > SCHEMA_VERSION:
        raise InputError(
            f"the store was written by a newer reflect-otel (schema {current} > {SCHEMA_VERSION}); upgrade"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        db.execute("BEGIN TRANSACTION")
        for statement in _MIGRATIONS[version - 1].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("DELETE FROM schema_version")  # one row: the version the file is at
        db.execute("INSERT INTO schema_version (version) VALUES (?)", [version])
        db.execute("COMMIT")
    for name, sql in VIEWS.items():
        db.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


_MEMORY_LIMIT = "256MB"
"""DuckDB's own cache for the writer (its default is 80% of the machine's RAM, which a long-running collector
would fill with pages it never reads again); spills to disk beyond it."""


class DuckDBStore(BatchedStore):
    """Opens (creating and migrating) the file at ``path``."""

    def __init__(self, path: str | Path, *, max_queue: int = 10_000) -> None:
        super().__init__(max_queue=max_queue, thread_name="reflect-otel-duckdb")
        self.path = Path(path)
        self.where = str(self.path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True)
        try:
            self._db = duckdb.connect(str(self.path), config={"memory_limit": _MEMORY_LIMIT})
        except duckdb.Error as error:
            raise InputError(f"cannot open the store {self.path}: {_why(error)}") from None
        migrate(self._db)
        self._arrow_types = _arrow_types(self._db)
        self._monitor = self._db.cursor()  # a connection of its own: the writer thread owns ``_db``
        self._monitor_lock = threading.Lock()
        self._start()

    def _read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._monitor_lock:
            return self._monitor.execute(sql, list(params)).fetchall()

    def memory_bytes(self) -> int:
        """Bytes DuckDB holds in memory for this store (its buffer pool, capped at ``_MEMORY_LIMIT``), for
        benchmarks and monitoring; 0 once closed."""
        with self._monitor_lock:
            try:
                row = self._monitor.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()
            except duckdb.Error:
                return 0
        return int(row[0] or 0) if row else 0

    def close(self) -> None:
        self._stop_writer()
        with self._monitor_lock:
            self._monitor.close()
        self._db.close()

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the writer thread -----------------------------------------------------------------------------------
    def _write_batch(self, writes: Sequence[Write]) -> None:
        """Per table, one DELETE of the keys stored already and one INSERT from an Arrow table of the rows."""
        try:
            self._db.execute("BEGIN TRANSACTION")
            for kind, parent in PARENT.items():
                owners = [w for w in writes if w.kind == kind]
                if owners:
                    self._replace(parent, owners)
            self._db.execute("COMMIT")
        except Exception:
            with contextlib.suppress(duckdb.Error):  # nothing to roll back when BEGIN itself failed
                self._db.execute("ROLLBACK")
            raise

    def _replace(self, parent: str, owners: list[Write]) -> None:
        """Delete the rows of the keys of ``owners`` that are stored already (looked up in the parent table, one row
        per key; a fresh ingest deletes nothing), then insert every table's columns."""
        columns = KEYS[parent]
        types = self._arrow_types[parent]
        keys = _typed_table({c: [w.key[i] for w in owners] for i, c in enumerate(columns)}, types)
        with _registered(self._db, "_batch_keys", keys):
            stored = self._db.execute(
                f"SELECT {', '.join(columns)} FROM {parent} SEMI JOIN _batch_keys USING ({', '.join(columns)})"
            ).fetchall()
        if stored:
            existing = _typed_table({c: [row[i] for row in stored] for i, c in enumerate(columns)}, types)
            with _registered(self._db, "_batch_keys", existing):
                for table in owners[0].tables:
                    join = " AND ".join(f"{table}.{c} = _batch_keys.{c}" for c in columns)
                    self._db.execute(f"DELETE FROM {table} USING _batch_keys WHERE {join}")
        for table in owners[0].tables:
            _insert_columns(self._db, table, [w.tables[table] for w in owners], self._arrow_types[table])


def _insert_columns(
    db: duckdb.DuckDBPyConnection, table: str, parts: Sequence[Columns], types: Mapping[str, pa.DataType]
) -> None:
    """The columns of many writes (each with the same names) in one INSERT from one Arrow table of the table's
    types (``types``; a column of another type is inferred, and DuckDB casts it)."""
    columns = list(parts[0])
    merged = {c: [value for part in parts for value in part[c]] for c in columns}
    if not merged[columns[0]]:
        return
    batch = _typed_table(merged, types)
    with _registered(db, "_batch_rows", batch):
        db.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns)} FROM _batch_rows")


def _typed_table(columns: Columns, types: Mapping[str, pa.DataType]) -> pa.Table:
    """``columns`` as an Arrow table, each column of its type in ``types`` (see :func:`_arrow_types` for why);
    a column without one is inferred."""
    return pa.table({c: pa.array(values, types.get(c)) for c, values in columns.items()})


@contextlib.contextmanager
def _registered(db: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> Iterator[None]:
    """``table`` visible to SQL as ``name`` for the block (a scan of the Arrow memory, no copy)."""
    db.register(name, table)
    try:
        yield
    finally:
        db.unregister(name)


_USER_SQL_CONFIG = {
    "enable_external_access": False,  # no COPY TO, EXPORT, ATTACH, read_csv('/etc/...'), glob(), read_text()
    "autoinstall_known_extensions": False,  # and no downloads
    "autoload_known_extensions": False,
    "lock_configuration": True,  # and no SET that turns any of it back on
}
"""For connections that run queries a user typed: the store, read-only, and nothing else on the machine."""


def connect_read_only(path: str | Path) -> duckdb.DuckDBPyConnection:
    """A connection for queries, confined to the store (see ``_USER_SQL_CONFIG``); raises :class:`InputError`
    naming the fix when the file is missing or locked."""
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"no store at {path}; write one with 'reflect-otel attribute --store {path}' (or set REFLECT_STORE)"
        )
    try:
        return duckdb.connect(str(path), read_only=True, config=dict(_USER_SQL_CONFIG))
    except duckdb.Error as error:
        raise InputError(f"cannot read the store {path}: {_why(error)}") from None


def _why(error: duckdb.Error) -> str:
    """DuckDB's reason, with the fix: another process is named only when a lock is what failed."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "lock" in first.lower():
        return f"{first} (another process has it open for writing: stop it, or query a copy of the file)"
    if "not a valid DuckDB database" in first:
        return f"{first} (name a new path or an existing store)"
    return first
