"""The PostgreSQL store: the DuckDB store's tables, views and schema versions (in PostgreSQL's SQL:
``postgres_schema``) on a server that many collectors and workers share (``--store postgresql://...`` or
``REFLECT_STORE``; :func:`reflect_otel.store.store_kind` says which store a target names). Implements
``reflect_otel.store.AttributionStore``; needs ``pip install 'reflect-otel[postgresql]'`` (psycopg 3).

One writer thread per store owns a connection; a batch is one transaction: per table, one DELETE of the batch's
keys (joined against arrays of them) and one COPY of its rows, so no statement runs per row (the jobs: one upsert
that never takes a job back). Reads use a
connection of their own. Migrations run under a transaction-scoped advisory lock, so collectors starting together
migrate once. A killed process leaves each write whole or absent (PostgreSQL's transactions).

Across a network: every connection has TCP keepalives and a TCP user timeout (:data:`CONNECT_OPTIONS`, unless the
URL sets them), so a cut link fails a statement within seconds instead of the kernel's quarter of an hour. A
server out of reach (a cut link, a restart: psycopg's ``OperationalError``) keeps the writer's batch, which is
tried again on a new connection until it is written (see ``_batched_store``); a read gets one new connection and
one more try.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from reflect_otel.errors import ConfigError, InputError
from reflect_otel.exporters._batched_store import BatchedStore
from reflect_otel.exporters._store_rows import KEYS, PARENT, Write, migrations_to_apply
from reflect_otel.exporters.postgres_schema import MIGRATIONS, SCHEMA_VERSION
from reflect_otel.exporters.postgres_schema import VIEWS as PG_VIEWS

__all__ = [
    "CONNECT_OPTIONS",
    "MIGRATIONS",
    "PG_VIEWS",
    "SCHEMA_VERSION",
    "PostgresStore",
    "connect_postgres",
    "connect_read_only_postgres",
    "connection_options",
    "migrate_postgres",
    "out_of_reach",
]

_MIGRATION_LOCK = 0x5EF1EC7
"""The advisory lock id migrations hold (any fixed number no other application uses)."""


CONNECT_OPTIONS: dict[str, int] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
"""libpq options every connection gets unless its URL sets them: a connection attempt gives up after 10 s, an idle
connection whose peer is gone is found within 19 s (keepalives), and one whose sent data goes unacknowledged for
10 s fails (the TCP user timeout), so a worker cut off mid-statement learns it in seconds."""


def connection_options(url: str) -> dict[str, int]:
    """:data:`CONNECT_OPTIONS` less those ``url`` sets itself."""
    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(url)
    return {name: value for name, value in CONNECT_OPTIONS.items() if name not in given}


def out_of_reach(error: BaseException) -> bool:
    """Whether ``error`` says the server could not be reached or went away (a cut link, a restart, a full pool),
    rather than that a statement was wrong: psycopg's ``OperationalError`` (which also covers deadlocks and
    serialization failures, worth another try too) and ``InterfaceError``, a connection that cannot be opened, and
    psycopg_pool's timeout waiting for one."""
    import psycopg

    if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError | _Unreachable):
        return True
    return type(error).__name__ in ("PoolTimeout", "TooManyRequests")


class _Unreachable(InputError):
    """The server could not be connected to."""


def connect_postgres(url: str, *, autocommit: bool = False) -> Any:
    """A psycopg connection to ``url`` (with :data:`CONNECT_OPTIONS`); :class:`ConfigError` naming the fix when
    psycopg is missing, :class:`InputError` when the server cannot be reached."""
    try:
        import psycopg
    except ImportError:
        raise ConfigError("a postgresql:// store needs psycopg: pip install 'reflect-otel[postgresql]'") from None
    try:
        from psycopg.conninfo import make_conninfo

        return psycopg.connect(make_conninfo(url, **connection_options(url)), autocommit=autocommit)
    except psycopg.Error as error:
        shown = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise _Unreachable(
            f"cannot open the PostgreSQL store: {shown} (is the server up, and the URL right?)"
        ) from None


def connect_read_only_postgres(url: str, *, statement_timeout_ms: int = 60_000) -> Any:
    """A connection for queries a user typed: every transaction read-only, each statement bounded in time, one
    statement per query (psycopg's extended protocol refuses several). Give the URL of a role that may only read
    (``GRANT SELECT``) to keep server-side functions such as ``pg_read_file`` out of reach as well."""
    connection = connect_postgres(url)
    connection.read_only = True
    connection.execute("SELECT set_config('statement_timeout', %s, false)", [str(statement_timeout_ms)])
    reader = connection.execute("SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles WHERE rolname = %s",
                                [READER_ROLE]).fetchone()  # fmt: skip
    if reader and reader[0]:
        connection.execute(f"SET SESSION ROLE {READER_ROLE}")  # server-side file functions out of reach
    connection.commit()
    return connection


def migrate_postgres(connection: Any) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION` (``postgres_schema``) and (re)create the views, once even when
    several processes start together."""
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", [_MIGRATION_LOCK])
        connection.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
        row = connection.execute("SELECT max(version) FROM schema_version").fetchone()
        for version, statements in migrations_to_apply((row[0] if row else None) or 0, MIGRATIONS):
            for statement in statements:
                connection.execute(statement)
            connection.execute("DELETE FROM schema_version")
            connection.execute("INSERT INTO schema_version (version) VALUES (%s)", [version])
        for name, sql in PG_VIEWS.items():
            connection.execute(f"DROP VIEW IF EXISTS {name}")
            connection.execute(f"CREATE VIEW {name} AS {sql}")
        _grant_reader(connection)


READER_ROLE = "reflect_reader"
"""A role without login that may only SELECT the store's tables and views: read connections take it on."""


def _grant_reader(connection: Any) -> None:
    """Create :data:`READER_ROLE` (where the migrating user may create roles) and let it read every table and view."""
    exists = connection.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [READER_ROLE]).fetchone()
    if not exists:
        allowed = connection.execute(
            "SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        if not (allowed and allowed[0]):
            return
        connection.execute(f"CREATE ROLE {READER_ROLE} NOLOGIN")
    connection.execute(f"GRANT USAGE ON SCHEMA public TO {READER_ROLE}")
    connection.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER_ROLE}")
    member = connection.execute("SELECT pg_has_role(current_user, %s, 'MEMBER')", [READER_ROLE]).fetchone()
    if not (member and member[0]):
        connection.execute(f"GRANT {READER_ROLE} TO current_user")


_JOB_TYPES = {
    "trace_id": "text", "status": "text", "attempts": "int", "expected_answer": "text", "reason": "text",
    "updated_at": "timestamptz",
}  # fmt: skip


def _rank(row: str) -> str:
    return f"CASE {row}.status WHEN 'pending' THEN 0 WHEN 'running' THEN 1 ELSE 2 END"


_UPSERT_JOBS = (
    f"INSERT INTO attribution_jobs ({', '.join(_JOB_TYPES)}) "
    f"SELECT * FROM unnest({', '.join(f'%s::{t}[]' for t in _JOB_TYPES.values())}) "
    "ON CONFLICT (trace_id) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in list(_JOB_TYPES)[1:])
    + f" WHERE (coalesce(attribution_jobs.attempts, 0), {_rank('attribution_jobs')}) "
    f"<= (coalesce(excluded.attempts, 0), {_rank('excluded')})"
)
"""Job rows upserted, a stored row replaced only by a write not below it: (attempts, pending < running < done or
failed), as :func:`~reflect_otel.exporters._store_rows.later_jobs` says."""


class PostgresStore(BatchedStore):
    """Opens (migrating) the store at ``url`` (``postgresql://user@host:port/database``)."""

    def __init__(self, url: str, *, max_queue: int = 10_000) -> None:
        super().__init__(max_queue=max_queue, thread_name="reflect-otel-postgresql")
        self.url = str(url)
        self.where = _without_password(self.url)
        self._db = connect_postgres(self.url)
        try:
            migrate_postgres(self._db)
            self._reader = connect_postgres(self.url, autocommit=True)
        except Exception:
            self._db.close()
            raise
        self._reader_lock = threading.Lock()
        self._start()

    def _read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        query = sql.replace("?", "%s")
        with self._reader_lock:
            try:
                return list(self._reader.execute(query, list(params)).fetchall())
            except Exception as error:
                if not out_of_reach(error):
                    raise
            with contextlib.suppress(Exception):
                self._reader.close()
            self._reader = connect_postgres(self.url, autocommit=True)  # the server restarted, or the link came back
            return list(self._reader.execute(query, list(params)).fetchall())

    def _unavailable(self, error: Exception) -> bool:
        return out_of_reach(error)

    def _reconnect(self) -> None:
        with contextlib.suppress(Exception):
            self._db.close()
        self._db = connect_postgres(self.url)

    def _write_batch(self, writes: Sequence[Write]) -> None:
        with self._db.transaction():
            for kind, parent in PARENT.items():
                owners = [w for w in writes if w.kind == kind]
                if owners:
                    self._replace(parent, owners)

    def _upsert_jobs(self, owners: list[Write]) -> None:
        """The job rows of ``owners`` in one statement, each replacing the stored row unless that would take the job
        back (the rule of :func:`~reflect_otel.exporters._store_rows.later_jobs`, applied by the server under the
        row's lock, so two workers' writes of one job are compared one after the other)."""
        names = list(owners[0].tables["attribution_jobs"])
        if names != list(_JOB_TYPES):
            raise RuntimeError(f"attribution_jobs columns {names} are not {list(_JOB_TYPES)}")
        arrays = [[value for w in owners for value in w.tables["attribution_jobs"][name]] for name in names]
        self._db.execute(_UPSERT_JOBS, arrays)

    def _replace(self, parent: str, owners: list[Write]) -> None:
        """Delete the rows of the keys of ``owners`` from every table they own rows in, then COPY their rows (jobs:
        :meth:`_upsert_jobs`)."""
        if parent == "attribution_jobs":
            self._upsert_jobs(owners)
            return
        columns = KEYS[parent]
        arrays = [[w.key[i] for w in owners] for i in range(len(columns))]
        unnest = ", ".join("%s::text[]" for _ in columns)
        for table in owners[0].tables:
            join = " AND ".join(f"{table}.{c} = k.{c}" for c in columns)
            self._db.execute(
                f"DELETE FROM {table} USING unnest({unnest}) AS k({', '.join(columns)}) WHERE {join}", arrays
            )
        with self._db.cursor() as cursor:
            for table in owners[0].tables:
                names = list(owners[0].tables[table])
                with cursor.copy(f"COPY {table} ({', '.join(names)}) FROM STDIN") as copy:
                    for write in owners:
                        part = write.tables[table]
                        for row in zip(*(part[c] for c in names), strict=True):
                            copy.write_row(row)

    def _release(self) -> None:
        with self._reader_lock:
            self._reader.close()
        self._db.close()


def _without_password(url: str) -> str:
    """``url`` for messages: a password in it is replaced by ``***``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
