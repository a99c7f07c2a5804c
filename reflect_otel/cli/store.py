"""The ``sql`` and ``stats`` subcommands over the DuckDB store (registered by entry point)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb

from reflect_otel.cli._options import paragraph
from reflect_otel.errors import InputError
from reflect_otel.exporters.duckdb_store import connect_read_only
from reflect_otel.reading._files import check_output_file, write_text_atomically
from reflect_otel.settings import settings
from reflect_otel.store import check_store_target, store_kind, store_target

__all__ = ["add_report_command", "add_sql_command", "add_stats_command"]

STATS_VIEWS = (
    "failure_stats", "error_types", "verified_share", "verified_claims", "replay_fidelity", "replay_sensitivity",
    "flip_rate_by_offset", "cost_per_stage", "attribution_queue",
)  # fmt: skip


def _store_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help="DuckDB file (default: REFLECT_STORE, then ./reflect.duckdb)")


_SQL_DESCRIPTION = paragraph(
    """
Query the store with DuckDB SQL. Tables: traces, steps, verdicts, attributions, replays, llm_calls. Views:
failure_stats, error_types, decisive_step_position, verified_share, verified_claims, replay_fidelity,
replay_sensitivity, flip_rate_by_offset, cost_per_trace, cost_per_stage, failure_patterns.
"""
)
"""What ``reflect-otel sql --help`` says the command does."""


def add_sql_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("sql", help="run a read-only SQL query on the store", description=_SQL_DESCRIPTION)
    parser.add_argument("query", help='e.g. "SELECT * FROM error_types"')
    parser.add_argument("--json", action="store_true", help="print a JSON list of row objects")
    parser.add_argument("--max-rows", type=int, default=1000, help="print at most this many rows (default 1000)")
    _store_argument(parser)
    parser.set_defaults(handler=_reading(_sql))


def add_stats_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "stats", help="print the headline statistics of the store", description="Print the store's headline views."
    )
    parser.add_argument(
        "--threshold",
        type=float,
        help="the flagging score at which runs count as flagged (default: REFLECT_FLAG_THRESHOLD)",
    )
    parser.add_argument(
        "--patterns",
        action="store_true",
        help="print the failure patterns across runs instead (the failure_patterns view): attributions grouped by "
        "the localized step's kind, tool and argument names, the error type and the evidence rule, with counts, the "
        "share verified, first and last seen and an example trace",
    )
    parser.add_argument(
        "--min-runs",
        type=int,
        default=2,
        help="with --patterns: print the patterns of at least this many attributions (default 2: recurring ones)",
    )
    parser.add_argument("--method", help="with --patterns: only this method's attributions (default: every method)")
    _store_argument(parser)
    parser.set_defaults(handler=_reading(_stats))


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    return value


def connect_store_read_only(explicit: str | None) -> Any:
    """A read-only connection to the store ``--store`` names (a DuckDB file, or a PostgreSQL URL), checked first."""
    target = check_store_target(explicit, reading=True)
    if store_kind(target) == "postgresql":
        from reflect_otel.exporters.postgres_store import connect_read_only_postgres

        return connect_read_only_postgres(target)
    return connect_read_only(target)


def _reading(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``handler``, for which a store file that cannot be read whole (cut short by a full disk or a copy that
    stopped) is one line naming the fix, not an internal error."""

    def guarded(args: argparse.Namespace) -> int:
        with _damaged(store_target(args.store)):
            return handler(args)

    return guarded


@contextlib.contextmanager
def _damaged(target: str) -> Iterator[None]:
    try:
        yield
    except duckdb.IOException as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise InputError(
            f"the store {target} is damaged ({first}); it may have been cut short: restore it from a copy, or build "
            "a new one from your traces file with 'reflect-otel collect --reingest TRACES.jsonl --store NEW.duckdb'"
        ) from None


def _query(db: Any, query: str, max_rows: int) -> tuple[list[str], list[tuple[Any, ...]], bool]:
    try:
        cursor = db.execute(query)
    except Exception as error:  # the backend's error for a bad query (DuckDB's or psycopg's)
        if isinstance(error, duckdb.IOException) or not _is_query_error(error):
            raise
        raise InputError(f"query failed: {str(error).splitlines()[0] if str(error) else error!r}") from None
    if cursor.description is None:
        return [], [], False
    columns = [d[0] for d in cursor.description]
    rows = cursor.fetchmany(max_rows + 1)
    return columns, rows[:max_rows], len(rows) > max_rows


def _rows(db: Any, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """``sql`` with ``?`` placeholders on either backend (psycopg writes them ``%s``)."""
    if not isinstance(db, duckdb.DuckDBPyConnection):
        sql = sql.replace("?", "%s")
    return list(db.execute(sql, params).fetchall())


def stored_model(model: Any, value: Any) -> Any:
    """A stored JSON column as ``model``: text from DuckDB, already decoded from PostgreSQL's JSONB."""
    return model.model_validate_json(value) if isinstance(value, str | bytes) else model.model_validate(value)


def find_stored_trace(db: Any, prefix: str, *, noun: str, where: str = "") -> tuple[Any, Any]:
    """The one stored trace whose id starts with ``prefix``: its id and its stored JSON. None or several fail, naming
    it a ``noun`` ("trace", "run") and the store ``where`` when given."""
    found = _rows(db, "SELECT trace_id, trace_json FROM traces WHERE starts_with(trace_id, ?)", [prefix])
    if len(found) != 1:
        raise InputError(
            f"{len(found)} {noun}s match {prefix!r}; give a longer prefix"
            if found
            else f"no {noun} {prefix!r} in the store" + (f" {where}" if where else "")
        )
    trace_id, trace_json = found[0]
    return trace_id, trace_json


def stored_expected_answer(db: Any, trace_id: str) -> Any:
    """The expected answer stored with the run's attribution job, or None."""
    jobs = _rows(db, "SELECT expected_answer FROM attribution_jobs WHERE trace_id = ?", [trace_id])
    return jobs[0][0] if jobs and jobs[0][0] is not None else None


def _is_query_error(error: Exception) -> bool:
    if isinstance(error, duckdb.Error):
        return True
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(error, psycopg.Error)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], width: int = 60) -> str:
    def cell(value: Any) -> str:
        text = "" if value is None else " ".join(str(_plain(value)).split())
        return text if len(text) <= width else text[: width - 1] + "…"

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _sql(args: argparse.Namespace) -> int:
    db = connect_store_read_only(args.store)
    try:
        columns, rows, cut = _query(db, args.query, max(1, args.max_rows))
    finally:
        db.close()
    if args.json:
        print(json.dumps([{c: _plain(v) for c, v in zip(columns, row, strict=True)} for row in rows], default=str))
    elif columns:
        print(format_table(columns, rows))
        print(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{', cut at --max-rows' if cut else ''})")
    if cut:
        print(f"more rows than --max-rows={args.max_rows}; the rest were not printed", file=sys.stderr)
    return 0


def _count(db: Any, table: str) -> int:
    row = db.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


# the value of the latest verdict that carried a measured precision (SQL that DuckDB and PostgreSQL both read)
_LATEST_MEASURED = (
    "(array_agg({column} ORDER BY created_at DESC NULLS LAST, trace_id) FILTER (WHERE confidence IS NOT NULL))[1]"
)
_MEASURED_COLUMNS = ("confidence", "confidence_low", "confidence_high", "confidence_runs")


def _backlog(db: Any) -> str:
    """The attribution backlog: runs waiting and being attributed, and how long the oldest has waited (its job's
    last change: when it was queued, or when its last attempt started)."""
    row = db.execute(
        "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'running'), "
        "min(updated_at) FILTER (WHERE status = 'pending'), min(updated_at) FILTER (WHERE status = 'running') "
        "FROM attribution_jobs"
    ).fetchone()
    waiting, running, oldest_waiting, oldest_running = row if row else (0, 0, None, None)
    oldest = min((t for t in (oldest_waiting, oldest_running) if t is not None), default=None)
    age = ""
    if isinstance(oldest, datetime):
        since = oldest if oldest.tzinfo is not None else oldest.replace(tzinfo=UTC)
        age = f"; the oldest has waited {_duration((datetime.now(UTC) - since).total_seconds())}"
    return f"attribution backlog: {waiting} run(s) waiting, {running} being attributed{age}"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7_200:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3_600} h {seconds % 3_600 // 60} min"


def _stats(args: argparse.Namespace) -> int:
    if args.patterns:
        return _patterns(args)
    path = store_target(args.store)
    db = connect_store_read_only(args.store)
    try:
        _say_counts(db, path)
        _say_verdict_bases(db)
        _flagged_shares(db, args.threshold if args.threshold is not None else settings().flag_threshold)
        _say_replays(db)
        for view in STATS_VIEWS:
            columns, rows, _ = _query(db, f"SELECT * FROM {view} LIMIT 20", 20)
            print(f"\n{view}")
            print(format_table(columns, rows) if rows else "(no rows yet)")
    finally:
        db.close()
    return 0


def _say_counts(db: Any, path: str) -> None:
    """What the store holds, its attribution backlog, and how many of its traces were never judged."""
    counts = {t: _count(db, t) for t in ("traces", "verdicts", "attributions")}
    row = db.execute("SELECT count(*) FROM attribution_jobs WHERE status IN ('pending', 'running')").fetchone()
    pending = row[0] if row else 0
    print(
        f"store {path}: {counts['traces']} traces, {counts['verdicts']} verdicts, {counts['attributions']} "
        f"attributions, {pending} run(s) pending attribution"
        + (" ('attribute --pending' takes them)" if pending else "")
    )
    if pending:
        print(_backlog(db))
    row = db.execute(
        "SELECT count(*) FROM traces WHERE trace_id NOT IN (SELECT trace_id FROM verdicts WHERE is_correct IS NOT NULL)"
    ).fetchone()
    unjudged = int(row[0]) if row else 0
    if unjudged:
        print(
            f"{unjudged} of {counts['traces']} trace(s) were never judged right or wrong (no expected answer, or a "
            "verifier that could not tell): failure_rate counts judged runs only, and is empty where none was"
        )


def _say_verdict_bases(db: Any) -> None:
    """Per verifier and basis (the proxy's audits and the combined verifier's are measured apart), the precision its
    latest measured verdict carried, with the interval and count it was measured with."""
    _, bases, _ = _query(
        db,
        "SELECT verifier, basis, count(*), count(*) FILTER (WHERE is_correct = false), "
        + ", ".join(_LATEST_MEASURED.format(column=c) for c in _MEASURED_COLUMNS)
        + ", sum(resamples) FROM verdicts WHERE basis IS NOT NULL GROUP BY verifier, basis ORDER BY 3 DESC, 1, 2",
        20,
    )
    for verifier, basis, runs, flagged, precision, low, high, measured_on, resamples in bases:
        interval = f", 95% [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
        shown = (
            f"precision {precision:.2f}{interval} measured on {measured_on} labelled runs"
            if precision is not None
            else "precision not measured"
        )
        extra = f", {resamples} agent resamples" if resamples else ""
        print(f"{verifier} verdicts on {basis}: {runs} ({flagged} flagged; {shown}{extra})")


def _say_replays(db: Any) -> None:
    """How often each agent's control replays reproduce its runs, and how often a change of text alone flips them."""
    _, fidelity, _ = _query(db, "SELECT service, agent, controls, reproduced FROM replay_fidelity LIMIT 20", 20)
    for service, agent, controls, reproduced in fidelity:
        print(
            f"replays of {_who(service, agent)} reproduce its runs {reproduced} of {controls} times (control replays)"
        )
    _, sensitivity, _ = _query(db, "SELECT service, agent, points, sensitive FROM replay_sensitivity LIMIT 20", 20)
    for service, agent, points, sensitive in sensitivity:
        print(
            f"{_who(service, agent)}: {sensitive} of {points} tested points flip on a change of text alone (sensitivity "
            "arms; no flip there is credited)"
        )


def _who(service: Any, agent: Any) -> str:
    return " / ".join(str(v) for v in (service, agent) if v) or "agents without a service name"


_PATTERN_COLUMNS = (
    "method", "agent", "step", "tool", "arguments", "error_type", "evidence_rule", "runs", "verified",
    "verified_share", "first_seen", "last_seen", "example_trace",
)  # fmt: skip


def _patterns(args: argparse.Namespace) -> int:
    """The failure_patterns view, run from its SQL (so a store written before the view existed answers too)."""
    if args.min_runs < 1:
        raise InputError(f"--min-runs {args.min_runs}: a pattern is seen in at least 1 run")
    db = connect_store_read_only(args.store)
    try:
        if isinstance(db, duckdb.DuckDBPyConnection):
            from reflect_otel.exporters.duckdb_schema import VIEWS
        else:
            from reflect_otel.exporters.postgres_schema import VIEWS
        rows = _rows(db, f"SELECT * FROM ({VIEWS['failure_patterns']}) p", [])
    finally:
        db.close()
    located = [r for r in rows if args.method in (None, r[0])]
    shown = [r for r in located if r[7] >= args.min_runs]
    total = sum(r[7] for r in located)
    which = f"of {args.method} " if args.method else ""
    print(
        f"{len(shown)} failure pattern(s) seen in at least {args.min_runs} attribution(s), of {len(located)} "
        f"pattern(s) among the {total} attribution(s) {which}that localized a step"
    )
    if not shown:
        if not located:
            print("(no attribution localized a step yet)")
        return 0
    print(format_table(_PATTERN_COLUMNS, [_pattern_cells(r) for r in shown]))
    return 0


def _pattern_cells(row: Sequence[Any]) -> tuple[Any, ...]:
    *what, runs, verified, share, first, last, example = row
    return (*what, runs, verified, f"{share:.0%}", _minute(first), _minute(last), example)


def _minute(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%MZ")
    return value


def _flagged_shares(db: Any, threshold: float) -> None:
    """Per verifier, the share of its scored verdicts whose score reaches ``threshold``: what that threshold would
    flag (and so send to attribution) of the runs it scored."""
    if not 0.0 <= threshold <= 1.0:
        raise InputError(f"--threshold {threshold:g}: a flagging score lies in [0, 1]")
    rows = _rows(
        db,
        "SELECT verifier, count(*), count(*) FILTER (WHERE score >= ?) FROM verdicts WHERE score IS NOT NULL "
        "GROUP BY verifier ORDER BY 2 DESC, 1 LIMIT 20",
        [threshold],
    )
    for verifier, scored, flagged in rows:
        print(
            f"{verifier}: {flagged} of {scored} scored runs ({flagged / scored:.0%}) reach the flagging threshold "
            f"{threshold:g}"
        )


def add_report_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report of one trace's attribution",
        description="Render the trace (timeline, decisive step, correction, original vs corrected continuation, "
        "cost) from the store as one HTML file with no external assets.",
    )
    parser.add_argument("trace_id", help="the trace's id (a unique prefix is enough)")
    parser.add_argument(
        "-o",
        "--out",
        required=True,
        help="HTML file to write; replaced only when the page is whole, else left as it was",
    )
    parser.add_argument(
        "--method",
        help="which attribution, when several methods attributed the trace (default: the latest, named on the "
        "screen); a method with no record of the trace is refused",
    )
    _store_argument(parser)
    parser.set_defaults(handler=_reading(_report))


def _report(args: argparse.Namespace) -> int:
    from reflect_otel.exporters.report import render_report
    from reflect_otel.record import AttributionRecord
    from reflect_otel.trace import StructuredTrace
    from reflect_otel.verdict import Verdict

    out = check_output_file(Path(args.out), flag="-o", example="report.html")
    db = connect_store_read_only(args.store)
    try:
        trace_id, trace_json = find_stored_trace(db, args.trace_id, noun="trace")
        records = _rows(
            db,
            "SELECT method, record_json FROM attributions WHERE trace_id = ? ORDER BY created_at DESC",
            [trace_id],
        )
        verdicts = _rows(
            db,
            "SELECT verifier, is_correct, extracted_answer, reasoning FROM verdicts WHERE trace_id = ? "
            "ORDER BY created_at DESC",
            [trace_id],
        )
        expected = stored_expected_answer(db, trace_id)
    finally:
        db.close()
    methods = list(dict.fromkeys(method for method, _ in records))  # newest first
    if args.method is not None and args.method not in methods:
        has = f"its records are of {', '.join(methods)}" if methods else "it has no attribution yet"
        raise InputError(
            f"trace {trace_id} has no record of --method {args.method}; {has} (drop --method, or attribute it with "
            f"'reflect-otel attribute TRACES.jsonl --method {args.method} -o records.jsonl --store ...')"
        )
    shown = [json for method, json in records if args.method in (None, method)]
    trace = stored_model(StructuredTrace, trace_json)
    record = stored_model(AttributionRecord, shown[0]) if shown else None
    verdict = None
    if verdicts:
        verifier, is_correct, extracted, reasoning = verdicts[0]
        verdict = Verdict(
            verifier=verifier, is_correct=is_correct, extracted_answer=extracted, reasoning=reasoning or ""
        )
    write_text_atomically(out, render_report(trace, record, verdict=verdict, expected=expected), flag="-o")
    if record is None:
        print(f"wrote {out}: trace {trace_id}, which has no attribution yet", file=sys.stderr)
    else:
        others = [m for m in methods if m != record.method]
        print(
            f"wrote {out}: the {record.method} record of trace {trace_id} ({record.status.value})"
            + (f"; it also has records of {', '.join(others)} (--method picks one)" if others else ""),
            file=sys.stderr,
        )
    return 0
