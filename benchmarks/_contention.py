"""Seconds measured alone: which method runs of a wtq-live measurement overlapped a contention window (anything else
run on the machine meanwhile), read from the folder's ``contention.tsv``, and each method's seconds over the scored
runs (the table's) that overlapped none.

``contention.tsv``: one window per line, ``START<TAB>END<TAB>what ran``, times in ISO 8601 UTC
(``2026-11-27T00:21Z``); an END of ``-`` is a window still open (everything after START is contended); ``#`` starts
a comment. Times written to the minute are read as the whole minute (START from its first second, END to its last),
so a window rounded to minutes never misses an overlap. A method run spans ``[created_at - seconds, created_at]`` of
its record (the record is made when the method ends); a run whose record gives no readable time is counted apart
as "of unknown time".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.evaluation.metrics import mean_se

FILE = "contention.tsv"
_OPEN = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    what: str


class ContentionFileError(ValueError):
    """A line of ``contention.tsv`` that is not a window; the message names the line and the fix."""


def _parsed(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo is not None else None


def _window_time(text: str, where: str, *, end: bool) -> datetime:
    moment = _parsed(text)
    if moment is None:
        raise ContentionFileError(
            f"{where}: {text.strip()!r} is not an ISO 8601 UTC time; write e.g. 2026-11-27T00:21Z"
        )
    if moment.second == 0 and moment.microsecond == 0 and end:  # to the minute: the whole minute
        moment += timedelta(minutes=1)
    return moment


def read_windows(path: Path) -> list[Window]:
    """The windows of ``path``; a line that is not ``START<TAB>END<TAB>what`` with START <= END raises
    :class:`ContentionFileError` naming the line."""
    windows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"{path}:{number}"
        fields = text.split("\t")
        if len(fields) < 2:
            raise ContentionFileError(f"{where}: expected START<TAB>END<TAB>what ran, got {line[:80]!r}")
        start = _window_time(fields[0], where, end=False)
        end = _OPEN if fields[1].strip() == "-" else _window_time(fields[1], where, end=True)
        if end < start:
            raise ContentionFileError(f"{where}: the window ends before it starts")
        windows.append(Window(start, end, fields[2].strip() if len(fields) > 2 else ""))
    return windows


def span_of(method: dict[str, Any]) -> tuple[datetime, datetime] | None:
    """When a method run ran, from its record (None: no readable record time or seconds)."""
    created = _parsed(str((method.get("record") or {}).get("created_at") or ""))
    seconds = method.get("seconds")
    if created is None or not isinstance(seconds, int | float):
        return None
    return created - timedelta(seconds=float(seconds)), created


def contended(method: dict[str, Any], windows: Sequence[Window]) -> bool | None:
    """Whether the run overlapped a window (None: not known)."""
    span = span_of(method)
    if span is None:
        return None
    return any(w.start < span[1] and span[0] < w.end for w in windows)


def _scored(method: dict[str, Any]) -> bool:
    """The runs the table's seconds are over: not skipped, no stage failure."""
    return method.get("status") != "skipped" and not method.get("failed")


def seconds_alone(rows: Sequence[dict[str, Any]], methods: Sequence[str], windows: Sequence[Window]) -> str:
    """Per method, its mean seconds (± standard error) over the scored failed runs outside every window, and how
    many were left out as contended or of unknown time."""
    lines = []
    for name in methods:
        runs = [r["methods"][name] for r in rows if r["correct"] is False and name in r["methods"]]
        runs = [m for m in runs if _scored(m)]
        marks = [contended(m, windows) for m in runs]
        alone = [float(m["seconds"]) for m, mark in zip(runs, marks, strict=True) if mark is False]
        stat = mean_se(alone)
        shown = "-" if not alone else f"{stat['mean']:.0f} s (n=1)" if len(alone) == 1 else (
            f"{stat['mean']:.0f} ± {stat['se']:.0f} s"
        )  # fmt: skip
        unknown = sum(1 for mark in marks if mark is None)
        lines.append(
            f"- {name}: {shown} over {len(alone)} runs measured alone ({sum(1 for mark in marks if mark)} contended"
            + (f", {unknown} of unknown time" if unknown else "")
            + ", left out)"
        )
    return "\n".join(lines)
