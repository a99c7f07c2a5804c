"""The first pass: spans in, one frozen :class:`SpanTree` out, built once and read by every later pass.

De-duplicated (the first copy of a span id is kept), read through :func:`reflect_otel.reading.genai.as_openinference`,
parented, walked depth first from the roots (siblings in start-time then end-time order), and its root found: the
first local root by time, else the first span whose parent never arrived. Spans whose parent links form a cycle
are placed after the rest, by time, each on its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from reflect_otel.errors import InputError
from reflect_otel.reading.genai import as_openinference, lacks_message_content
from reflect_otel.reading.semconv import OUTPUT_MESSAGES_PREFIX, OpenInferenceSpanKindValues, SpanAttributes
from reflect_otel.reading.spans import SpanRecord

__all__ = ["AGENT", "LLM", "TOOL", "Placed", "SpanTree", "time_key"]

LLM = OpenInferenceSpanKindValues.LLM.value
TOOL = OpenInferenceSpanKindValues.TOOL.value
AGENT = OpenInferenceSpanKindValues.AGENT.value
_KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
_NEVER = 2**63


def time_key(span: SpanRecord) -> tuple[int, int]:
    """Start time, then end time (a span that never ended sorts last)."""
    return span.start_ns, span.end_ns if span.end_ns is not None else _NEVER


def _kind(span: SpanRecord) -> str | None:
    kind = span.attributes.get(_KIND)
    return None if kind is None else str(kind)


class Placed(NamedTuple):
    """A span where the walk met it: with the agent it ran under (its name, and the id of that AGENT span: the
    nearest enclosing one, or the span itself) and its ``openinference.span.kind``."""

    span: SpanRecord
    agent: str | None
    kind: str | None
    agent_span_id: str | None = None

    @property
    def acting_kind(self) -> str | None:
        """The recorded kind; when the SDK's attribute limit dropped it (it is set first, so it is the first to go),
        the kind that only that kind's attributes show."""
        if self.kind is not None or not self.span.dropped_attributes:
            return self.kind
        attributes = self.span.attributes
        if any(key.startswith(OUTPUT_MESSAGES_PREFIX) for key in attributes):
            return LLM
        return TOOL if SpanAttributes.TOOL_NAME in attributes else None


@dataclass(frozen=True, slots=True)
class SpanTree:
    """One trace's spans, walked once."""

    spans: Mapping[str, SpanRecord]
    """Every span by id, in arrival order, translated to OpenInference."""
    order: tuple[Placed, ...]
    """The walk: roots by time, each followed by its descendants depth first; then spans caught in a cycle."""
    root: SpanRecord
    nested_llm: frozenset[str]
    """LLM spans inside another LLM span (a chat-model wrapper calling an instrumented client): part of the outer
    call, not a decision of their own."""
    inner_llm: Mapping[str, tuple[SpanRecord, ...]]
    """Those nested LLM spans by the id of their parent, in walk order."""
    duplicates: int
    """Spans given twice (same span id), ignored."""
    orphans: int
    """Spans whose parent never arrived (or that sit in a cycle of parent links)."""
    contentless_llm_spans: int
    """GenAI model-call spans recorded without their messages."""

    @property
    def first_agent(self) -> SpanRecord | None:
        """The first AGENT span of the walk."""
        return next((placed.span for placed in self.order if placed.kind == AGENT), None)

    @classmethod
    def of(cls, spans: Iterable[SpanRecord]) -> SpanTree:
        """Raises :class:`InputError` when ``spans`` is empty or mixes traces."""
        by_id, duplicates, contentless = _dedupe(spans)
        return _walk(by_id, duplicates, contentless)


def _dedupe(spans: Iterable[SpanRecord]) -> tuple[dict[str, SpanRecord], int, int]:
    by_id: dict[str, SpanRecord] = {}
    duplicates = contentless = 0
    trace_id: str | None = None
    for span in spans:
        if trace_id is None:
            trace_id = span.trace_id
        elif span.trace_id != trace_id:
            raise InputError(f"spans of traces {trace_id} and {span.trace_id} given together; assemble one trace")
        if span.span_id in by_id:
            duplicates += 1
            continue
        by_id[span.span_id] = as_openinference(span)
        contentless += lacks_message_content(span)
    if not by_id:
        raise InputError("no spans to assemble")
    return by_id, duplicates, contentless


def _walk(by_id: dict[str, SpanRecord], duplicates: int, contentless: int) -> SpanTree:
    children: dict[str, list[SpanRecord]] = defaultdict(list)
    roots: list[SpanRecord] = []
    orphans = 0
    for span in by_id.values():
        if span.is_local_root:
            roots.append(span)
        elif span.parent_id not in by_id or span.parent_id == span.span_id:
            roots.append(span)
            orphans += 1
        else:
            children[span.parent_id].append(span)
    roots.sort(key=time_key)
    root = next((s for s in roots if s.is_local_root), roots[0] if roots else None)
    walk = _Walk(children)
    walk.visit(roots)
    if len(walk.seen) < len(by_id):  # parent links that form a cycle never reach a root
        stranded = sorted((s for s in by_id.values() if s.span_id not in walk.seen), key=time_key)
        orphans += len(stranded)
        root = root or stranded[0]
        walk.visit(stranded, descend=False)  # in a cycle no span is really another's parent
    assert root is not None  # by_id is not empty, and every span is a root, a descendant of one, or stranded
    return SpanTree(
        spans=MappingProxyType(by_id),
        order=tuple(walk.order),
        root=root,
        nested_llm=frozenset(walk.nested),
        inner_llm=MappingProxyType({parent: tuple(spans) for parent, spans in walk.inner.items()}),
        duplicates=duplicates,
        orphans=orphans,
        contentless_llm_spans=contentless,
    )


class _Walk:
    """The depth-first walk's own state, local to :func:`_walk`."""

    def __init__(self, children: dict[str, list[SpanRecord]]) -> None:
        self.children = children
        self.order: list[Placed] = []
        self.seen: set[str] = set()
        self.nested: set[str] = set()
        self.inner: defaultdict[str, list[SpanRecord]] = defaultdict(list)

    def visit(self, starts: list[SpanRecord], *, descend: bool = True) -> None:
        # (span, agent name, agent span id, inside an LLM span)
        stack: list[tuple[SpanRecord, str | None, str | None, bool]] = [
            (s, None, None, False) for s in reversed(starts)
        ]
        while stack:
            span, agent, agent_span_id, inside_llm = stack.pop()
            if span.span_id in self.seen:
                continue
            self.seen.add(span.span_id)
            kind = _kind(span)
            if kind == AGENT:
                agent = str(span.attributes.get(SpanAttributes.AGENT_NAME) or span.name)
                agent_span_id = span.span_id
            if inside_llm and kind == LLM:
                self.nested.add(span.span_id)
                if span.parent_id:
                    self.inner[span.parent_id].append(span)
            self.order.append(Placed(span, agent, kind, agent_span_id))
            kids = self.children.get(span.span_id) if descend else None
            if kids:
                kids.sort(key=time_key, reverse=True)
                nested = inside_llm or kind == LLM
                stack.extend((kid, agent, agent_span_id, nested) for kid in kids)
