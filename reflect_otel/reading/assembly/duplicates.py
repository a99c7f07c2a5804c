"""Two instrumentations of one model call: which LLM spans are a second record of a call another span records.

LangChain's ``ChatOpenAI`` span and the OpenAI client's span inside it give two LLM spans for one call; when the
client's span cannot parent to the chat model's (LangChain does not set the OTel context), it lands beside it.
The same output, produced within the other span's interval, is the same call: the inner span is part of the outer
one, as if nested.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from reflect_otel.reading.spans import SpanRecord

from .messages import Conversation
from .tree import LLM, SpanTree, time_key

__all__ = ["second_records"]

_NEVER = 2**63


def second_records(tree: SpanTree, conversations: Mapping[str, Conversation]) -> frozenset[str]:
    """The ids of the LLM spans (not nested in another) that record a call an enclosing span records too."""
    llm_spans = [p.span for p in tree.order if p.kind == LLM and p.span.span_id not in tree.nested_llm]
    if not _any_contained(llm_spans):
        return frozenset()  # calls one after another (nearly every trace): nothing can be a second record of another
    by_output: dict[tuple[str, ...], list[SpanRecord]] = defaultdict(list)
    for span in llm_spans:
        conversation = conversations[span.span_id]
        if conversation.outputs:
            by_output[conversation.output_signature].append(span)
    inner: set[str] = set()
    for spans in by_output.values():
        if len(spans) < 2:
            continue
        for span in spans:
            if span.end_ns is not None and any(
                outer.span_id not in inner and _encloses(outer, span) for outer in spans if outer is not span
            ):
                inner.add(span.span_id)
    return frozenset(inner)


def _encloses(outer: SpanRecord, inner: SpanRecord) -> bool:
    """``outer`` ran from before ``inner`` started until after it ended, and sorts first (ties by span id)."""
    assert inner.end_ns is not None
    return (
        outer.end_ns is not None
        and outer.start_ns <= inner.start_ns
        and inner.end_ns <= outer.end_ns
        and (outer.start_ns, -outer.end_ns, outer.span_id) < (inner.start_ns, -inner.end_ns, inner.span_id)
    )


def _any_contained(spans: list[SpanRecord]) -> bool:
    """Whether some span's interval lies within another's (sweep by start time)."""
    latest_end = -1
    for span in sorted(spans, key=lambda s: (s.start_ns, -(s.end_ns or _NEVER))):
        end = time_key(span)[1]
        if end <= latest_end:
            return True
        latest_end = max(latest_end, end)
    return False
