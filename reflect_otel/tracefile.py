"""Traces on disk: one ``StructuredTrace`` JSON object per line (JSONL), appended as traces arrive."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from reflect_otel._values import utf8_clean
from reflect_otel.errors import InputError
from reflect_otel.trace import StructuredTrace

__all__ = ["TraceRow", "TraceWriter", "each_trace_row", "good_trace_rows", "read_trace_rows", "read_traces"]

MAX_LINE_BYTES = 64 * 1024 * 1024


class TraceWriter:
    """Appends traces to a JSONL file; thread-safe; each line is flushed whole so a crash loses no written trace."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self.written = 0

    def write(self, trace: StructuredTrace, extras: Mapping[str, Any] | None = None) -> None:
        """Append ``trace``; ``extras`` (such as ``expected_answer``) ride along as additional top-level keys."""
        line = trace.model_dump_json()
        if extras:
            line = line[:-1] + "," + json.dumps(dict(extras), ensure_ascii=False)[1:]
        line += "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self.written += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class TraceRow:
    """A trace and the extra keys its line carried (for example ``expected_answer``)."""

    trace: StructuredTrace
    extras: dict[str, Any]


def read_trace_rows(path: str | Path, *, extra_fields: tuple[str, ...] = ()) -> Iterator[TraceRow]:
    """Traces of a JSONL file, with ``extra_fields`` taken out of each line before validation.

    Raises :class:`InputError` naming the line of the first invalid trace.
    """
    for row in each_trace_row(path, extra_fields=extra_fields):
        if isinstance(row, InputError):
            raise row
        yield row


def good_trace_rows(
    path: str | Path, *, extra_fields: tuple[str, ...] = (), skipped: Callable[[InputError], None]
) -> Iterator[TraceRow]:
    """The valid rows of a JSONL file of traces; each bad line goes to ``skipped`` (for a one-line message naming
    file and line) and the reading goes on."""
    for row in each_trace_row(path, extra_fields=extra_fields):
        if isinstance(row, InputError):
            skipped(row)
        else:
            yield row


def each_trace_row(path: str | Path, *, extra_fields: tuple[str, ...] = ()) -> Iterator[TraceRow | InputError]:
    """Every line of a JSONL file of traces, as a :class:`TraceRow` or the :class:`InputError` (naming file and
    line) that says why the line is not one, so a reader can keep the good lines around a bad one (a line torn by
    a crash mid-write, for instance). Raises :class:`InputError` only when the file cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file; write one with 'reflect-otel collect' or 'reflect-otel import'")
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            if len(raw) > MAX_LINE_BYTES:
                yield InputError(f"{path}:{number}: line is over {MAX_LINE_BYTES} bytes")
                continue
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except ValueError as error:
                yield InputError(f"{path}:{number}: not valid JSON ({error})")
                continue
            except RecursionError:
                yield InputError(f"{path}:{number}: JSON nested too deeply")
                continue
            if b"\\u" in raw:  # only escapes can carry a lone surrogate
                data = utf8_clean(data)
            if not isinstance(data, dict):
                yield InputError(f"{path}:{number}: expected a JSON object")
                continue
            extras = {name: data.pop(name) for name in extra_fields if name in data}
            try:
                yield TraceRow(StructuredTrace.model_validate(data), extras)
            except ValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                yield InputError(f"{path}:{number}: not a StructuredTrace ({where}: {first['msg']})")


def read_traces(path: str | Path) -> Iterator[StructuredTrace]:
    """Traces from a JSONL file written by ``reflect-otel collect`` or ``import`` (extra keys are ignored)."""
    for row in read_trace_rows(path, extra_fields=(EXPECTED_ANSWER_FIELD,)):
        yield row.trace


EXPECTED_ANSWER_FIELD = "expected_answer"
"""The extra key ``import`` writes for datasets that know the correct answer."""
