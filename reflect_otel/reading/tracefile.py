"""Traces on disk: one ``StructuredTrace`` JSON object per line (JSONL), appended as traces arrive."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from pydantic import ValidationError

from reflect_otel._values import utf8_clean
from reflect_otel.errors import InputError
from reflect_otel.reading._files import check_input_file, check_output_file
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, StructuredTrace

if TYPE_CHECKING:
    from reflect_otel.reading.assembly import AssemblyLimits

__all__ = [
    "TRACES_HINT",
    "FileReader",
    "FormatNamer",
    "ImportedTrace",
    "TraceRow",
    "TraceWriter",
    "check_traces_file",
    "each_trace_row",
    "good_trace_rows",
    "import_first",
    "other_format",
    "read_trace_rows",
    "read_traces",
]

MAX_LINE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ImportedTrace:
    """A trace a :class:`FileReader` read from a file, with the fields written beside it (the expected answer) and
    how many of the file's labels mapped to a step."""

    trace: StructuredTrace
    fields: dict[str, str] | None = None
    labels_total: int = 0
    labels_mapped: int = 0


class FileReader(Protocol):
    """A reader of one file format that ``import`` does not read as OTLP (a dataset's files; the app passes the
    readers of :mod:`reflect_otel.datasets`): ``reader(path, documents, max_bytes=..., limits=...)`` returns the
    traces of ``path`` (whose JSON ``documents`` are already read: one, or one per line), an empty list for a file of
    its format that holds no trace (labels read beside another file), or None when the file is not of its format.
    Raises :class:`~reflect_otel.errors.InputError` (naming the file) on bad content."""

    def __call__(
        self, path: Path, documents: list[object], *, max_bytes: int, limits: AssemblyLimits | None
    ) -> list[ImportedTrace] | None: ...


class FormatNamer(Protocol):
    """Names a file of another format than traces from its JSON ``document`` (its first line, or the whole file when
    that line is not JSON): the message saying what it is and which command reads it, else None. The datasets'
    namers are passed by the app (:data:`reflect_otel.datasets.files.DATASET_FORMAT_NAMERS`)."""

    def __call__(self, path: Path, document: object) -> str | None: ...


class TraceWriter:
    """Appends traces to a JSONL file (never truncating it); thread-safe; each line is flushed whole so a crash
    loses no written trace. A file whose last line was torn by a crash gets a line break first, so the next trace
    is a line of its own. ``stream`` writes to an open file instead (``import`` writes a new file whole through
    :func:`reflect_otel.reading._files.replaced_on_success`)."""

    def __init__(self, path: str | Path, *, stream: TextIO | None = None) -> None:
        self.path = Path(path)
        if stream is None:
            check_output_file(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            stream = self.path.open("a", encoding="utf-8")
            if stream.tell() > 0 and not _ends_a_line(self.path):
                stream.write("\n")
        self._file = stream
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


def _ends_a_line(path: Path) -> bool:
    with path.open("rb") as file:
        file.seek(-1, 2)
        return file.read(1) == b"\n"


@dataclass(frozen=True, slots=True)
class TraceRow:
    """A trace and the extra keys its line carried (for example ``expected_answer``)."""

    trace: StructuredTrace
    extras: dict[str, Any]


def read_trace_rows(
    path: str | Path, *, extra_fields: tuple[str, ...] = (), namers: Sequence[FormatNamer] = ()
) -> Iterator[TraceRow]:
    """Traces of a JSONL file, with ``extra_fields`` taken out of each line before validation (``namers``: as for
    :func:`check_traces_file`).

    Raises :class:`InputError` naming the line of the first invalid trace.
    """
    for row in each_trace_row(path, extra_fields=extra_fields, namers=namers):
        if isinstance(row, InputError):
            raise row
        yield row


def good_trace_rows(
    path: str | Path,
    *,
    extra_fields: tuple[str, ...] = (),
    skipped: Callable[[InputError], None],
    namers: Sequence[FormatNamer] = (),
) -> Iterator[TraceRow]:
    """The valid rows of a JSONL file of traces; each bad line goes to ``skipped`` (for a one-line message naming
    file and line) and the reading goes on (``namers``: as for :func:`check_traces_file`)."""
    for row in each_trace_row(path, extra_fields=extra_fields, namers=namers):
        if isinstance(row, InputError):
            skipped(row)
        else:
            yield row


def each_trace_row(
    path: str | Path, *, extra_fields: tuple[str, ...] = (), namers: Sequence[FormatNamer] = ()
) -> Iterator[TraceRow | InputError]:
    """Every line of a JSONL file of traces, as a :class:`TraceRow` or the :class:`InputError` (naming file and
    line) that says why the line is not one, so a reader can keep the good lines around a bad one (a line torn by
    a crash mid-write, for instance). Raises :class:`InputError` only when the file cannot be read, or is of
    another format (``namers``: as for :func:`check_traces_file`)."""
    path = check_traces_file(Path(path), namers=namers)
    first_bad: list[InputError] = []  # held until a good line shows that this is a file of traces
    seen_good = False
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            row = _row(path, number, raw, extra_fields)
            if row is None:
                continue
            if seen_good:
                yield row
            elif isinstance(row, InputError):
                first_bad.append(row)
                if len(first_bad) == _BAD_LINES_BEFORE_A_GOOD_ONE:
                    raise InputError(
                        f"{path}: none of its first {len(first_bad)} lines is a trace ({first_bad[0]}), so it "
                        f"is not a file of traces; {TRACES_HINT}"
                    )
            else:
                seen_good = True
                yield from first_bad
                yield row
    yield from ([] if seen_good else first_bad)


_BAD_LINES_BEFORE_A_GOOD_ONE = 20
"""A file whose first this-many lines are all bad is refused whole (one message, not a line per line)."""

TRACES_HINT = "write one with 'reflect-otel collect' or 'reflect-otel import'"
"""How to get a file of traces, for the messages that refuse another file."""


def check_traces_file(path: Path, *, namers: Sequence[FormatNamer] = ()) -> Path:
    """``path`` when it may be a JSONL file of traces; else :class:`InputError` saying what it is and which
    command reads it: missing, a folder, unreadable, empty, binary, or a file of a known other format (an OTLP/JSON
    export, a file of attribution records, a store, or one that ``namers`` name)."""
    check_input_file(path, what="JSONL file of traces", hint=TRACES_HINT)
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty; {TRACES_HINT}")
    other = other_format(path, namers=namers)
    if other is not None:
        raise InputError(f"{path}: {other}")
    return path


def _row(path: Path, number: int, raw: bytes, extra_fields: tuple[str, ...]) -> TraceRow | InputError | None:
    if len(raw) > MAX_LINE_BYTES:
        return InputError(f"{path}:{number}: line is over {MAX_LINE_BYTES} bytes")
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError as error:
        return InputError(f"{path}:{number}: not valid JSON ({error})")
    except RecursionError:
        return InputError(f"{path}:{number}: JSON nested too deeply")
    if b"\\u" in raw:  # only escapes can carry a lone surrogate
        data = utf8_clean(data)
    if not isinstance(data, dict):
        return InputError(f"{path}:{number}: expected a JSON object")
    extras = {name: data.pop(name) for name in extra_fields if name in data}
    try:
        return TraceRow(StructuredTrace.model_validate(data), extras)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return InputError(f"{path}:{number}: not a StructuredTrace ({where}: {first['msg']})")


_HEAD_BYTES = 64 * 1024
_WHOLE_DOCUMENT_BYTES = 256 * 1024 * 1024
"""A file this large or smaller whose first line is not JSON is parsed whole, to name its format."""


def import_first(kind: str, path: Path) -> str:
    """The message for a file ``import`` reads: what it is, and the command."""
    return f"this is {kind}, not a file of traces: run 'reflect-otel import {path} -o traces.jsonl' first"


def other_format(path: Path, *, namers: Sequence[FormatNamer] = ()) -> str | None:
    """What ``path`` is when it is plainly not a JSONL file of traces (and which command reads it), else None.
    Reads the file's head, and the whole file only when its first line is not JSON (a pretty-printed document)."""
    with path.open("rb") as file:
        head = file.read(_HEAD_BYTES)
    if head[8:12] == b"DUCK":
        return f"this is a DuckDB store; read it with 'reflect-otel stats --store {path}' (or sql, report)"
    if head.startswith(b"SQLite format 3\0"):
        return "this is an SQLite database, not a file of traces"
    if head.startswith((b"\x1f\x8b", b"PK\x03\x04", b"\x28\xb5\x2f\xfd", b"BZh")):
        return "this is a compressed file (gzip, zip, zstd or bzip2); decompress it first"
    if b"\0" in head:
        return "this is a binary file, not a JSONL file of traces (one JSON object per line)"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # not just a character cut by the head's end
            return "this is not UTF-8 text, so not a JSONL file of traces"
    first_line = _first_line(path)
    try:
        document: Any = json.loads(first_line)
    except (ValueError, RecursionError):
        document = None
        if len(first_line) >= MAX_LINE_BYTES and not first_line.endswith(b"\n"):
            return (
                f"its first line is over {MAX_LINE_BYTES} bytes ({MAX_LINE_BYTES // (1024 * 1024)} MiB), more than "
                "one trace line may hold; cut the trace's long fields (its tool results?) and write it again"
            )
        if path.stat().st_size <= _WHOLE_DOCUMENT_BYTES:
            try:
                document = json.loads(path.read_bytes())
            except (ValueError, RecursionError):
                return None  # not JSON as a whole either: each bad line is reported
            if not isinstance(document, dict | list):
                return None
            named = _named(path, document, namers)
            if named is None:
                kind = "a JSON array" if isinstance(document, list) else "one JSON document over several lines"
                return f"this is {kind}, not JSONL (one trace per line); {TRACES_HINT}"
            return named
    return _named(path, document, namers)


def _named(path: Path, document: object, namers: Sequence[FormatNamer]) -> str | None:
    for namer in (_otlp_export, _attribution_records, *namers):  # a record has an errors list, as TRAIL's labels
        named = namer(path, document)
        if named is not None:
            return named
    return None


def _otlp_export(path: Path, document: object) -> str | None:
    is_otlp = isinstance(document, dict) and isinstance(
        document.get("resourceSpans", document.get("resource_spans")), list
    )
    return import_first("an OTLP/JSON export", path) if is_otlp else None


def _attribution_records(path: Path, document: object) -> str | None:
    if isinstance(document, dict) and document.keys() >= _RECORD_KEYS and "steps" not in document:
        return (
            "this is a file of attribution records (from 'reflect-otel attribute'), not traces: show them with "
            f"'reflect-otel show TRACES.jsonl --records {path}'"
        )
    return None


def _first_line(path: Path) -> bytes:
    """The first line that is not blank (whole, however long a trace makes it, up to :data:`MAX_LINE_BYTES`)."""
    with path.open("rb") as file:
        for line in iter(lambda: file.readline(MAX_LINE_BYTES), b""):
            if line.strip():
                return line
    return b""


_RECORD_KEYS = frozenset({"trace_id", "method", "status", "mode"})


def read_traces(path: str | Path) -> Iterator[StructuredTrace]:
    """Traces from a JSONL file written by ``reflect-otel collect`` or ``import`` (extra keys are ignored)."""
    for row in read_trace_rows(path, extra_fields=(EXPECTED_ANSWER_FIELD,)):
        yield row.trace
