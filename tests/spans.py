"""Builders of hand-made span records for unit tests of the assembly rules."""

from __future__ import annotations

import itertools
from typing import Any

from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes

from reflect_otel.reading.spans import SpanRecord

TRACE_ID = "0123456789abcdef0123456789abcdef"
_ids = itertools.count(1)


def span_id() -> str:
    return f"{next(_ids):016x}"


def span(
    kind: str | None,
    *,
    sid: str | None = None,
    parent: str | None = None,
    name: str = "span",
    start: int = 0,
    end: int | None = None,
    trace_id: str = TRACE_ID,
    **attributes: Any,
) -> SpanRecord:
    attrs = dict(attributes)
    if kind is not None:
        attrs[SpanAttributes.OPENINFERENCE_SPAN_KIND] = kind
    return SpanRecord(
        trace_id=trace_id,
        span_id=sid or span_id(),
        parent_id=parent,
        name=name,
        start_ns=start,
        end_ns=end if end is not None else start + 1,
        attributes=attrs,
    )


def llm(
    text: str,
    calls: list[tuple[str, str, str]] = (),
    *,
    parent: str | None = None,
    start: int = 0,
    end: int | None = None,
    **extra: Any,
) -> SpanRecord:
    """An LLM span whose output message has ``text`` and tool calls (name, arguments JSON, id)."""
    attrs: dict[str, Any] = {
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": text,
    }
    for k, (name, arguments, call_id) in enumerate(calls):
        prefix = f"llm.output_messages.0.message.tool_calls.{k}.tool_call."
        attrs[prefix + "function.name"] = name
        attrs[prefix + "function.arguments"] = arguments
        if call_id:
            attrs[prefix + "id"] = call_id
    attrs.update(extra)
    return span(OpenInferenceSpanKindValues.LLM.value, parent=parent, start=start, end=end, name="llm", **attrs)


def tool(name: str, result: str, *, parent: str | None = None, start: int = 0, **extra: Any) -> SpanRecord:
    return span(
        OpenInferenceSpanKindValues.TOOL.value,
        parent=parent,
        start=start,
        name=name,
        **{SpanAttributes.TOOL_NAME: name, SpanAttributes.OUTPUT_VALUE: result, **extra},
    )


def agent_root(question: str, answer: str | None = None, *, sid: str | None = None, start: int = 0) -> SpanRecord:
    attrs = {SpanAttributes.INPUT_VALUE: question}
    if answer is not None:
        attrs[SpanAttributes.OUTPUT_VALUE] = answer
    return span(OpenInferenceSpanKindValues.AGENT.value, sid=sid, name="agent", start=start, end=10**12, **attrs)
