"""File import: OTLP/JSON exports (one request per file, or one per line), and any other format a
:class:`~reflect_otel.reading.tracefile.FileReader` passed in reads (the app passes the datasets' readers: TRAIL span trees,
BIG-Bench-Mistake rows with their expected answers); this module knows no dataset."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reflect_otel.collectors.otlp import decode_json_document
from reflect_otel.errors import InputError
from reflect_otel.reading._lenient_json import load_json_file
from reflect_otel.reading.assembly import AssemblyLimits, assemble_trace
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.reading.tracefile import FileReader
from reflect_otel.trace import StructuredTrace

__all__ = ["ImportReport", "expand_paths", "import_files"]

DEFAULT_MAX_FILE_BYTES = 256 * 1024 * 1024


@dataclass(slots=True)
class ImportReport:
    """What an import read, wrote and could not use."""

    files_read: int = 0
    files_skipped: int = 0
    traces: int = 0
    steps: int = 0
    spans_rejected: int = 0
    labels_total: int = 0
    labels_mapped: int = 0
    failures: list[str] = field(default_factory=list)


def expand_paths(paths: Iterable[Path]) -> Iterator[tuple[Path, bool]]:
    """Files to read, as (path, named explicitly); folders are searched for ``*.json`` and ``*.jsonl``."""
    for path in paths:
        if path.is_dir():
            for found in sorted(path.rglob("*")):
                if found.is_file() and found.suffix in (".json", ".jsonl"):
                    yield found, False
        elif path.is_file():
            yield path, True
        else:
            raise InputError(f"{path}: no such file or folder")


def _json_documents(path: Path, max_bytes: int, problems: list[str]) -> list[object]:
    """The JSON documents of a file: one for ``.json``; one per line for ``.jsonl``, where a bad line is added to
    ``problems`` (file and line) and the good lines beside it are kept."""
    if path.suffix == ".jsonl":
        if path.stat().st_size > max_bytes:
            raise InputError(f"{path}: over the {max_bytes}-byte limit; raise --max-file-bytes to read it")
        documents = []
        with path.open(encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    try:
                        documents.append(json.loads(line))
                    except (ValueError, RecursionError) as error:
                        problems.append(f"{path}:{number}: not valid JSON ({error}); line skipped")
        return documents
    return [load_json_file(path, max_bytes=max_bytes)]


_BAD_CONTENT = (InputError, ValueError, OverflowError, RecursionError, UnicodeError)
"""What untrusted file content can raise while it is read, converted or written: each names the file, and the
other files go on."""


def import_files(
    paths: Iterable[Path],
    write: Callable[[StructuredTrace, dict[str, str] | None], None],
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    limits: AssemblyLimits | None = None,
    progress: Callable[[ImportReport], None] | None = None,
    readers: Sequence[FileReader] = (),
) -> ImportReport:
    """Read every file, write each trace through ``write``, and report. A bad file is reported, not fatal. Each file
    is offered to ``readers`` in order; one that none claims is read as OTLP/JSON.

    OTLP spans are grouped by trace id across all files, so a trace exported in several batches is whole.
    """
    run = _Import(write, max_file_bytes, limits, readers)
    for path, explicit in expand_paths(paths):
        try:
            run.read(path)
        except _BAD_CONTENT as error:
            message = str(error) if str(path) in str(error) else f"{path}: {type(error).__name__}: {error}"
            if explicit:
                run.report.failures.append(message)
            else:
                run.report.files_skipped += 1
        if progress is not None:
            progress(run.report)
    run.assemble()
    return run.report


class _Import:
    """One import's settings, its report and the OTLP spans gathered across files."""

    def __init__(
        self,
        write: Callable[[StructuredTrace, dict[str, str] | None], None],
        max_file_bytes: int,
        limits: AssemblyLimits | None,
        readers: Sequence[FileReader],
    ) -> None:
        self.write = write
        self.max_file_bytes = max_file_bytes
        self.limits = limits
        self.readers = readers
        self.report = ImportReport()
        self.otlp_spans: dict[str, list[SpanRecord]] = defaultdict(list)

    def read(self, path: Path) -> None:
        """One file: through the first reader that claims it, else as OTLP/JSON. Raises what bad content raises."""
        documents = _json_documents(path, self.max_file_bytes, self.report.failures)
        imported = next(
            (
                found
                for read in self.readers
                if (found := read(path, documents, max_bytes=self.max_file_bytes, limits=self.limits)) is not None
            ),
            None,
        )
        if imported is not None and not imported:
            self.report.files_skipped += 1  # claimed, nothing of its own (labels read beside their trace)
            return
        if imported is not None:
            for item in imported:
                self.write(item.trace, item.fields)
                self.report.traces += 1
                self.report.steps += len(item.trace.steps)
                self.report.labels_total += item.labels_total
                self.report.labels_mapped += item.labels_mapped
        else:
            self._otlp(path, documents)
        self.report.files_read += 1

    def _otlp(self, path: Path, documents: list[object]) -> None:
        for document in documents:
            batch = decode_json_document(document)
            self.report.spans_rejected += batch.rejected
            if batch.rejected:  # the rest of the file is kept; a dropped span is still a failure to show
                self.report.failures.append(f"{path}: {batch.rejected} span(s) rejected: {batch.error_message}")
            for span in batch.spans:
                self.otlp_spans[span.trace_id].append(span)

    def assemble(self) -> None:
        """Assemble and write the OTLP traces gathered from every file."""
        for trace_id, spans in self.otlp_spans.items():
            try:
                trace = assemble_trace(spans, collector="file", limits=self.limits)
                self.write(trace, None)
            except _BAD_CONTENT as error:
                self.report.failures.append(f"trace {trace_id}: {type(error).__name__}: {error}")
                continue
            self.report.traces += 1
            self.report.steps += len(trace.steps)
