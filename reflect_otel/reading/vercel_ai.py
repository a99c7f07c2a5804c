"""Spans the Vercel AI SDK writes (``experimental_telemetry: {isEnabled: true}``), read as OpenInference spans.

The SDK names its spans by operation (``ai.operationId``) and carries no OpenInference kind: ``ai.generateText`` /
``ai.streamText`` (and the ``Object`` variants) are the run, an AGENT named by ``ai.telemetry.functionId``, its
question in ``ai.prompt`` and its answer in ``ai.response.text``; each ``…doGenerate`` / ``…doStream`` is one model
call, an LLM span, its messages in ``ai.prompt.messages`` (the SDK's provider-neutral prompt: ``tool-call`` and
``tool-result`` parts, read in :mod:`reflect_otel.reading._chat_shapes`) and its reply in ``ai.response.text`` and
``ai.response.toolCalls``; each ``ai.toolCall`` is a TOOL span. Anything else (embeddings, reranking) is a CHAIN:
part of the run, not a decision. Read from v6 of the ``ai`` package, with the names v4 and v5 used beside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reflect_otel import _values
from reflect_otel.reading._chat_shapes import (
    json_text,
    message_text,
    read_message,
    read_messages,
    write_messages,
    write_tools,
)
from reflect_otel.reading.semconv import (
    INPUT_MESSAGES_PREFIX,
    OUTPUT_MESSAGES_PREFIX,
    OpenInferenceSpanKindValues,
    SpanAttributes,
    ToolCallAttributes,
    VercelAIAttributes,
)
from reflect_otel.reading.spans import AttributeValue

__all__ = ["MAX_PROMPT_CHARS", "is_vercel_ai", "openinference_attributes"]

MAX_PROMPT_CHARS = 4 * 1024 * 1024
"""A prompt or reply attribute longer than this is not parsed."""

_A = VercelAIAttributes
_RUNS = frozenset({"ai.generateText", "ai.streamText", "ai.generateObject", "ai.streamObject"})
_CALLS = frozenset(f"{run}.{step}" for run in _RUNS for step in ("doGenerate", "doStream"))
_TOOL_CALL = "ai.toolCall"


def is_vercel_ai(attributes: Mapping[str, AttributeValue]) -> bool:
    return isinstance(attributes.get(_A.OPERATION_ID), str)


def openinference_attributes(attributes: Mapping[str, AttributeValue], name: str) -> dict[str, AttributeValue]:
    """The OpenInference attributes that say what the SDK's attributes on a span named ``name`` say."""
    operation = str(attributes[_A.OPERATION_ID])
    out: dict[str, AttributeValue] = {}
    if operation in _CALLS:
        out[SpanAttributes.OPENINFERENCE_SPAN_KIND] = OpenInferenceSpanKindValues.LLM.value
        _model_call(attributes, out)
    elif operation == _TOOL_CALL:
        out[SpanAttributes.OPENINFERENCE_SPAN_KIND] = OpenInferenceSpanKindValues.TOOL.value
        _tool_call(attributes, out, name)
    elif operation in _RUNS:
        out[SpanAttributes.OPENINFERENCE_SPAN_KIND] = OpenInferenceSpanKindValues.AGENT.value
        _run(attributes, out, name)
    else:
        out[SpanAttributes.OPENINFERENCE_SPAN_KIND] = OpenInferenceSpanKindValues.CHAIN.value
    return out


def _first(attributes: Mapping[str, AttributeValue], keys: tuple[str, ...]) -> AttributeValue | None:
    return next((attributes[k] for k in keys if k in attributes), None)


def _reply(attributes: Mapping[str, AttributeValue]) -> str:
    text = attributes.get(_A.RESPONSE_TEXT)
    if isinstance(text, str) and text:
        return text
    structured = attributes.get(_A.RESPONSE_OBJECT)  # generateObject's answer
    return structured if isinstance(structured, str) else ""


def _model_call(attributes: Mapping[str, AttributeValue], out: dict[str, AttributeValue]) -> None:
    inputs = read_messages(attributes.get(_A.PROMPT_MESSAGES), max_chars=MAX_PROMPT_CHARS)
    calls = attributes.get(_A.RESPONSE_TOOL_CALLS)
    parsed = _values.parse_json(calls) if isinstance(calls, str) and len(calls) <= MAX_PROMPT_CHARS else None
    reply: dict[str, Any] = {"role": "assistant", "content": _reply(attributes)}
    if isinstance(parsed, list):
        reply["tool_calls"] = parsed
    reasoning = attributes.get(_A.RESPONSE_REASONING)
    output = read_message(reply, "assistant")
    if isinstance(reasoning, str) and reasoning:
        output["parts"].insert(0, {"type": "reasoning", "content": reasoning})
    write_messages(out, INPUT_MESSAGES_PREFIX, inputs)
    if output["parts"]:
        write_messages(out, OUTPUT_MESSAGES_PREFIX, [output])
    tools = attributes.get(_A.PROMPT_TOOLS)
    if isinstance(tools, list | tuple):
        write_tools(out, tools)
    model = attributes.get(_A.RESPONSE_MODEL) or attributes.get(_A.MODEL_ID)
    if model:
        out[SpanAttributes.LLM_MODEL_NAME] = str(model)
    for ours, theirs in (
        (SpanAttributes.LLM_TOKEN_COUNT_PROMPT, _A.USAGE_INPUT_TOKENS),
        (SpanAttributes.LLM_TOKEN_COUNT_COMPLETION, _A.USAGE_OUTPUT_TOKENS),
    ):
        count = _values.to_int(_first(attributes, theirs))
        if count is not None:
            out[ours] = count


def _tool_call(attributes: Mapping[str, AttributeValue], out: dict[str, AttributeValue], name: str) -> None:
    out[SpanAttributes.TOOL_NAME] = str(attributes.get(_A.TOOL_CALL_NAME) or name)
    if attributes.get(_A.TOOL_CALL_ID):
        out[ToolCallAttributes.TOOL_CALL_ID] = str(attributes[_A.TOOL_CALL_ID])
    arguments = _first(attributes, _A.TOOL_CALL_ARGS)
    if arguments is not None:
        out[SpanAttributes.INPUT_VALUE] = json_text(arguments)
    result = _first(attributes, _A.TOOL_CALL_RESULT)
    if result is not None:
        out[SpanAttributes.OUTPUT_VALUE] = json_text(result)


def _run(attributes: Mapping[str, AttributeValue], out: dict[str, AttributeValue], name: str) -> None:
    function = attributes.get(_A.FUNCTION_ID)
    out[SpanAttributes.AGENT_NAME] = str(function) if function else name
    prompt = attributes.get(_A.PROMPT)
    parsed = _values.parse_json(prompt) if isinstance(prompt, str) and len(prompt) <= MAX_PROMPT_CHARS else None
    question = ""
    if isinstance(parsed, Mapping):
        if isinstance(parsed.get("prompt"), str):
            question = parsed["prompt"]
        else:  # messages (or a prompt given as messages): the last user message
            listed = parsed.get("messages", parsed.get("prompt"))
            users = [m for m in read_messages(listed or [], max_chars=MAX_PROMPT_CHARS) if m["role"] == "user"]
            question = message_text(users[-1]) if users else ""
    if question:
        out[SpanAttributes.INPUT_VALUE] = question
    answer = _reply(attributes)
    if answer:
        out[SpanAttributes.OUTPUT_VALUE] = answer
