"""Seconds measured alone: which method runs of a wtq-live measurement overlapped a contention window (anything else
run on the machine meanwhile), read from the folder's ``contention.tsv``, and each method's seconds over the runs
that did not.

``contention.tsv``: one window per line, ``START<TAB>END<TAB>what ran``, times in ISO 8601 UTC
(``2026-11-27T00:21Z``); ``#`` starts a comment. A method run spans ``[created_at - seconds, created_at]`` of its
record (the record is made when the method ends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from reflect_otel.evaluation.metrics import mean_se

FILE = "contention.tsv"


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    what: str


def _time(text: str, where: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"{where}: {text!r} is not an ISO 8601 time (write e.g. 2026-11-27T00:21Z)") from None
    if moment.tzinfo is None:
        raise SystemExit(f"{where}: {text!r} has no time zone; write UTC with a Z (2026-11-27T00:21Z)")
    return moment.astimezone(UTC)


def read_windows(path: Path) -> list[Window]:
    """The windows of ``path``; a line that is not ``START<TAB>END<TAB>what`` with START <= END is refused, naming
    the line."""
    windows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"{path}:{number}"
        fields = text.split("\t")
        if len(fields) < 2:
            raise SystemExit(f"{where}: expected START<TAB>END<TAB>what ran, got {line[:80]!r}")
        start, end = _time(fields[0], where), _time(fields[1], where)
        if end < start:
            raise SystemExit(f"{where}: the window ends before it starts")
        windows.append(Window(start, end, fields[2].strip() if len(fields) > 2 else ""))
    return windows


def span_of(method: dict[str, Any]) -> tuple[datetime, datetime] | None:
    """When a method run ran, from its record (None: the row keeps no record time)."""
    created = (method.get("record") or {}).get("created_at")
    if not created:
        return None
    end = _time(str(created), "a record's created_at")
    return end - timedelta(seconds=float(method.get("seconds", 0.0))), end


def contended(method: dict[str, Any], windows: Sequence[Window]) -> bool | None:
    """Whether the run overlapped a window (None: not known, no record time)."""
    span = span_of(method)
    if span is None:
        return None
    return any(w.start < span[1] and span[0] < w.end for w in windows)


def seconds_alone(rows: Sequence[dict[str, Any]], methods: Sequence[str], windows: Sequence[Window]) -> str:
    """Per method, its mean seconds (± standard error) over the failed runs it attributed outside every window,
    and how many were left out as contended or of unknown time."""
    lines = []
    for name in methods:
        runs = [r["methods"][name] for r in rows if not r["correct"] and name in r["methods"]]
        marks = [contended(m, windows) for m in runs]
        alone = [float(m["seconds"]) for m, mark in zip(runs, marks, strict=True) if mark is False]
        stat = mean_se(alone)
        shown = f"{stat['mean']:.0f} ± {stat['se']:.0f} s" if alone else "-"
        unknown = sum(1 for mark in marks if mark is None)
        lines.append(
            f"- {name}: {shown} over {len(alone)} runs measured alone ({sum(1 for mark in marks if mark)} contended"
            + (f", {unknown} of unknown time" if unknown else "")
            + ", left out)"
        )
    return "\n".join(lines)
