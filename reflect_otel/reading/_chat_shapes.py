"""Chat messages in any provider's shape, read by shape into the OTel GenAI conventions' parts-based form, and
written as OpenInference's flattened ``llm.input_messages`` / ``llm.output_messages`` attributes.

A message is ``{"role": ..., "parts": [...]}`` once read, each part one of the conventions' types that assembly
uses: ``text`` and ``reasoning`` (``content``), ``tool_call`` (``id``, ``name``, ``arguments``) and
``tool_call_response`` (``id``, ``response``). Recognised, by the keys present and never by a provider's name:

* the conventions' own parts (``gen_ai.input.messages`` / ``gen_ai.output.messages``, v1.37 and later);
* OpenAI chat completions (``content`` text or parts, ``tool_calls`` with ``function``, ``tool_call_id``, the
  older ``function_call``) and the Responses API's items (``input_text`` / ``output_text``, ``function_call``,
  ``function_call_output``, ``reasoning`` summaries); Mistral's (the same, ``thinking`` chunks, arguments as an
  object);
* Anthropic's content blocks (``text``, ``tool_use``, ``tool_result``, ``thinking``);
* Gemini's parts (``text``, ``thought``, ``functionCall``, ``functionResponse``) and ``model`` role;
* Bedrock Converse's content blocks (``text``, ``toolUse``, ``toolResult`` with ``text`` / ``json`` content,
  ``reasoningContent``);
* Cohere's v2 messages (``tool_plan``, ``document`` tool content) and v1 messages (``message``, upper-case roles,
  ``tool_calls`` with ``parameters``, ``tool_results``);
* the Vercel AI SDK's prompt parts (``tool-call`` / ``tool-result`` with ``toolCallId``, ``reasoning``).

Images, audio, files, URIs and provider-side (built-in) tool calls carry no text for a step and are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from reflect_otel import _values
from reflect_otel.reading.semconv import MessageAttributes, SpanAttributes, ToolAttributes, ToolCallAttributes
from reflect_otel.reading.spans import AttributeValue

__all__ = [
    "Message",
    "json_text",
    "message_text",
    "read_message",
    "read_messages",
    "read_parts",
    "write_messages",
    "write_tools",
]

Part = dict[str, Any]
Message = dict[str, Any]

_ROLES = {"model": "assistant", "chatbot": "assistant", "bot": "assistant", "function": "tool", "human": "user"}
"""Roles other APIs name differently (Gemini's ``model``, Cohere v1's ``CHATBOT``, the legacy ``function``)."""
_TEXT_TYPES = frozenset({"text", "input_text", "output_text", "summary_text", "refusal"})
_REASONING_TYPES = frozenset({"reasoning", "thinking"})
_TOOL_CALL_ID_FIELD = MessageAttributes.MESSAGE_TOOL_CALL_ID.removeprefix("message.")
_CALL_PREFIX = ToolCallAttributes.TOOL_CALL_FUNCTION_NAME.removesuffix("function.name")  # "tool_call."
_MAX_DEPTH = 4


def json_text(value: object) -> str:
    """A value as it would be sent: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)


def _text(content: str | None) -> list[Part]:
    return [{"type": "text", "content": content}] if content else []


def _call(call_id: object, name: object, arguments: object) -> Part:
    return {
        "type": "tool_call",
        "id": str(call_id) if call_id else None,
        "name": str(name or ""),
        "arguments": arguments,
    }


def _response(call_id: object, response: object) -> Part:
    return {"type": "tool_call_response", "id": str(call_id) if call_id else None, "response": response}


def _content_text(content: object) -> str:
    """Text out of a tool result's content: a string, or content blocks of any shape above, or JSON."""
    if isinstance(content, list):
        texts = [json_text(p.get("content")) for p in read_parts(content) if p["type"] in ("text", "reasoning")]
        if texts:
            return "\n".join(t for t in texts if t)
    if isinstance(content, Mapping) and "value" in content and "type" in content:  # AI SDK: {"type": "json", ...}
        return json_text(content["value"])
    return "" if content is None else json_text(content)


def _typed_part(part: Mapping[str, Any], kind: str) -> list[Part]:
    if kind in _TEXT_TYPES:
        text = part.get("content", part.get("text"))
        return _text(_values.as_text(text)) if text is not None else []
    if kind in _REASONING_TYPES:
        text = part.get("content", part.get("text", part.get("thinking")))
        if isinstance(text, list):  # Mistral's thinking chunks
            text = "\n".join(p["content"] for p in read_parts(text) if p["type"] == "text")
        if kind == "reasoning" and isinstance(part.get("summary"), list):  # OpenAI Responses' reasoning item
            text = "\n".join(p["content"] for p in read_parts(part["summary"]) if p["type"] == "text")
        return [{"type": "reasoning", "content": text}] if isinstance(text, str) and text else []
    if kind == "tool_call":  # the conventions' own
        return [_call(part.get("id"), part.get("name"), part.get("arguments"))]
    if kind == "tool_call_response":
        return [_response(part.get("id"), part.get("response"))]
    if kind in ("tool_use", "function_call"):  # Anthropic; OpenAI Responses
        arguments = part.get("input", part.get("arguments"))
        return [_call(part.get("call_id") or part.get("id"), part.get("name"), arguments)]
    if kind == "tool_result":  # Anthropic
        return [_response(part.get("tool_use_id"), _content_text(part.get("content")))]
    if kind == "function_call_output":  # OpenAI Responses
        return [_response(part.get("call_id"), _content_text(part.get("output")))]
    if kind == "tool-call":  # the Vercel AI SDK
        return [_call(part.get("toolCallId"), part.get("toolName"), part.get("input", part.get("args")))]
    if kind == "tool-result":
        output = part.get("output", part.get("result"))
        return [_response(part.get("toolCallId"), _content_text(output))]
    if kind == "document":  # Cohere v2's tool result content
        document = part.get("document")
        data = document.get("data") if isinstance(document, Mapping) else None
        return _text(_content_text(data)) if data is not None else []
    return []  # images, audio, files, URIs, provider-side tool calls: no text for a step


def _untyped_part(part: Mapping[str, Any]) -> list[Part]:
    """Gemini's parts and Bedrock Converse's content blocks, which say what they are by their one key."""
    if isinstance(part.get("text"), str):
        kind = "reasoning" if part.get("thought") is True else "text"
        return [{"type": kind, "content": part["text"]}] if part["text"] else []
    for key, id_key, args_key in (("functionCall", "id", "args"), ("toolUse", "toolUseId", "input")):
        call = part.get(key)
        if isinstance(call, Mapping):
            return [_call(call.get(id_key), call.get("name"), call.get(args_key))]
    response = part.get("functionResponse")
    if isinstance(response, Mapping):
        return [_response(response.get("id"), response.get("response"))]
    result = part.get("toolResult")
    if isinstance(result, Mapping):
        return [_response(result.get("toolUseId"), _content_text(result.get("content")))]
    if "json" in part:
        return _text(json_text(part["json"]))
    reasoning = part.get("reasoningContent")
    if isinstance(reasoning, Mapping) and isinstance(reasoning.get("reasoningText"), Mapping):
        text = reasoning["reasoningText"].get("text")
        return [{"type": "reasoning", "content": text}] if isinstance(text, str) and text else []
    return []


def read_parts(blocks: Sequence[object]) -> list[Part]:
    """Content blocks or parts of any shape above, in order; what carries no text or call is left out."""
    parts: list[Part] = []
    for block in blocks:
        if isinstance(block, str):
            parts += _text(block)
        elif isinstance(block, Mapping):
            kind = block.get("type")
            parts += _typed_part(block, kind) if isinstance(kind, str) else _untyped_part(block)
    return parts


def _role(message: Mapping[str, Any], default: str) -> str:
    role = message.get("role")
    if not isinstance(role, str) or not role:
        return default
    return _ROLES.get(role.lower(), role.lower() if role.isupper() else role)


def _message_calls(message: Mapping[str, Any]) -> list[Part]:
    """Calls beside the content: OpenAI's and Mistral's ``tool_calls`` (Cohere v2's too), the legacy
    ``function_call``, Cohere v1's ``{name, parameters}``, the AI SDK's ``{toolCallId, toolName, input}``."""
    calls: list[Part] = []
    listed = message.get("tool_calls")
    for call in listed if isinstance(listed, list) else []:
        if not isinstance(call, Mapping):
            continue
        nested = call.get("function")
        function: Mapping[str, Any] = nested if isinstance(nested, Mapping) else call
        if "toolName" in call:
            calls += read_parts([{**call, "type": "tool-call"}])
        else:
            arguments = function.get("arguments", function.get("parameters", function.get("args")))
            calls.append(_call(call.get("id"), function.get("name"), arguments))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        calls.append(_call(None, legacy.get("name"), legacy.get("arguments")))
    return calls


def read_message(message: Mapping[str, Any], default_role: str = "") -> Message:
    """One message of any shape above as ``{"role", "parts"}``."""
    role = _role(message, default_role)
    kind = message.get("type")
    if isinstance(kind, str) and kind not in ("message", "text") and "role" not in message:  # a Responses item
        parts = read_parts([message])
        role = "tool" if any(p["type"] == "tool_call_response" for p in parts) else default_role or "assistant"
        return {"role": role, "parts": parts}
    listed = message.get("parts")
    content = message.get("content")
    if isinstance(listed, list):
        parts = read_parts(listed)
    elif isinstance(content, list):
        parts = read_parts(content)
    elif isinstance(content, str):
        parts = _text(content)
    elif isinstance(message.get("message"), str):  # Cohere v1
        parts = _text(message["message"])
    else:
        parts = []
    if isinstance(message.get("tool_plan"), str):  # Cohere v2: the words beside its calls
        parts = _text(message["tool_plan"]) + parts
    parts += _message_calls(message)
    answered = message.get("tool_call_id") or (message.get("id") if role == "tool" else None)
    if role == "tool" and not any(p["type"] == "tool_call_response" for p in parts):
        text = "\n".join(json_text(p["content"]) for p in parts if p["type"] == "text")
        parts = [_response(answered, text if text or content is None else _content_text(content))]
    results = message.get("tool_results")  # Cohere v1: results of the calls before, in their order
    for result in results if isinstance(results, list) else []:
        if isinstance(result, Mapping):
            parts.append(_response(None, _content_text(result.get("outputs"))))
    return {"role": role, "parts": parts}


def read_messages(value: object, *, max_chars: int, default_role: str = "") -> list[Message]:
    """A JSON list of messages (or one message, or a list of JSON texts each one message) read by shape; [] when
    ``value`` is none of these or longer than ``max_chars``."""
    if isinstance(value, list | tuple):
        items: list[object] = [_values.parse_json(v) if isinstance(v, str) else v for v in value]
    elif isinstance(value, str) and len(value) <= max_chars:
        parsed = _values.parse_json(value)
        items = parsed if isinstance(parsed, list) else [parsed]
    else:
        return []
    return [read_message(m, default_role) for m in items if isinstance(m, Mapping)]


def message_text(message: Message) -> str:
    """What a message says in words: its reasoning, text and tool responses, in order."""
    texts = []
    for part in message["parts"]:
        kind = part.get("type")
        if kind in ("text", "reasoning") and part.get("content") is not None:
            texts.append(_values.as_text(part["content"]))
        elif kind == "tool_call_response" and part.get("response") is not None:
            texts.append(json_text(part["response"]))
    return "\n".join(t for t in texts if t)


def _split_responses(messages: list[Message]) -> list[Message]:
    """Each tool response its own ``tool`` message (Anthropic sends several as blocks of one user message)."""
    out: list[Message] = []
    for message in messages:
        responses = [p for p in message["parts"] if p.get("type") == "tool_call_response"]
        if not responses or (message["role"] == "tool" and len(responses) == 1):
            out.append(message)
            continue
        out += [{"role": "tool", "parts": [response]} for response in responses]
        rest = [p for p in message["parts"] if p.get("type") != "tool_call_response"]
        if rest:
            out.append({"role": message["role"], "parts": rest})
    return out


def write_messages(out: dict[str, AttributeValue], prefix: str, messages: list[Message]) -> None:
    """``messages`` as ``<prefix>N.message.role|content|tool_call_id|tool_calls.K.tool_call.*``."""
    for index, message in enumerate(_split_responses(messages)):
        base = f"{prefix}{index}.message."
        parts = message["parts"]
        out[base + "role"] = str(message.get("role") or "")
        out[base + "content"] = message_text(message)
        answered = next((p.get("id") for p in parts if p.get("type") == "tool_call_response" and p.get("id")), None)
        if answered:
            out[base + _TOOL_CALL_ID_FIELD] = str(answered)
        calls = [p for p in parts if p.get("type") == "tool_call"]
        for position, call in enumerate(calls):
            at = f"{base}tool_calls.{position}.{_CALL_PREFIX}"
            out[at + "function.name"] = str(call.get("name") or "")
            if call.get("id"):
                out[at + "id"] = str(call["id"])
            if call.get("arguments") is not None:
                out[at + "function.arguments"] = json_text(call["arguments"])


def write_tools(out: dict[str, AttributeValue], tools: Sequence[object]) -> None:
    """Tool definitions (objects, or JSON texts of objects) as OpenInference's ``llm.tools.N.tool.json_schema``, each
    as it is (read by shape in :mod:`reflect_otel.reading.tool_definitions`)."""
    index = 0
    for tool in tools:
        parsed = _values.parse_json(tool) if isinstance(tool, str) else tool
        if isinstance(parsed, Mapping):
            out[f"{SpanAttributes.LLM_TOOLS}.{index}.{ToolAttributes.TOOL_JSON_SCHEMA}"] = json.dumps(parsed)
            index += 1
