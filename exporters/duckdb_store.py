"""The DuckDB store: an embedded file (default ``./reflect.duckdb``) of traces, steps, verdicts, attributions,
replays and LLM calls, with views for failure statistics. Implements ``reflect_otel.store.AttributionStore``.

One writer thread owns the connection. Each write deletes the rows of its key and inserts them again, so
re-writing the same trace or record changes nothing. Writes are batched by count and time (up to ``_BATCH``
writes, or what arrived within ``_LINGER_S`` of the first) and a batch is one transaction: per table, one DELETE
joined against an Arrow table of the batch's keys and one INSERT from an Arrow table of its rows, so no Python
loop runs per row inside DuckDB. A failing batch is retried one write at a time, so a bad write cannot take the
others down; a killed process leaves each record whole or absent (DuckDB's write-ahead log makes the file
readable again on open).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import duckdb
import pyarrow as pa
from pydantic import ValidationError

from reflect_otel.errors import InputError
from reflect_otel.record import AttributionRecord
from reflect_otel.store import AttributionJob, JobStatus
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = ["SCHEMA_VERSION", "VIEWS", "DuckDBStore", "connect_read_only"]

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
               count(*) FILTER (WHERE v.is_correct = false) AS failed,
               count(*) FILTER (WHERE v.is_correct = false OR v.label = 'HIGH_ERROR_SIGNAL') AS flagged,
               round(count(*) FILTER (WHERE v.is_correct = false) / count(*), 4) AS failure_rate,
               round(count(*) FILTER (WHERE v.is_correct = false OR v.label = 'HIGH_ERROR_SIGNAL') / count(*), 4)
                   AS flag_rate
        FROM traces t LEFT JOIN (SELECT trace_id, bool_and(is_correct) AS is_correct, max(label) AS label
                                 FROM verdicts GROUP BY trace_id) v USING (trace_id)
        GROUP BY ALL ORDER BY day DESC, agent""",
    "error_types": """
        SELECT coalesce(error_type, 'unknown') AS error_type, count(*) AS attributions,
               round(count(*) / sum(count(*)) OVER (), 4) AS share
        FROM attributions WHERE status <> 'skipped' GROUP BY ALL ORDER BY attributions DESC""",
    "decisive_step_position": """
        SELECT a.trace_id, a.method, a.step_index, t.step_count,
               round(a.step_index / nullif(t.step_count, 0), 4) AS relative_position
        FROM attributions a JOIN traces t USING (trace_id) WHERE a.step_index IS NOT NULL""",
    "verified_share": """
        SELECT method, count(*) AS attributions,
               count(*) FILTER (WHERE status = 'verified') AS verified,
               count(*) FILTER (WHERE status = 'unverified') AS unverified,
               round(count(*) FILTER (WHERE status = 'verified') / nullif(count(*) FILTER (WHERE status <> 'skipped'), 0), 4)
                   AS verified_share
        FROM attributions GROUP BY ALL ORDER BY method""",
    "flip_rate_by_offset": """
        SELECT localized_step - (rollback_point + 1) AS rollback_offset, count(*) AS replays,
               count(*) FILTER (WHERE flipped) AS flips, round(count(*) FILTER (WHERE flipped) / count(*), 4) AS flip_rate
        FROM replays WHERE error IS NULL AND localized_step IS NOT NULL GROUP BY ALL ORDER BY rollback_offset""",
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
        SELECT status, count(*) AS runs, sum(attempts) AS attempts, max(updated_at) AS last_change
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

_MIGRATIONS: list[str] = [_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3, _SCHEMA_V4]
SCHEMA_VERSION = len(_MIGRATIONS)


def _ts(ns: int | None) -> datetime | None:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC) if ns else None


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


def _agent_of(trace: StructuredTrace) -> str:
    if trace.agent:
        return trace.agent
    names = Counter(s.agent for s in trace.steps if s.agent)
    return names.most_common(1)[0][0] if names else trace.source.framework


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


@dataclass(slots=True)
class StoreStats:
    traces: int = 0
    verdicts: int = 0
    records: int = 0
    jobs: int = 0
    rejected: int = 0
    dropped: int = 0
    errors: int = 0


_COUNTERS = {"trace": "traces", "verdict": "verdicts", "record": "records", "job": "jobs"}
_MEMORY_LIMIT = "256MB"
"""DuckDB's own cache for the writer (its default is 80% of the machine's RAM, which a long-running collector
would fill with pages it never reads again); spills to disk beyond it."""
_BATCH = 2_000
_LINGER_S = 0.05
"""How long the writer waits for more writes after the first of a batch: long enough for a burst to share one
transaction, short enough that a single write is visible at once to the eye."""
_KEYS = {
    "traces": ("trace_id",),
    "steps": ("trace_id",),
    "verdicts": ("trace_id", "verifier"),
    "attributions": ("trace_id", "method"),
    "replays": ("trace_id", "method"),
    "llm_calls": ("trace_id", "method"),
    "attribution_jobs": ("trace_id",),
}


_PARENT = {"trace": "traces", "verdict": "verdicts", "record": "attributions", "job": "attribution_jobs"}
"""The table holding one row per key of each kind of write; its other tables hold rows only beside that row."""

Columns = dict[str, list[Any]]
_REPLAY_COLUMNS = (
    "trace_id", "method", "seq", "round", "rollback_point", "localized_step", "gate_retry", "sample", "faithful",
    "violation_type", "flipped", "final_answer", "error", "correction_source", "correction_kind", "replaced_step",
    "original_call", "replacement_call",
)  # fmt: skip
_CALL_COLUMNS = (
    "trace_id", "method", "seq", "stage", "model", "prompt_tokens", "cached_prompt_tokens", "completion_tokens",
    "seconds", "attempts", "ok",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Write:
    """The rows one trace, verdict or record owns, as columns by table; ``key`` identifies them (the same in every
    table)."""

    kind: str
    key: tuple[str, ...]
    tables: dict[str, Columns]


class DuckDBStore:
    """Opens (creating and migrating) the file at ``path``."""

    def __init__(self, path: str | Path, *, max_queue: int = 10_000) -> None:
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True)
        try:
            self._db = duckdb.connect(str(self.path), config={"memory_limit": _MEMORY_LIMIT})
        except duckdb.IOException as error:
            raise InputError(
                f"cannot open the store {self.path}: {str(error).splitlines()[0]} (is another reflect-otel "
                "process writing it?)"
            ) from None
        migrate(self._db)
        self._arrow_types = _arrow_types(self._db)
        self._monitor = self._db.cursor()  # a connection of its own: the writer thread owns ``_db``
        self._monitor_lock = threading.Lock()
        self.stats = StoreStats()
        self._queue: queue.Queue[_Write | threading.Event | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="reflect-otel-duckdb", daemon=True)
        self._thread.start()

    # -- writes (any thread) ---------------------------------------------------------------------------------
    def _enqueue(self, write: _Write) -> None:
        try:
            self._queue.put(write, timeout=5)
        except queue.Full:
            self.stats.dropped += 1
            _log.warning("the DuckDB store's queue is full; a %s was dropped", write.kind)

    def write_trace(self, trace: StructuredTrace) -> None:
        if not isinstance(trace, StructuredTrace):
            self.stats.rejected += 1
            return
        self._enqueue(_trace_rows(trace))

    def write_verdict(self, trace_id: str, verdict: Verdict) -> None:
        if not isinstance(verdict, Verdict) or not trace_id:
            self.stats.rejected += 1
            return
        self._enqueue(_verdict_rows(trace_id, verdict))

    def write_record(self, record: AttributionRecord) -> None:
        if not isinstance(record, AttributionRecord):
            self.stats.rejected += 1
            return
        self._enqueue(_record_rows(record))

    def write_job(self, job: AttributionJob) -> None:
        if not isinstance(job, AttributionJob) or not job.trace_id or job.status not in _JOB_STATUSES:
            self.stats.rejected += 1
            return
        self._enqueue(_job_rows(job))

    def pending_jobs(self, limit: int) -> list[AttributionJob]:
        self.flush()
        with self._monitor_lock:
            rows = self._monitor.execute(
                "SELECT trace_id, status, attempts, expected_answer, reason FROM attribution_jobs "
                "WHERE status IN ('pending', 'running') ORDER BY updated_at, trace_id LIMIT ?",
                [max(0, limit)],
            ).fetchall()
        return [AttributionJob(r[0], r[1], r[2] or 0, r[3], r[4]) for r in rows]

    def read_trace(self, trace_id: str) -> StructuredTrace | None:
        self.flush()
        with self._monitor_lock:
            row = self._monitor.execute("SELECT trace_json FROM traces WHERE trace_id = ?", [trace_id]).fetchone()
        if not row:
            return None
        try:
            return StructuredTrace.model_validate_json(row[0])
        except ValidationError as error:  # written by another version, or edited by hand
            _log.warning("trace %s in %s is not a valid trace: %s", trace_id, self.path, error)
            return None

    @property
    def backlog(self) -> int:
        """Writes queued and not yet taken by the writer thread (approximate, for progress and benchmarks)."""
        return self._queue.qsize()

    def memory_bytes(self) -> int:
        """Bytes DuckDB holds in memory for this store (its buffer pool, capped at ``_MEMORY_LIMIT``), for
        benchmarks and monitoring; 0 once closed."""
        with self._monitor_lock:
            try:
                row = self._monitor.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()
            except duckdb.Error:
                return 0
        return int(row[0] or 0) if row else 0

    def flush(self, timeout_s: float = 30.0) -> bool:
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self) -> None:
        if self._thread.is_alive():
            self.flush()
            self._queue.put(None)
            self._thread.join(timeout=30)
        with self._monitor_lock:
            self._monitor.close()
        self._db.close()

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the writer thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            deadline = time.monotonic() + _LINGER_S
            batch: list[_Write] = []
            stop = False
            waiters: list[threading.Event] = []
            while True:  # take what is queued (up to a batch) so one transaction carries many writes
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    waiters.append(item)
                else:
                    batch.append(item)
                if stop or waiters or len(batch) >= _BATCH:
                    break  # a flush waits for what is queued now, not for the linger
                remaining = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch and not self._apply(batch):
                for one in batch:  # a bad write rolled the batch back: apply one by one to keep the others
                    self._apply([one])
            for waiter in waiters:
                waiter.set()
            if stop:
                return

    def _apply(self, batch: list[_Write]) -> bool:
        """All of ``batch`` in one transaction (a few statements per table); False (rolled back, counted when alone)
        on failure."""
        latest: dict[tuple[str, tuple[str, ...]], _Write] = {}
        for write in batch:  # the same trace or record twice in a batch: the last one wins
            latest[(write.kind, write.key)] = write
        try:
            self._db.execute("BEGIN TRANSACTION")
            for kind, parent in _PARENT.items():
                owners = [w for w in latest.values() if w.kind == kind]
                if owners:
                    self._replace(parent, owners)
            self._db.execute("COMMIT")
        except Exception:
            with contextlib.suppress(duckdb.Error):  # nothing to roll back when BEGIN itself failed
                self._db.execute("ROLLBACK")
            if len(batch) == 1:
                self.stats.errors += 1
                _log.exception("writing a %s to %s failed; it was rolled back", batch[0].kind, self.path)
            return False
        for write in batch:
            counter = _COUNTERS[write.kind]
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        return True

    def _replace(self, parent: str, owners: list[_Write]) -> None:
        """Delete the rows of the keys of ``owners`` that are stored already (looked up in the parent table, one row
        per key; a fresh ingest deletes nothing), then insert every table's columns."""
        columns = _KEYS[parent]
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


def _as_columns(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Columns:
    return {name: [row[name] for row in rows] for name in names}


def _trace_rows(trace: StructuredTrace) -> _Write:
    parent = {
        "trace_id": trace.trace_id,
        "session_id": trace.session_id,
        "agent": _agent_of(trace),
        "framework": trace.source.framework,
        "collector": trace.source.collector,
        "question": trace.question,
        "final_answer": trace.final_answer,
        "step_count": len(trace.steps),
        "warning_count": len(trace.warnings),
        "start_time": _ts(trace.start_time_ns),
        "end_time": _ts(trace.end_time_ns),
        "ingested_at": datetime.now(UTC),
        "metadata": json.dumps(trace.metadata),
        "trace_json": trace.model_dump_json(),
    }
    steps = trace.steps
    columns: Columns = {
        "trace_id": [trace.trace_id] * len(steps),
        "step_index": [s.index for s in steps],
        "span_id": [s.span_id for s in steps],
        "tool_span_id": [s.tool_span_id for s in steps],
        "kind": [s.kind.value for s in steps],
        "agent": [s.agent for s in steps],
        "tool_name": [s.tool_name for s in steps],
        "tool_args": [json.dumps(s.tool_args, default=str) if s.tool_args else "{}" for s in steps],
        "tool_result": [s.tool_result for s in steps],
        "reasoning": [s.reasoning for s in steps],
        "is_final_answer": [s.is_final_answer for s in steps],
        "status": [s.status.value for s in steps],
        "prompt_tokens": [s.prompt_tokens for s in steps],
        "completion_tokens": [s.completion_tokens for s in steps],
        "model_name": [s.model_name for s in steps],
    }
    return _Write("trace", (trace.trace_id,), {"traces": _as_columns([parent], list(parent)), "steps": columns})


def _verdict_rows(trace_id: str, verdict: Verdict) -> _Write:
    row = {
        "trace_id": trace_id,
        "verifier": verdict.verifier,
        "is_correct": verdict.is_correct,
        "label": verdict.label,
        "score": verdict.score,
        "confidence": verdict.confidence,
        "extracted_answer": verdict.extracted_answer,
        "reasoning": verdict.reasoning,
        "created_at": datetime.now(UTC),
    }
    return _Write("verdict", (trace_id, verdict.verifier), {"verdicts": _as_columns([row], list(row))})


_JOB_STATUSES = frozenset(get_args(JobStatus))


def _job_rows(job: AttributionJob) -> _Write:
    row = {
        "trace_id": job.trace_id,
        "status": job.status,
        "attempts": job.attempts,
        "expected_answer": job.expected_answer,
        "reason": job.reason,
        "updated_at": datetime.now(UTC),
    }
    return _Write("job", (job.trace_id,), {"attribution_jobs": _as_columns([row], list(row))})


def _record_rows(record: AttributionRecord) -> _Write:
    key: dict[str, Any] = {"trace_id": record.trace_id, "method": record.method}
    verified_by = record.verified_by
    parent = key | {
        "status": record.status.value,
        "mode": record.mode.value,
        "step_index": record.step_index,
        "span_id": record.span_id,
        "error_type": record.error_type.value if record.error_type else None,
        "confidence": record.confidence,
        "explanation": record.explanation,
        "root_cause": record.root_cause,
        "rollback_point": record.intervention.rollback_point if record.intervention else None,
        "corrected_answer": record.corrected_answer,
        "rounds": record.rounds,
        "reason": record.reason,
        "llm_calls": record.total_calls,
        "tokens": record.total_tokens,
        "seconds": sum(c.seconds for c in record.cost),
        "created_at": record.created_at,
        "record_json": record.model_dump_json(),
        "verified_by_source": verified_by.source if verified_by else None,
        "verified_by_kind": verified_by.kind.value if verified_by else None,
    }
    replays = [
        key
        | {
            "seq": seq,
            "round": a.round,
            "rollback_point": a.rollback_point,
            "localized_step": a.localized_step,
            "gate_retry": a.gate_retry,
            "sample": a.sample,
            "faithful": a.gate.is_faithful if a.gate else None,
            "violation_type": a.gate.violation_type if a.gate else None,
            "flipped": a.flipped,
            "final_answer": a.final_answer,
            "error": a.error,
            "correction_source": a.correction.source if a.correction else None,
            "correction_kind": a.correction.kind.value if a.correction else None,
            "replaced_step": a.rollback_point + 1 if a.correction else None,
            "original_call": a.correction.original.render() if a.correction and a.correction.original else None,
            "replacement_call": a.correction.replacement.render()
            if a.correction and a.correction.replacement
            else None,
        }
        for seq, a in enumerate(record.replays)
    ]
    calls = [
        key
        | {
            "seq": seq,
            "stage": c.stage,
            "model": c.model,
            "prompt_tokens": c.prompt_tokens,
            "cached_prompt_tokens": c.cached_prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "seconds": c.seconds,
            "attempts": c.attempts,
            "ok": c.ok,
        }
        for seq, c in enumerate(record.llm_calls)
    ]
    return _Write(
        "record",
        (record.trace_id, record.method),
        {
            "attributions": _as_columns([parent], list(parent)),
            "replays": _as_columns(replays, _REPLAY_COLUMNS),
            "llm_calls": _as_columns(calls, _CALL_COLUMNS),
        },
    )


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
        raise InputError(
            f"cannot read the store {path}: {str(error).splitlines()[0]} (another process may be writing "
            "it; stop it or query a copy)"
        ) from None
