"""A TOOL span as the tool run it records (:class:`ToolRun`): which tool, which call it answers if it says, and
its result out of the wrappers frameworks put around it."""

from __future__ import annotations

from typing import NamedTuple

from reflect_otel import _values
from reflect_otel.reading.semconv import SpanAttributes, ToolCallAttributes

from .context import StepContext, tool_name
from .scrub import TextRules
from .tree import Placed

__all__ = ["ToolRun", "read_tool_run"]


class ToolRun(NamedTuple):
    span_id: str
    context: StepContext
    name: str
    call_id: str | None
    """The call it answers: ``tool_call.id``, or the id inside the serialised ``ToolMessage`` (LangChain) or function
    response it returned."""
    named: bool
    """The span names its tool (``tool.name``); an anonymous action (an agent handoff) does not."""
    arguments: object
    """``input.value`` as recorded (cleaned only when a step takes its arguments from it)."""
    result: str
    result_raw: str | None
    """The result as recorded, when ``result`` was taken out of a wrapper."""
    secrets: int


def read_tool_run(placed: Placed, rules: TextRules) -> ToolRun:
    span = placed.span
    attrs = span.attributes
    scrubber = rules.scrubber()
    output = attrs.get(SpanAttributes.OUTPUT_VALUE)
    message = _values.tool_message(output)
    call_id = attrs.get(ToolCallAttributes.TOOL_CALL_ID) or (message[0] if message else None)
    result, raw = scrubber.result(output, message[1] if message else None)
    return ToolRun(
        span_id=span.span_id,
        context=StepContext.of(span, placed.agent, scrubber, placed.agent_span_id),
        name=tool_name(str(attrs.get(SpanAttributes.TOOL_NAME) or span.name)),
        call_id=str(call_id) if call_id else None,
        named=SpanAttributes.TOOL_NAME in attrs,
        arguments=attrs.get(SpanAttributes.INPUT_VALUE),
        result=result,
        result_raw=raw,
        secrets=scrubber.secrets,
    )
