"""The datasets' files as ``import`` reads them (:class:`~reflect_otel.reading.tracefile.FileReader` s, passed by the app to
:func:`reflect_otel.collectors.files.import_files`): BIG-Bench-Mistake rows (each with its expected answer) and
TRAIL trace files (with their annotations, read beside them); and how each is named when given where a file of
traces is expected (:class:`~reflect_otel.reading.tracefile.FormatNamer` s, passed by the app to
:func:`~reflect_otel.reading.tracefile.check_traces_file`)."""

from __future__ import annotations

from pathlib import Path

from reflect_otel.datasets.bbm import bbm_item, is_bbm_row
from reflect_otel.datasets.trail import is_trail_document, read_trail_file
from reflect_otel.datasets.who_and_when import is_who_and_when_log
from reflect_otel.reading.assembly import AssemblyLimits
from reflect_otel.reading.tracefile import FileReader, FormatNamer, ImportedTrace, import_first
from reflect_otel.trace import EXPECTED_ANSWER_FIELD

__all__ = ["DATASET_FORMAT_NAMERS", "DATASET_READERS", "bbm_rows", "trail_annotations", "trail_file"]


def trail_annotations(
    path: Path, documents: list[object], *, max_bytes: int, limits: AssemblyLimits | None
) -> list[ImportedTrace] | None:
    """A TRAIL annotations file (``annotations/<name>.json``): read beside its trace, nothing of its own."""
    return [] if path.suffix == ".json" and path.parent.name == "annotations" else None


def bbm_rows(
    path: Path, documents: list[object], *, max_bytes: int, limits: AssemblyLimits | None
) -> list[ImportedTrace] | None:
    """A BIG-Bench-Mistake file: a trace per row, with its expected answer."""
    if not documents or not is_bbm_row(documents[0]):
        return None
    items = [bbm_item(row, path.stem) for row in documents]  # type: ignore[arg-type]
    return [
        ImportedTrace(item.trace, {EXPECTED_ANSWER_FIELD: item.expected} if item.expected is not None else None)
        for item in items
    ]


def trail_file(
    path: Path, documents: list[object], *, max_bytes: int, limits: AssemblyLimits | None
) -> list[ImportedTrace] | None:
    """A TRAIL trace file, its annotations mapped to steps."""
    if len(documents) != 1 or not is_trail_document(documents[0]):
        return None
    imported = read_trail_file(path, max_bytes=max_bytes, limits=limits)
    return [ImportedTrace(imported.trace, None, imported.labels_total, imported.labels_mapped)]


DATASET_READERS: tuple[FileReader, ...] = (trail_annotations, bbm_rows, trail_file)
"""Every dataset file format ``import`` reads, in the order they are tried."""


def _trail_trace(path: Path, document: object) -> str | None:
    return import_first("a TRAIL trace file", path) if is_trail_document(document) else None


def _bbm_file(path: Path, document: object) -> str | None:
    return import_first("a BIG-Bench-Mistake file", path) if is_bbm_row(document) else None


def _who_and_when_log(path: Path, document: object) -> str | None:
    if not is_who_and_when_log(document):
        return None
    return "this is a Who&When log, not a file of traces: 'reflect-otel eval --benchmark who-and-when --data FOLDER' reads these"


def _trail_annotations(path: Path, document: object) -> str | None:
    errors = document.get("errors") if isinstance(document, dict) else None
    labels = isinstance(errors, list) and all(isinstance(e, dict) and "category" in e for e in errors)
    if labels and isinstance(document, dict) and "spans" not in document:
        return (
            "this is a TRAIL annotation file; import its trace folder with 'reflect-otel import FOLDER -o traces.jsonl'"
        )
    return None


DATASET_FORMAT_NAMERS: tuple[FormatNamer, ...] = (_trail_trace, _bbm_file, _who_and_when_log, _trail_annotations)
"""Every dataset file format named when given where a file of traces is expected, in the order they are tried."""
