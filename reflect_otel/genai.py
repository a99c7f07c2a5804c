"""Spans that follow the OpenTelemetry GenAI semantic conventions, read as OpenInference spans.

Assembly speaks OpenInference; a span that carries ``gen_ai.operation.name`` and no ``openinference.span.kind`` is
translated here, once, into the OpenInference attributes that say the same thing, so every rule of assembly
applies to both conventions alike. Followed: the GenAI conventions of OpenTelemetry semantic conventions v1.37 and
later (messages as parts-based JSON in ``gen_ai.input.messages``, ``gen_ai.output.messages`` and
``gen_ai.system_instructions``; the schemas in open-telemetry/semantic-conventions-genai,
``docs/gen-ai/gen-ai-input-messages.json`` and ``gen-ai-output-messages.json``), with attribute names taken from
``opentelemetry-semantic-conventions`` (v1.44 at the time of writing). The indexed ``gen_ai.prompt.N.*`` /
``gen_ai.completion.N.*`` attributes that OpenLLMetry writes are read too.

The event-based form of v1.36 and before is read from span events: ``gen_ai.system.message``,
``gen_ai.user.message``, ``gen_ai.assistant.message``, ``gen_ai.tool.message`` (inputs, in order) and
``gen_ai.choice`` (outputs), their body as attributes (``content``, ``tool_calls``, ``id``, ``message``, or the whole
body as JSON in ``gen_ai.event.content``); and the span events of v1.26-v1.28, ``gen_ai.content.prompt`` /
``gen_ai.content.completion`` with the messages as JSON in ``gen_ai.prompt`` / ``gen_ai.completion``. Those
events sent as log records (the Events API) never reach a trace collector: export them as span events, or use
v1.37's attributes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from reflect_otel import _values
from reflect_otel.semconv import (
    INPUT_MESSAGES_PREFIX,
    OUTPUT_MESSAGES_PREFIX,
    MessageAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
    ToolAttributes,
    ToolCallAttributes,
)
from reflect_otel.spans import AttributeValue, SpanEvent, SpanRecord

__all__ = ["CAPTURE_CONTENT_HINT", "MAX_MESSAGES_JSON_CHARS", "as_openinference", "lacks_message_content"]

CAPTURE_CONTENT_HINT = (
    "turn message content on where the spans are made: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY "
    "(instrumentations that read it as a flag take true; under true Google ADK 2 sends the messages to log events, "
    "which a trace does not carry)"
)
"""How to get messages onto GenAI spans: the variable the OTel GenAI instrumentations read."""

MAX_MESSAGES_JSON_CHARS = 4 * 1024 * 1024
"""A messages attribute longer than this is not parsed (its text is kept, cut, as the span's input or output)."""

_LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_AGENT_OPERATIONS = frozenset({"invoke_agent", "invoke_workflow"})
_TOOL_OPERATION = "execute_tool"
_TOOL_DEFINITIONS = getattr(gen_ai, "GEN_AI_TOOL_DEFINITIONS", "gen_ai.tool.definitions")
"""Added to the conventions in v1.37; older ``opentelemetry-semantic-conventions`` packages lack the constant."""
_WORKFLOW_NAME = getattr(gen_ai, "GEN_AI_WORKFLOW_NAME", "gen_ai.workflow.name")
"""``invoke_workflow``'s name (the conventions added the operation after v1.37)."""
_LEGACY_PROMPT = "gen_ai.prompt."
_LEGACY_COMPLETION = "gen_ai.completion."
_INPUT_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_CHOICE_EVENT = "gen_ai.choice"
_EVENT_BODY = "gen_ai.event.content"
_PROMPT_EVENT, _PROMPT_ATTRIBUTE = "gen_ai.content.prompt", "gen_ai.prompt"
_COMPLETION_EVENT, _COMPLETION_ATTRIBUTE = "gen_ai.content.completion", "gen_ai.completion"
_KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
_TOOL_CALL_ID_FIELD = MessageAttributes.MESSAGE_TOOL_CALL_ID.removeprefix("message.")  # under ...N.message.


def _messages(value: object) -> list[Mapping[str, Any]]:
    if not isinstance(value, str) or len(value) > MAX_MESSAGES_JSON_CHARS:
        return []
    parsed = _values.parse_json(value)
    if isinstance(parsed, Mapping):
        parsed = [parsed]
    return [m for m in parsed if isinstance(m, Mapping)] if isinstance(parsed, list) else []


def _parts(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    parts = message.get("parts")
    if isinstance(parts, list):
        return [p for p in parts if isinstance(p, Mapping)]
    content = message.get("content")  # not the spec's shape, but common: a plain content string
    return [{"type": "text", "content": content}] if isinstance(content, str) else []


def _json_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _text_of(parts: list[Mapping[str, Any]]) -> str:
    """Reasoning, text and tool responses, in order: what the message says in words."""
    texts = []
    for part in parts:
        kind = part.get("type")
        if kind in ("text", "reasoning") and part.get("content") is not None:
            texts.append(_values.as_text(part["content"]))
        elif kind == "tool_call_response" and part.get("response") is not None:
            texts.append(_json_text(part["response"]))
    return "\n".join(t for t in texts if t)


def _write_messages(out: dict[str, AttributeValue], prefix: str, messages: list[Mapping[str, Any]]) -> None:
    call_prefix = ToolCallAttributes.TOOL_CALL_FUNCTION_NAME.removesuffix("function.name")  # "tool_call."
    for index, message in enumerate(messages):
        base = f"{prefix}{index}.message."
        parts = _parts(message)
        out[base + "role"] = str(message.get("role") or "")
        out[base + "content"] = _text_of(parts)
        answered = next((p.get("id") for p in parts if p.get("type") == "tool_call_response" and p.get("id")), None)
        if answered:
            out[base + _TOOL_CALL_ID_FIELD] = str(answered)
        calls = [p for p in parts if p.get("type") == "tool_call"]
        for position, call in enumerate(calls):
            at = f"{base}tool_calls.{position}.{call_prefix}"
            out[at + "function.name"] = str(call.get("name") or "")
            if call.get("id"):
                out[at + "id"] = str(call["id"])
            if call.get("arguments") is not None:
                out[at + "function.arguments"] = _json_text(call["arguments"])


def _legacy_messages(attributes: Mapping[str, AttributeValue], prefix: str) -> list[Mapping[str, Any]]:
    """OpenLLMetry's ``gen_ai.prompt.N.role|content`` and ``gen_ai.completion.N.role|content|tool_calls.K.*``."""
    messages: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix):
            continue
        index, _, field = key[len(prefix) :].partition(".")
        if not index.isdigit():
            continue
        message = messages.setdefault(int(index), {"parts": [], "calls": {}})
        if field == "role":
            message["role"] = value
        elif field == "content":
            message["parts"].insert(0, {"type": "text", "content": value})
        elif field == "tool_call_id":
            message["answers"] = value
        elif field.startswith("tool_calls."):
            call_index, _, call_field = field[len("tool_calls.") :].partition(".")
            if call_index.isdigit():
                message["calls"].setdefault(int(call_index), {"type": "tool_call"})[call_field] = value
    for message in messages.values():
        calls = message.pop("calls")
        message["parts"] += [calls[k] for k in sorted(calls)]
        answers = message.pop("answers", None)
        if answers and message.get("role") == "tool":  # a tool result: its text answers that call
            text = next((p.get("content") for p in message["parts"] if p.get("type") == "text"), "")
            message["parts"] = [{"type": "tool_call_response", "id": answers, "response": text}]
    return [messages[i] for i in sorted(messages)]


def _chat_message(message: Mapping[str, Any], role: str) -> dict[str, Any]:
    """An OpenAI-style message (``content`` text or parts, ``tool_calls``, ``id`` / ``tool_call_id``) in the
    parts-based form."""
    parts: list[Mapping[str, Any]] = []
    content = message.get("content")
    if role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.get("id") or message.get("tool_call_id"), "response": content}
        )
    elif content:
        parts.append({"type": "text", "content": _values.as_text(content)})
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, Mapping):
            nested = call.get("function")
            function: Mapping[str, Any] = nested if isinstance(nested, Mapping) else call
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
    return {"role": str(message.get("role") or role), "parts": parts}


def _event_body(attributes: Mapping[str, AttributeValue]) -> Mapping[str, Any]:
    body = _values.parse_json(attributes.get(_EVENT_BODY)) if _EVENT_BODY in attributes else None
    if isinstance(body, Mapping):
        return body
    out: dict[str, Any] = dict(attributes)
    for key in ("tool_calls", "message", "content"):
        value = out.get(key)
        parsed = _values.parse_json(value) if isinstance(value, str) and key != "content" else None
        if parsed is not None:
            out[key] = parsed
    return out


def _event_messages(events: tuple[SpanEvent, ...]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(inputs, outputs) from GenAI events of v1.36 and before, or the prompt/completion events of v1.26-v1.28."""
    inputs: list[Mapping[str, Any]] = []
    outputs: list[Mapping[str, Any]] = []
    for event in events:
        if event.name in _INPUT_EVENTS:
            inputs.append(_chat_message(_event_body(event.attributes), _INPUT_EVENTS[event.name]))
        elif event.name == _CHOICE_EVENT:
            body = _event_body(event.attributes)
            message = body.get("message")
            outputs.append(_chat_message(message if isinstance(message, Mapping) else body, "assistant"))
        elif event.name in (_PROMPT_EVENT, _COMPLETION_EVENT):
            key = _PROMPT_ATTRIBUTE if event.name == _PROMPT_EVENT else _COMPLETION_ATTRIBUTE
            role = "user" if event.name == _PROMPT_EVENT else "assistant"
            target = inputs if event.name == _PROMPT_EVENT else outputs
            target += [_chat_message(m, role) for m in _messages(event.attributes.get(key))]
    return inputs, outputs


def _has_genai_events(events: tuple[SpanEvent, ...]) -> bool:
    names = {*_INPUT_EVENTS, _CHOICE_EVENT, _PROMPT_EVENT, _COMPLETION_EVENT}
    return any(event.name in names for event in events)


def _system_message(value: object) -> list[Mapping[str, Any]]:
    if isinstance(value, str) and value and len(value) <= MAX_MESSAGES_JSON_CHARS:
        parsed = _values.parse_json(value)
        parts = parsed if isinstance(parsed, list) else [{"type": "text", "content": value}]
        return [{"role": "system", "parts": parts}]
    return []


def _llm(span: SpanRecord, out: dict[str, AttributeValue]) -> None:
    attributes = span.attributes
    event_inputs, event_outputs = _event_messages(span.events) if span.events else ([], [])
    inputs = (
        _messages(attributes.get(gen_ai.GEN_AI_INPUT_MESSAGES))
        or _legacy_messages(attributes, _LEGACY_PROMPT)
        or event_inputs
    )
    outputs = (
        _messages(attributes.get(gen_ai.GEN_AI_OUTPUT_MESSAGES))
        or _legacy_messages(attributes, _LEGACY_COMPLETION)
        or event_outputs
    )
    raw_output = attributes.get(gen_ai.GEN_AI_OUTPUT_MESSAGES)
    if not outputs and isinstance(raw_output, str) and raw_output:  # unreadable: keep its text, never drop it
        out[SpanAttributes.OUTPUT_VALUE] = raw_output[:MAX_MESSAGES_JSON_CHARS]
    _write_tools(out, attributes.get(_TOOL_DEFINITIONS))
    inputs = _system_message(attributes.get(gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS)) + inputs
    _write_messages(out, INPUT_MESSAGES_PREFIX, inputs)
    _write_messages(out, OUTPUT_MESSAGES_PREFIX, outputs)
    model = attributes.get(gen_ai.GEN_AI_RESPONSE_MODEL) or attributes.get(gen_ai.GEN_AI_REQUEST_MODEL)
    if model:
        out[SpanAttributes.LLM_MODEL_NAME] = str(model)
    for ours, theirs in (
        (SpanAttributes.LLM_TOKEN_COUNT_PROMPT, (gen_ai.GEN_AI_USAGE_INPUT_TOKENS, gen_ai.GEN_AI_USAGE_PROMPT_TOKENS)),
        (
            SpanAttributes.LLM_TOKEN_COUNT_COMPLETION,
            (gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS, gen_ai.GEN_AI_USAGE_COMPLETION_TOKENS),
        ),
    ):
        count = next((_values.to_int(attributes[k]) for k in theirs if k in attributes), None)
        if count is not None:
            out[ours] = count


def _write_tools(out: dict[str, AttributeValue], value: object) -> None:
    """``gen_ai.tool.definitions`` (a JSON array of tool objects) as OpenInference's ``llm.tools.N.tool.json_schema``,
    each tool's JSON as it is (read by shape in :mod:`reflect_otel.tool_definitions`)."""
    text = value if isinstance(value, str) and len(value) <= MAX_MESSAGES_JSON_CHARS else None
    tools = _values.parse_json(text) if text is not None else None
    if not isinstance(tools, list):
        return
    for index, tool in enumerate(tools):
        if isinstance(tool, Mapping):
            out[f"{SpanAttributes.LLM_TOOLS}.{index}.{ToolAttributes.TOOL_JSON_SCHEMA}"] = json.dumps(tool)


def _last_text(messages: list[Mapping[str, Any]], role: str | None) -> str:
    for message in reversed(messages):
        if role is None or message.get("role") == role:
            text = _text_of(_parts(message))
            if text:
                return text
    return ""


def _agent(attributes: Mapping[str, AttributeValue], out: dict[str, AttributeValue]) -> None:
    name = attributes.get(gen_ai.GEN_AI_AGENT_NAME) or attributes.get(_WORKFLOW_NAME)
    if name:
        out[SpanAttributes.AGENT_NAME] = str(name)
    question = _last_text(_messages(attributes.get(gen_ai.GEN_AI_INPUT_MESSAGES)), "user")
    answer = _last_text(_messages(attributes.get(gen_ai.GEN_AI_OUTPUT_MESSAGES)), None)
    if question:
        out.setdefault(SpanAttributes.INPUT_VALUE, question)
    if answer:
        out.setdefault(SpanAttributes.OUTPUT_VALUE, answer)


def _tool(span: SpanRecord, out: dict[str, AttributeValue]) -> None:
    attributes = span.attributes
    name = attributes.get(gen_ai.GEN_AI_TOOL_NAME) or span.name.removeprefix(_TOOL_OPERATION).strip()
    out[SpanAttributes.TOOL_NAME] = str(name or span.name)
    if attributes.get(gen_ai.GEN_AI_TOOL_CALL_ID):
        out[ToolCallAttributes.TOOL_CALL_ID] = str(attributes[gen_ai.GEN_AI_TOOL_CALL_ID])
    if gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS in attributes:
        out.setdefault(SpanAttributes.INPUT_VALUE, _json_text(attributes[gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS]))
    if gen_ai.GEN_AI_TOOL_CALL_RESULT in attributes:
        out.setdefault(SpanAttributes.OUTPUT_VALUE, _json_text(attributes[gen_ai.GEN_AI_TOOL_CALL_RESULT]))


def lacks_message_content(span: SpanRecord) -> bool:
    """A GenAI model-call span recorded without any of its messages: the instrumentation's content capture is off
    (its steps will have no text, arguments or results)."""
    attributes = span.attributes
    if _KIND in attributes or attributes.get(gen_ai.GEN_AI_OPERATION_NAME) not in _LLM_OPERATIONS:
        return False
    carried = (gen_ai.GEN_AI_INPUT_MESSAGES, gen_ai.GEN_AI_OUTPUT_MESSAGES, gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS)
    if any(key in attributes for key in carried):
        return False
    if any(key.startswith((_LEGACY_PROMPT, _LEGACY_COMPLETION)) for key in attributes):
        return False
    return not _has_genai_events(span.events)


def as_openinference(span: SpanRecord) -> SpanRecord:
    """``span`` itself when it is OpenInference (or neither convention); else a copy whose attributes add the
    OpenInference equivalents of its GenAI ones (the originals are kept)."""
    attributes = span.attributes
    if _KIND in attributes:
        name = attributes.get(gen_ai.GEN_AI_AGENT_NAME)
        if name and SpanAttributes.AGENT_NAME not in attributes:  # both conventions on one span: the agent's name
            return replace(span, attributes={**attributes, SpanAttributes.AGENT_NAME: str(name)})
        return span
    operation = attributes.get(gen_ai.GEN_AI_OPERATION_NAME)
    legacy = operation is None and (
        any(k.startswith((_LEGACY_PROMPT, _LEGACY_COMPLETION)) for k in attributes) or _has_genai_events(span.events)
    )
    if operation is None and not legacy:
        return span
    out: dict[str, AttributeValue] = {}
    if legacy or operation in _LLM_OPERATIONS:
        out[_KIND] = OpenInferenceSpanKindValues.LLM.value
        _llm(span, out)
    elif operation == _TOOL_OPERATION:
        out[_KIND] = OpenInferenceSpanKindValues.TOOL.value
        _tool(span, out)
    elif operation in _AGENT_OPERATIONS:
        out[_KIND] = OpenInferenceSpanKindValues.AGENT.value
        _agent(attributes, out)
    else:  # create_agent, embeddings, retrieval, ...: part of the run, not a decision or an action
        out[_KIND] = OpenInferenceSpanKindValues.CHAIN.value
    if attributes.get(gen_ai.GEN_AI_CONVERSATION_ID):
        out[SpanAttributes.SESSION_ID] = str(attributes[gen_ai.GEN_AI_CONVERSATION_ID])
    return replace(span, attributes={**attributes, **out})
