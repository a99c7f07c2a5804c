"""The TRAIL benchmark's span-tree files (patronus-ai/trail-benchmark) and their human error annotations.

A trace file is ``{"trace_id", "spans": [root]}`` with children nested under ``child_spans``; an annotation file
``{"errors": [{category, location, evidence, description, impact}]}`` sits in ``../annotations/`` under the same
name, each ``location`` a span id.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from reflect_otel.errors import InputError
from reflect_otel.reading._lenient_json import load_json_file
from reflect_otel.reading.assembly import AssemblyLimits, assemble_trace
from reflect_otel.reading.spans import SpanRecord, is_span_id, is_trace_id
from reflect_otel.trace import ErrorLabel, StructuredTrace, TraceWarning, WarningCode

__all__ = ["TrailImport", "is_trail_document", "normalise_trail_category", "read_trail_file", "trail_spans"]

_DURATION = re.compile(r"P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?")

# The TRAIL taxonomy's categories (and the paper's "Incorrect Memory Usage"), keyed by their spelling with case,
# punctuation and a trailing error/failure/issue word removed, which merges the variants annotators wrote.
_TRAIL_CATEGORIES = (
    "Language-only",
    "Tool-related",
    "Poor Information Retrieval",
    "Tool Output Misinterpretation",
    "Incorrect Problem Identification",
    "Tool Selection Errors",
    "Formatting Errors",
    "Instruction Non-compliance",
    "Tool Definition Issues",
    "Environment Setup Errors",
    "Rate Limiting",
    "Authentication Errors",
    "Service Errors",
    "Resource Not Found",
    "Resource Exhaustion",
    "Timeout Issues",
    "Context Handling Failures",
    "Resource Abuse",
    "Goal Deviation",
    "Task Orchestration",
    "Incorrect Memory Usage",
)
_SUFFIXES = ("errors", "error", "failures", "failure", "issues", "issue")


def _category_key(name: str) -> str:
    words = re.sub(r"[^a-z]+", " ", name.lower()).split()
    while len(words) > 1 and words[-1] in _SUFFIXES:
        words.pop()
    return "".join(words)


_CANONICAL = {_category_key(name): name for name in _TRAIL_CATEGORIES}


def normalise_trail_category(name: str) -> str:
    """The canonical TRAIL spelling of ``name`` ("Goal deviation" -> "Goal Deviation"); unknown names trimmed."""
    return _CANONICAL.get(_category_key(name), name.strip())


def _iso_ns(text: object) -> int:
    if not isinstance(text, str):
        raise InputError(f"timestamp {text!r} is not an ISO-8601 string")
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"timestamp {text!r} is not ISO-8601") from None
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def _duration_ns(text: object) -> int | None:
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return None
    parts = {k: float(v) for k, v in match.groupdict(default="0").items()}
    return int(((parts["d"] * 24 + parts["h"]) * 60 + parts["m"]) * 60e9 + parts["s"] * 1e9)


def is_trail_document(document: object) -> bool:
    """True when ``document`` has TRAIL's shape."""
    return (
        isinstance(document, Mapping)
        and isinstance(document.get("spans"), list)
        and all(isinstance(s, Mapping) and "child_spans" in s for s in document["spans"][:1])
    )


def _walk(roots: list[Any]) -> Iterator[tuple[Mapping[str, Any], str | None]]:
    stack: list[tuple[Any, str | None]] = [(root, None) for root in reversed(roots)]
    while stack:
        node, parent = stack.pop()
        if not isinstance(node, Mapping):
            continue
        yield node, parent
        kids = node.get("child_spans")
        if isinstance(kids, list):
            stack.extend((kid, str(node.get("span_id"))) for kid in reversed(kids))


def trail_spans(document: Mapping[str, Any]) -> list[SpanRecord]:
    """Flatten a TRAIL span tree into span records. Raises :class:`InputError` on bad ids or times."""
    trace_id = str(document.get("trace_id", "")).lower()
    if not is_trace_id(trace_id):
        raise InputError(f"trace_id {trace_id!r} is not 32 hex digits")
    records = []
    for node, tree_parent in _walk(document["spans"]):
        span_id = str(node.get("span_id", "")).lower()
        if not is_span_id(span_id):
            raise InputError(f"span_id {span_id!r} is not 16 hex digits")
        parent = node.get("parent_span_id")
        parent_id = None if parent in (None, "", "None") else str(parent).lower()
        start = _iso_ns(node.get("timestamp"))
        duration = _duration_ns(node.get("duration"))
        attributes = node.get("span_attributes")
        records.append(
            SpanRecord(
                trace_id=trace_id,
                span_id=span_id,
                parent_id=parent_id if parent_id is not None else tree_parent,
                name=str(node.get("span_name", "")),
                start_ns=start,
                end_ns=start + duration if duration is not None else None,
                attributes=attributes if isinstance(attributes, Mapping) else {},
                status=str(node.get("status_code", "unset")).lower(),
                status_message=str(node.get("status_message") or "") or None,
                scope=str(node.get("scope_name") or "") or None,
            )
        )
    return records


@dataclass(frozen=True, slots=True)
class TrailImport:
    """One imported TRAIL trace and how many of its annotations mapped to a step."""

    trace: StructuredTrace
    labels_total: int
    labels_mapped: int


def _ancestors(parents: Mapping[str, str | None], node: str | None) -> Iterator[str]:
    """``node`` and its ancestors, nearest first; stops at a parent link seen before (TRAIL files are untrusted:
    parent ids can form a cycle)."""
    seen: set[str] = set()
    while node is not None and node not in seen:
        seen.add(node)
        yield node
        node = parents.get(node)


def _step_for_location(trace: StructuredTrace, spans: list[SpanRecord], location: str) -> int | None:
    """The step a span id denotes: itself, else the first step inside it, else the nearest step around it."""
    step = trace.step_for_span(location)
    if step is not None:
        return step.index
    parents = {s.span_id: s.parent_id for s in spans}
    if location not in parents:
        return None
    for candidate in trace.steps:  # steps are in order, so the first descendant is the earliest
        if location in _ancestors(parents, candidate.span_id):
            return candidate.index
    for node in _ancestors(parents, parents.get(location)):
        step = trace.step_for_span(node)
        if step is not None:
            return step.index
    return None


def read_trail_file(path: Path, *, max_bytes: int, limits: AssemblyLimits | None = None) -> TrailImport:
    """Import one TRAIL trace, with its annotations when ``../annotations/<name>`` exists."""
    document = load_json_file(path, max_bytes=max_bytes)
    if not is_trail_document(document):
        raise InputError(f"{path}: not a TRAIL trace (expected an object with 'spans' holding 'child_spans' trees)")
    spans = trail_spans(document)
    trace = assemble_trace(spans, collector="trail", limits=limits)
    annotation_path = path.parent.parent / "annotations" / path.name
    if not annotation_path.is_file():
        return TrailImport(trace, 0, 0)
    annotations = load_json_file(annotation_path, max_bytes=max_bytes)
    errors = annotations.get("errors") if isinstance(annotations, Mapping) else None
    if not isinstance(errors, list):
        raise InputError(f"{annotation_path}: expected an object with an 'errors' list")
    labels = []
    for error in errors:
        if not isinstance(error, Mapping):
            continue
        location = str(error.get("location", "")).lower()
        labels.append(
            ErrorLabel(
                step_index=_step_for_location(trace, spans, location),
                span_id=location or None,
                category=normalise_trail_category(str(error["category"])) if error.get("category") else None,
                impact=str(error["impact"]).upper() if error.get("impact") else None,
                description=str(error.get("description") or "") or None,
                evidence=str(error.get("evidence") or "") or None,
            )
        )
    mapped = sum(label.step_index is not None for label in labels)
    warnings = trace.warnings
    if mapped < len(labels):
        warnings += (
            TraceWarning(
                code=WarningCode.UNMAPPED_LABELS,
                message=f"{len(labels) - mapped} of {len(labels)} annotation locations name no span of this trace",
            ),
        )
    return TrailImport(trace.model_copy(update={"labels": tuple(labels), "warnings": warnings}), len(labels), mapped)
