"""The store contract: where traces, verdicts and attribution records are kept for SQL, dashboards and reports.

Backends are chosen by name (entry-point group ``reflect_otel.stores``; see :mod:`reflect_otel.plugins`): the
built-in ones are DuckDB (``reflect_otel.exporters.duckdb_store``) and PostgreSQL (``postgres_store``), each with its
DDL and views in its own dialect; :func:`store_kind` is the one place that says which of them a target names.
Record exporters likewise (group ``reflect_otel.record_exporters``): ``otlp`` and ``phoenix``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from reflect_otel import plugins
from reflect_otel.errors import ConfigError
from reflect_otel.record import AttributionRecord
from reflect_otel.settings import settings
from reflect_otel.store._export import RecordExporter
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

# the public names are listed once, in the package's __init__

DEFAULT_STORE = "reflect.duckdb"


JobStatus = Literal["pending", "running", "done", "failed"]


@dataclass(frozen=True, slots=True)
class AttributionJob:
    """A stored run waiting for (or given) attribution: the collector's work list, kept in the store so that a run
    acknowledged to its sender is never lost when attribution falls behind or the process stops."""

    trace_id: str
    status: JobStatus
    attempts: int = 0
    """Attributions started (a job found ``running`` was cut short by a stop, and is taken again)."""
    expected_answer: str | None = None
    reason: str | None = None
    """Why it failed, or was done without an attribution."""


@dataclass(slots=True)
class StoreStats:
    """What a store counts: writes applied by kind, invalid ones rejected, writes dropped on a full queue, rolled
    back (``errors``), and given up at close because the store could not be reached (``unstored``: a collector's
    ``--out`` file has their traces, and ``collect --reingest`` stores them)."""

    traces: int = 0
    verdicts: int = 0
    records: int = 0
    jobs: int = 0
    rejected: int = 0
    dropped: int = 0
    errors: int = 0
    unstored: int = 0


JOB_RANK: dict[str, int] = {"pending": 0, "running": 1, "done": 2, "failed": 2}
"""How far each status carries a job: pending before running before done or failed."""


def moves_on(status: str, attempts: int, stored: tuple[str, int] | None) -> bool:
    """Whether a job write of ``status`` and ``attempts`` may replace the stored (status, attempts): when its
    (attempts, rank) is not below the stored one's, so a write that arrives late (a worker that lost the database
    while its writes waited, a collector offering a run again) changes nothing another worker carried further; an
    equal state is replaced (the last write wins)."""
    if stored is None:
        return True
    return (attempts or 0, JOB_RANK[status]) >= (stored[1] or 0, JOB_RANK.get(stored[0], 0))


class AttributionStore(Protocol):
    """Writes are queued and applied by one writer: they return at once and never raise for content; each is an
    idempotent upsert (writing the same trace or record again changes nothing) applied in one transaction, so a
    killed process leaves no half-written record. Invalid input is rejected and counted. The lifecycle is the
    OpenTelemetry SDK's: ``force_flush(timeout_millis)`` waits until everything queued is written (True when done
    within the time); ``shutdown`` flushes and releases the file or connection.

    Jobs (:class:`AttributionJob`) are written like the rest; ``pending_jobs`` lists the ones still to do
    (``pending``, or ``running`` when a stop cut them short), oldest first, after what was queued is written;
    ``read_job`` and ``read_trace`` give a stored job and trace back."""

    def write_trace(self, trace: StructuredTrace) -> None: ...

    def write_verdict(self, trace_id: str, verdict: Verdict) -> None: ...

    def write_record(self, record: AttributionRecord) -> None: ...

    def write_job(self, job: AttributionJob) -> None: ...

    def pending_jobs(self, limit: int) -> list[AttributionJob]: ...

    def read_job(self, trace_id: str) -> AttributionJob | None: ...

    def read_trace(self, trace_id: str) -> StructuredTrace | None: ...

    def force_flush(self, timeout_millis: int = 30_000) -> bool: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class ReadsRecords(Protocol):
    """A store that gives its latest records back (the built-in ones do; an optional part of the contract): a
    placebo control started on it draws on the plans written before it started."""

    def recent_records(self, limit: int, *, excluding: str = "") -> list[tuple[str, AttributionRecord]]:
        """The question and record of the latest ``limit`` stored records that name a root cause and whose trace is
        stored, those of the method ``excluding`` left out, newest first; a stored record that no longer validates
        is skipped with a warning."""
        ...


def store_target(explicit: str | os.PathLike[str] | None = None) -> str:
    """``--store``, else ``REFLECT_STORE``, else ``./reflect.duckdb``: a DuckDB file, or a ``postgresql://`` URL."""
    return str(explicit or settings().store or DEFAULT_STORE)


def store_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The DuckDB file :func:`store_target` names."""
    return Path(store_target(explicit))


def store_kind(target: str) -> str:
    """The backend a store target names: ``postgresql`` for a ``postgresql://`` (or ``postgres://``) URL, else
    ``duckdb`` (a file). Every command and :func:`open_store` ask this, and nothing else tells them apart."""
    return "postgresql" if target.startswith(("postgresql://", "postgres://")) else "duckdb"


_DUCKDB_MAGIC = b"DUCK"
"""Bytes 8 to 12 of every DuckDB database file."""


def check_store_target(explicit: str | os.PathLike[str] | None = None, *, reading: bool = False) -> str:
    """The store :func:`store_target` names, when it can be one: a ``postgresql://`` URL, an existing DuckDB file,
    or (unless ``reading``) a new path where a file can be created. Anything else raises :class:`ConfigError`
    naming the setting it came from (``--store``, ``REFLECT_STORE``) and the fix, before any work starts: a
    folder, a JSONL or other file that is not a DuckDB database, another URL scheme, a file that cannot be read."""
    target = store_target(explicit)
    named = (
        f"--store {target}" if explicit else f"REFLECT_STORE={target}" if settings().store else f"the store {target}"
    )
    if store_kind(target) == "postgresql":
        return target
    scheme, separator, _ = target.partition("://")
    if separator and scheme.isalpha():
        raise ConfigError(f"{named}: a store is a DuckDB file or a postgresql:// URL; {scheme}:// is neither")
    path = Path(target)
    example = path / DEFAULT_STORE
    if path.is_dir():
        raise ConfigError(f"{named}: is a folder; name a DuckDB file in it, e.g. --store {example}")
    if path.exists():
        return _check_duckdb_file(path, named)
    if path.suffix.lower() in _OTHER_FORMATS:
        raise ConfigError(
            f"{named}: a new store is a DuckDB file, and {path.suffix} names another format "
            f"({_OTHER_FORMATS[path.suffix.lower()]}); name it e.g. --store {path.with_suffix('.duckdb')}"
        )
    if reading:
        raise ConfigError(
            f"{named}: no store there; write one with 'reflect-otel attribute TRACES.jsonl -o records.jsonl "
            f"--store {path}' (or 'collect'), or name the store with --store / REFLECT_STORE"
        )
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{named}: {parent} is a file, not a folder; name a DuckDB file in a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{named}: cannot create the store in {parent} (permission denied); choose another folder")
    return target


_OTHER_FORMATS = {
    ".json": "JSON",
    ".jsonl": "JSON Lines",
    ".ndjson": "JSON Lines",
    ".csv": "CSV",
    ".tsv": "TSV",
    ".txt": "text",
    ".html": "HTML",
    ".parquet": "Parquet",
    ".sqlite": "SQLite",
    ".sqlite3": "SQLite",
}
"""Suffixes a new store's name may not have: the store would be a DuckDB file under a name that says otherwise."""


def _check_duckdb_file(path: Path, named: str) -> str:
    if not path.is_file():
        raise ConfigError(f"{named}: is not a regular file; name a DuckDB file or a new path")
    try:
        with path.open("rb") as file:
            head = file.read(16)
    except OSError as error:
        raise ConfigError(f"{named}: cannot read it ({error.strerror}); fix its permissions or name another") from None
    if head[8:12] == _DUCKDB_MAGIC:
        return str(path)
    if not head:
        what = "an empty file"
    elif head.lstrip()[:1] in (b"{", b"["):
        what = "a JSON or JSONL file (traces or records?)"
    else:
        what = "a file that is not a DuckDB database"
    raise ConfigError(
        f"{named}: is {what}, not a store; the store is a DuckDB file of its own: name a new path (e.g. "
        f"--store {DEFAULT_STORE}) or an existing store. Nothing was written to {path}"
    )


def open_store(path: str | os.PathLike[str] | None = None, *, kind: str | None = None) -> AttributionStore:
    """The store at :func:`store_target` (``path``), of ``kind`` (by default, the backend the target names),
    checked first (:func:`check_store_target`)."""
    target = check_store_target(path) if kind is None else store_target(path)
    chosen = kind or store_kind(target)
    store: AttributionStore = plugins.load(plugins.STORES, chosen)(Path(target) if chosen == "duckdb" else target)
    return store


def open_exporter(name: str) -> RecordExporter:
    """The record exporter registered as ``name`` (entry-point group ``reflect_otel.record_exporters``)."""
    exporter: RecordExporter = plugins.load(plugins.RECORD_EXPORTERS, name)()
    return exporter
