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
    later_jobs,
    migrations_to_apply,
)
from reflect_otel.exporters.duckdb_schema import MIGRATIONS, SCHEMA_VERSION, VIEWS

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "VIEWS", "DuckDBStore", "connect_read_only", "migrate"]

_MIGRATIONS = MIGRATIONS

_log = logging.getLogger("reflect_otel.exporters.duckdb")


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
    for version, statements in migrations_to_apply((row[0] if row else None) or 0, MIGRATIONS):
        db.execute("BEGIN TRANSACTION")
        for statement in statements:
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

    def _release(self) -> None:
        with self._monitor_lock:
            self._monitor.close()
        self._db.close()

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
        per key; a fresh ingest deletes nothing), then insert every table's columns. A job write that would take its
        job back is left out (:func:`~reflect_otel.exporters._store_rows.later_jobs`)."""
        if parent == "attribution_jobs":
            ids = [w.key[0] for w in owners]
            stored = self._db.execute(
                "SELECT trace_id, status, attempts FROM attribution_jobs WHERE trace_id IN (SELECT unnest(?))", [ids]
            ).fetchall()
            owners = later_jobs(owners, {row[0]: (row[1], row[2]) for row in stored})
            if not owners:
                return
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
