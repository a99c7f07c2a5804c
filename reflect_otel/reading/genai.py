"""Spans that follow the OpenTelemetry GenAI semantic conventions, read as OpenInference spans.

Assembly speaks OpenInference; a span that carries ``gen_ai.operation.name`` and no ``openinference.span.kind`` is
translated here, once, into the OpenInference attributes that say the same thing, so every rule of assembly
applies to both conventions alike. Followed: the GenAI conventions of OpenTelemetry semantic conventions v1.37 and
later (messages as parts-based JSON in ``gen_ai.input.messages``, ``gen_ai.output.messages`` and
``gen_ai.system_instructions``; the schemas in open-telemetry/semantic-conventions-genai,
``docs/gen-ai/gen-ai-input-messages.json`` and ``gen-ai-output-messages.json``), with attribute names taken from
``opentelemetry-semantic-conventions`` (v1.44 at the time of writing). The messages may be JSON text or structured
attribute values, on the span or on its ``gen_ai.client.inference.operation.details`` event, and in the
conventions' parts or a provider API's own shape (read in :mod:`reflect_otel.reading._chat_shapes`); of several choices
(output messages each with a ``finish_reason``), the first is the reply. The indexed ``gen_ai.prompt.N.*`` /
``gen_ai.completion.N.*`` attributes that OpenLLMetry writes are read too. Spans of the Vercel AI SDK (``ai.*``)
are read in :mod:`reflect_otel.reading.vercel_ai`.

The event-based form of v1.36 and before is read from span events: ``gen_ai.system.message``,
``gen_ai.user.message``, ``gen_ai.assistant.message``, ``gen_ai.tool.message`` (inputs, in order) and
``gen_ai.choice`` (outputs; its ``tool_calls`` inside its ``message`` or beside it; of several, the one of index 0),
their body as attributes (``content``, ``tool_calls``, ``id``, ``message``, or the whole
body as JSON in ``gen_ai.event.content``); and the span events of v1.26-v1.28, ``gen_ai.content.prompt`` /
``gen_ai.content.completion`` with the messages as JSON in ``gen_ai.prompt`` / ``gen_ai.completion``. Those
events sent as log records (the Events API) never reach a trace collector: export them as span events, or use
v1.37's attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from reflect_otel import _values
from reflect_otel.reading._chat_shapes import (
    Message,
    json_text,
    message_text,
    read_message,
    read_messages,
    read_parts,
    write_messages,
    write_tools,
)
from reflect_otel.reading.semconv import (
    INPUT_MESSAGES_PREFIX,
    OUTPUT_MESSAGES_PREFIX,
    OpenInferenceSpanKindValues,
    SpanAttributes,
    ToolCallAttributes,
)
from reflect_otel.reading.spans import AttributeValue, SpanEvent, SpanRecord
from reflect_otel.reading.vercel_ai import is_vercel_ai
from reflect_otel.reading.vercel_ai import openinference_attributes as vercel_ai_attributes

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
_TOOL_EVENT = "gen_ai.tool.message"
_EVENT_BODY = "gen_ai.event.content"
_PROMPT_EVENT, _PROMPT_ATTRIBUTE = "gen_ai.content.prompt", "gen_ai.prompt"
_COMPLETION_EVENT, _COMPLETION_ATTRIBUTE = "gen_ai.content.completion", "gen_ai.completion"
_KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
_DETAILS_EVENT = "gen_ai.client.inference.operation.details"


def _messages(value: object, default_role: str = "") -> list[Message]:
    return read_messages(value, max_chars=MAX_MESSAGES_JSON_CHARS, default_role=default_role)


def _output_messages(value: object) -> list[Message]:
    """``gen_ai.output.messages``: the model's reply; of several choices (each with its ``finish_reason``), the
    first, which is the one an application reads."""
    messages = _messages(value, "assistant")
    raw = value if isinstance(value, list | tuple) else _values.parse_json(value) if isinstance(value, str) else None
    if len(messages) > 1 and isinstance(raw, list) and all(_is_choice(m) for m in raw):
        return messages[:1]
    return messages


def _is_choice(message: object) -> bool:
    parsed = _values.parse_json(message) if isinstance(message, str) else message
    return isinstance(parsed, Mapping) and "finish_reason" in parsed


def _legacy_messages(attributes: Mapping[str, AttributeValue], prefix: str) -> list[Message]:
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
    return [read_message(messages[i]) for i in sorted(messages)]


def _event_body(attributes: Mapping[str, AttributeValue]) -> Mapping[str, Any]:
    body = _values.parse_json(attributes.get(_EVENT_BODY)) if _EVENT_BODY in attributes else None
    if isinstance(body, Mapping):
        return body
    out: dict[str, Any] = dict(attributes)
    for key in ("tool_calls", "message", "content"):
        value = out.get(key)
        parsed = _values.parse_json(value) if isinstance(value, str) else None
        blocks = isinstance(parsed, list) and bool(parsed) and all(isinstance(b, Mapping) for b in parsed)
        if parsed is not None and (key != "content" or blocks):  # content: text, or a JSON list of content blocks
            out[key] = parsed
    return out


def _choice(body: Mapping[str, Any]) -> Message:
    """A ``gen_ai.choice`` body: its ``message``, with the ``tool_calls`` the conventions put beside it. A message
    that is a list of content blocks (Strands Agents writes Bedrock's ``{"text"}`` / ``{"toolUse"}``) is the
    assistant's content."""
    message = body.get("message")
    if isinstance(message, list):
        message = {"role": "assistant", "content": message}
    merged = dict(message) if isinstance(message, Mapping) else {}
    if "tool_calls" in body and "tool_calls" not in merged:
        merged["tool_calls"] = body["tool_calls"]
    return read_message(merged or body, "assistant")


def _event_messages(events: tuple[SpanEvent, ...]) -> tuple[list[Message], list[Message]]:
    """(inputs, outputs) from GenAI events of v1.28-v1.36 (of several choices, the one of index 0), or the
    prompt/completion events of v1.26-v1.27."""
    inputs: list[Message] = []
    choices: list[tuple[int, Message]] = []
    outputs: list[Message] = []
    for event in events:
        if event.name in _INPUT_EVENTS:
            inputs.append(read_message(_event_body(event.attributes), _INPUT_EVENTS[event.name]))
        elif event.name == _CHOICE_EVENT:
            body = _event_body(event.attributes)
            index = _values.to_int(body.get("index"))
            choices.append((index if index is not None else len(choices), _choice(body)))
        elif event.name == _PROMPT_EVENT:
            inputs += _messages(event.attributes.get(_PROMPT_ATTRIBUTE), "user")
        elif event.name == _COMPLETION_EVENT:
            outputs += _messages(event.attributes.get(_COMPLETION_ATTRIBUTE), "assistant")
    if choices:
        outputs.append(min(choices, key=lambda choice: choice[0])[1])
    return inputs, outputs


def _has_genai_events(events: tuple[SpanEvent, ...]) -> bool:
    names = {*_INPUT_EVENTS, _CHOICE_EVENT, _PROMPT_EVENT, _COMPLETION_EVENT, _DETAILS_EVENT}
    return any(event.name in names for event in events)


def _with_details(span: SpanRecord) -> Mapping[str, AttributeValue]:
    """The span's attributes, completed by its ``gen_ai.client.inference.operation.details`` events' (v1.37 and
    later: the messages as attributes of an event rather than of the span; Strands Agents writes one event per
    attribute, the instructions, the input and the output apart: all are read, a later one over an earlier)."""
    details: dict[str, AttributeValue] = {}
    for event in span.events:
        if event.name == _DETAILS_EVENT:
            details.update(event.attributes)
    return {**details, **span.attributes} if details else span.attributes


def _system_message(value: object) -> list[Message]:
    if isinstance(value, str) and value and len(value) <= MAX_MESSAGES_JSON_CHARS:
        parsed = _values.parse_json(value)
        parts = read_parts(parsed) if isinstance(parsed, list) else [{"type": "text", "content": value}]
        return [{"role": "system", "parts": parts}]
    return []


def _llm(span: SpanRecord, out: dict[str, AttributeValue]) -> None:
    attributes = _with_details(span)
    event_inputs, event_outputs = _event_messages(span.events) if span.events else ([], [])
    inputs = (
        _messages(attributes.get(gen_ai.GEN_AI_INPUT_MESSAGES))
        or _legacy_messages(attributes, _LEGACY_PROMPT)
        or event_inputs
    )
    outputs = (
        _output_messages(attributes.get(gen_ai.GEN_AI_OUTPUT_MESSAGES))
        or _legacy_messages(attributes, _LEGACY_COMPLETION)
        or event_outputs
    )
    raw_output = attributes.get(gen_ai.GEN_AI_OUTPUT_MESSAGES)
    if not outputs and isinstance(raw_output, str) and raw_output:  # unreadable: keep its text, never drop it
        out[SpanAttributes.OUTPUT_VALUE] = raw_output[:MAX_MESSAGES_JSON_CHARS]
    _write_tools(out, attributes.get(_TOOL_DEFINITIONS))
    inputs = _system_message(attributes.get(gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS)) + inputs
    write_messages(out, INPUT_MESSAGES_PREFIX, inputs)
    write_messages(out, OUTPUT_MESSAGES_PREFIX, outputs)
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
    """``gen_ai.tool.definitions`` (a JSON array of tool objects) as OpenInference's ``llm.tools``."""
    text = value if isinstance(value, str) and len(value) <= MAX_MESSAGES_JSON_CHARS else None
    tools = _values.parse_json(text) if text is not None else value if isinstance(value, list | tuple) else None
    if isinstance(tools, list | tuple):
        write_tools(out, tools)


def _last_text(messages: list[Message], role: str | None) -> str:
    for message in reversed(messages):
        if role is None or message.get("role") == role:
            text = message_text(message)
            if text:
                return text
    return ""


def _agent(span: SpanRecord, out: dict[str, AttributeValue]) -> None:
    """An ``invoke_agent`` span: its name, and the question and answer of its messages (attributes, the details
    event, or the older per-message events)."""
    attributes = _with_details(span)
    name = attributes.get(gen_ai.GEN_AI_AGENT_NAME) or attributes.get(_WORKFLOW_NAME)
    if name:
        out[SpanAttributes.AGENT_NAME] = str(name)
    event_inputs, event_outputs = _event_messages(span.events) if span.events else ([], [])
    inputs = _messages(attributes.get(gen_ai.GEN_AI_INPUT_MESSAGES)) or event_inputs
    outputs = _output_messages(attributes.get(gen_ai.GEN_AI_OUTPUT_MESSAGES)) or event_outputs
    question = _last_text(inputs, "user")
    answer = _last_text(outputs, None)
    if question:
        out.setdefault(SpanAttributes.INPUT_VALUE, question)
    if answer:
        out.setdefault(SpanAttributes.OUTPUT_VALUE, answer)


def _tool(span: SpanRecord, out: dict[str, AttributeValue]) -> None:
    """An ``execute_tool`` span: the call's arguments and result as attributes, else as its messages (the details
    event's ``tool_call`` and ``tool_call_response`` parts, or the older events: ``gen_ai.tool.message`` holding
    the arguments and ``gen_ai.choice`` the result, as Strands Agents writes them)."""
    attributes = _with_details(span)
    name = attributes.get(gen_ai.GEN_AI_TOOL_NAME) or span.name.removeprefix(_TOOL_OPERATION).strip()
    out[SpanAttributes.TOOL_NAME] = str(name or span.name)
    if attributes.get(gen_ai.GEN_AI_TOOL_CALL_ID):
        out[ToolCallAttributes.TOOL_CALL_ID] = str(attributes[gen_ai.GEN_AI_TOOL_CALL_ID])
    arguments, result = _tool_messages(span, attributes)
    if gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS in attributes:
        arguments = attributes[gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS]
    if gen_ai.GEN_AI_TOOL_CALL_RESULT in attributes:
        result = attributes[gen_ai.GEN_AI_TOOL_CALL_RESULT]
    if arguments is not None:
        out.setdefault(SpanAttributes.INPUT_VALUE, json_text(arguments))
    if result is not None:
        out.setdefault(SpanAttributes.OUTPUT_VALUE, json_text(result))


def _tool_messages(span: SpanRecord, attributes: Mapping[str, AttributeValue]) -> tuple[object, object]:
    """(arguments, result) of a tool span's messages; None for what they do not carry."""
    arguments: object = None
    result: object = None
    for message in _messages(attributes.get(gen_ai.GEN_AI_INPUT_MESSAGES)):
        for part in message["parts"]:
            if part["type"] == "tool_call" and part.get("arguments") is not None:
                arguments = part["arguments"]
    for message in _messages(attributes.get(gen_ai.GEN_AI_OUTPUT_MESSAGES)):
        for part in message["parts"]:
            if part["type"] == "tool_call_response" and part.get("response") is not None:
                result = part["response"]
    for event in span.events:
        if event.name == _TOOL_EVENT and arguments is None:
            body = _event_body(event.attributes)
            arguments = body.get("content")
        elif event.name == _CHOICE_EVENT and result is None:
            result = message_text(_choice(_event_body(event.attributes))) or None
    return arguments, result


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
    if is_vercel_ai(attributes):
        return replace(span, attributes={**attributes, **vercel_ai_attributes(attributes, span.name)})
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
        _agent(span, out)
    else:  # create_agent, embeddings, retrieval, ...: part of the run, not a decision or an action
        out[_KIND] = OpenInferenceSpanKindValues.CHAIN.value
    if attributes.get(gen_ai.GEN_AI_CONVERSATION_ID):
        out[SpanAttributes.SESSION_ID] = str(attributes[gen_ai.GEN_AI_CONVERSATION_ID])
    return replace(span, attributes={**attributes, **out})
