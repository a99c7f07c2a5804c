"""File import: OTLP/JSON exports (one request per file, or one per line), TRAIL span trees, and
BIG-Bench-Mistake rows (with their expected answers)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from reflect_otel._lenient_json import load_json_file
from reflect_otel.assembly import AssemblyLimits, assemble_trace
from reflect_otel.collectors.otlp import decode_json_document
from reflect_otel.datasets import bbm_item, is_bbm_row
from reflect_otel.datasets.trail import is_trail_document, read_trail_file
from reflect_otel.errors import InputError
from reflect_otel.spans import SpanRecord
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, StructuredTrace

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
) -> ImportReport:
    """Read every file, write each trace through ``write``, and report. A bad file is reported, not fatal.

    OTLP spans are grouped by trace id across all files, so a trace exported in several batches is whole.
    """
    report = ImportReport()
    otlp_spans: dict[str, list[SpanRecord]] = defaultdict(list)
    for path, explicit in expand_paths(paths):
        try:
            if path.suffix == ".json" and path.parent.name == "annotations":
                report.files_skipped += 1  # TRAIL labels; read beside their trace
                continue
            documents = _json_documents(path, max_file_bytes, report.failures)
            if documents and is_bbm_row(documents[0]):
                for row in documents:
                    item = bbm_item(row, path.stem)  # type: ignore[arg-type]
                    write(item.trace, {EXPECTED_ANSWER_FIELD: item.expected} if item.expected is not None else None)
                    report.traces += 1
                    report.steps += len(item.trace.steps)
            elif len(documents) == 1 and is_trail_document(documents[0]):
                imported = read_trail_file(path, max_bytes=max_file_bytes, limits=limits)
                write(imported.trace, None)
                report.traces += 1
                report.steps += len(imported.trace.steps)
                report.labels_total += imported.labels_total
                report.labels_mapped += imported.labels_mapped
            else:
                for document in documents:
                    batch = decode_json_document(document)
                    report.spans_rejected += batch.rejected
                    if batch.rejected:  # the rest of the file is kept; a dropped span is still a failure to show
                        report.failures.append(f"{path}: {batch.rejected} span(s) rejected: {batch.error_message}")
                    for span in batch.spans:
                        otlp_spans[span.trace_id].append(span)
            report.files_read += 1
        except _BAD_CONTENT as error:
            message = str(error) if str(path) in str(error) else f"{path}: {type(error).__name__}: {error}"
            if explicit:
                report.failures.append(message)
            else:
                report.files_skipped += 1
        if progress is not None:
            progress(report)
    for trace_id, spans in otlp_spans.items():
        try:
            trace = assemble_trace(spans, collector="file", limits=limits)
            write(trace, None)
        except _BAD_CONTENT as error:
            report.failures.append(f"trace {trace_id}: {type(error).__name__}: {error}")
            continue
        report.traces += 1
        report.steps += len(trace.steps)
    return report
