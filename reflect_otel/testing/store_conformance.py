"""The store conformance suite: what every :class:`~reflect_otel.store.AttributionStore` backend must do, written
once and run against each (like LangGraph's checkpointer conformance): the in-memory reference store first, then
DuckDB, then PostgreSQL. A backend is given as a ``StoreUnderTest``: a fresh store and, for a SQL backend, a way to
run a read query on what it wrote."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from reflect_otel.record import AttributionRecord, AttributionStatus
from reflect_otel.store import AttributionJob, AttributionStore
from reflect_otel.testing import make_trace
from reflect_otel.testing.examples import five_step_trace, verified_attribution
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = ["Schema", "StoreUnderTest", "normalised", "sample_writes", "schema", "view_rows", "write_sample"]

Query = Callable[[str], list[tuple[Any, ...]]]


@dataclass
class StoreUnderTest:
    """``store``: a fresh store; ``query(sql)``: rows of a read on it (after ``store.force_flush()``), None for a
    store without SQL (the in-memory one)."""

    store: AttributionStore
    query: Query | None = None


@functools.cache
def sample_writes() -> tuple[
    list[StructuredTrace], list[tuple[str, Verdict]], list[AttributionRecord], list[AttributionJob]
]:
    """Traces, verdicts, records and jobs touching every table and view: a verified REFLECT record with replays
    and LLM calls, unverified baseline records (with a type, without one, without a step), a skipped one, a right
    run, a run never judged, and jobs in every status. Made
    once (the records' timings are measured), so every backend is given the same values."""
    trace, verified = verified_attribution()
    other = make_trace(
        "Which river is longest?",
        [
            {"tool": "search", "args": {"q": "rivers"}, "result": "Nile, Amazon"},
            {"reasoning": "Amazon", "is_final_answer": True},
        ],
        final_answer="Amazon",
    ).model_copy(update={"trace_id": "b" * 32, "agent": "rivers"})
    right = five_step_trace().model_copy(update={"trace_id": "c" * 32, "final_answer": "42"})
    unverified = verified.model_copy(update={"method": "aao", "status": AttributionStatus.UNVERIFIED, "replays": ()})
    skipped = verified.model_copy(
        update={"trace_id": other.trace_id, "status": AttributionStatus.SKIPPED, "step_index": None, "replays": ()}
    )
    # baselines' records: one that named no step (its own error_types category), one with a step but no type
    no_step = unverified.model_copy(
        update={"trace_id": other.trace_id, "method": "evidence", "step_index": None, "error_type": None}
    )
    untyped = unverified.model_copy(update={"trace_id": other.trace_id, "method": "last-step", "error_type": None})
    unjudged = other.model_copy(update={"trace_id": "a1" * 16})  # no verdict: not in failure_rate
    wrong = Verdict(verifier="oracle", is_correct=False, confidence=1.0, label="wrong", reasoning="41 != 42")
    verdicts = [
        (trace.trace_id, wrong),
        (other.trace_id, wrong.model_copy(update={"label": "HIGH_ERROR_SIGNAL"})),
        (right.trace_id, Verdict(verifier="oracle", is_correct=True, confidence=1.0, label="right", reasoning="")),
    ]
    jobs = [
        AttributionJob(trace.trace_id, "done", 1, "42"),
        AttributionJob(other.trace_id, "pending", 0, "Nile"),
        AttributionJob(right.trace_id, "running", 2, None),
        AttributionJob("d" * 32, "failed", 3, None, "the trace is not in the store"),
    ]
    return [trace, other, right, unjudged], verdicts, [verified, unverified, skipped, no_step, untyped], jobs


def write_sample(store: AttributionStore, *, twice: bool = True) -> None:
    """Write :func:`sample_writes` (``twice``: all of it again, which must change nothing) and flush."""
    traces, verdicts, records, jobs = sample_writes()
    for _ in range(2 if twice else 1):
        for trace in traces:
            store.write_trace(trace)
        for trace_id, verdict in verdicts:
            store.write_verdict(trace_id, verdict)
        for record in records:
            store.write_record(record)
        for job in jobs:
            store.write_job(job)
    assert store.force_flush(60_000), "the store did not finish writing within 60 s"


def normalised(value: Any) -> Any:
    """A value as both backends can agree on it: numbers as floats to 4 places, dates as ISO text; times of
    writing (which differ between runs) as None."""
    if isinstance(value, datetime):
        return None
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal | float):
        number = float(value)
        return None if math.isnan(number) else round(number, 4)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return float(value)
    return str(value)


def view_rows(query: Query, view: str, order: Sequence[str] = ()) -> list[tuple[Any, ...]]:
    """Every row of ``view``, normalised, in a stable order."""
    rows = [tuple(normalised(v) for v in row) for row in query(f"SELECT * FROM {view}")]
    return sorted(rows, key=lambda row: tuple((v is None, str(v)) for v in row))


Schema = dict[str, tuple[tuple[str, str], ...]]
"""Each table's and view's columns in order, as (name, type family); a view's columns carry no type (its
aggregates' types are each engine's own: a count is BIGINT, a sum HUGEINT in DuckDB and NUMERIC in PostgreSQL)."""

_FAMILIES = {
    "varchar": "text",
    "text": "text",
    "character varying": "text",
    "json": "json",
    "jsonb": "json",
    "integer": "integer",
    "double": "double",
    "double precision": "double",
    "boolean": "boolean",
    "timestamp with time zone": "timestamptz",
}
"""Column types as each backend names them (DuckDB's and PostgreSQL's ``information_schema``), by what they hold."""


def schema(query: Query) -> Schema:
    """The store's tables and views as :data:`Schema` (from ``information_schema``, which both engines have); a
    table column of a type neither backend should use is named as such, so that a comparison fails on it."""
    tables = {name for (name,) in query(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
    )}  # fmt: skip
    rows = query(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
    )
    found: dict[str, list[tuple[str, str]]] = {}
    for relation, column, data_type in rows:
        family = _FAMILIES.get(str(data_type).lower(), f"unexpected {data_type}") if relation in tables else ""
        found.setdefault(relation, []).append((column, family))
    return {relation: tuple(columns) for relation, columns in found.items()}
