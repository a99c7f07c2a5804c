"""Reading untrusted attribute values: lenient JSON, message lists in the shapes frameworks serialise them.

Text is found by shape, never by framework name: a string; a list of parts or content blocks whose text parts
(``{"text": ...}``, ``{"type": "text", "text": ...}``, not a model's hidden ``thought``) are joined; a message or
event holding such a list under ``parts`` or ``content``; a tool result wrapped as a function response (``{"id",
"name", "response": ...}``), a ``tool_result`` block, or ``{"result": ...}`` / ``{"output": ...}`` (how LangChain.js
runs hold a tool's output, an lc-serialised ``ToolMessage`` among them)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_JSON_STARTS = ("{", "[", '"')
_HUMAN_ROLES = frozenset({"user", "human", "HumanMessage"})
_AI_ROLES = frozenset({"assistant", "ai", "model", "AIMessage", "AIMessageChunk"})
_TEXT_KEYS = (
    "question",
    "task",
    "query",
    "input",
    "user_msg",
    "prompt",
    "message",
    "answer",
    "final_answer",
    "final_output",
    "raw",
    "response",
    "output",
    "content",
    "text",
    "result",
    "description",
)
_MAX_DEPTH = 3
_REPR = re.compile(r"^\s*[A-Z]\w*\((?P<body>.*?)(?:\)\s*|\.\.\.)?$", re.DOTALL)
"""A Python object's repr, as frameworks write events and results: ``StopEvent(result='...')``, also when the
framework cut it short (``StopEvent(result=AgentOutput(... structured_resp...``)."""
_REPR_FIELD = re.compile(
    r"\b(?:"
    + "|".join(
        ("question", "query", "input", "user_msg", "answer", "raw", "response", "output", "content", "text", "result")
    )
    + r")=(?P<quote>['\"])(?P<text>(?:\\.|(?!(?P=quote)).)*)(?P=quote)",
    re.DOTALL,
)


def parse_json(value: object) -> Any | None:
    """``value`` parsed as JSON when it is a JSON object, array or string literal; otherwise None."""
    if not isinstance(value, str):
        return None
    stripped = value.lstrip()
    if not stripped.startswith(_JSON_STARTS):
        return None
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return None


def parts_text(value: object) -> str | None:
    """The text of a list of parts or content blocks (their text parts joined); None when ``value`` is not such a
    list or has no text part."""
    if not isinstance(value, list) or not value or not all(isinstance(part, Mapping) for part in value):
        return None
    texts = [
        part["text"]
        for part in value
        if isinstance(part.get("text"), str) and part.get("type", "text") == "text" and not part.get("thought")
    ]
    return "\n".join(t for t in texts if t) or None


def as_text(value: object) -> str:
    """Any JSON-ish value as display text: strings as they are, parts lists joined, the rest as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    text = parts_text(value)
    if text is not None:
        return text
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return str(value)


def _message_role_content(message: object) -> tuple[str, str, bool] | None:
    """(role, content, has_tool_calls) for OpenAI, LangChain and lc-serialised LangChain messages."""
    if not isinstance(message, Mapping):
        return None
    if "lc" in message and isinstance(message.get("kwargs"), Mapping):
        ids = message.get("id")
        role = str(ids[-1]) if isinstance(ids, list) and ids else str(message["kwargs"].get("type", ""))
        body: Mapping[str, Any] = message["kwargs"]
    elif isinstance(message.get("data"), Mapping) and "type" in message:
        role, body = str(message["type"]), message["data"]
    else:
        role, body = str(message.get("role", message.get("type", ""))), message
    content = body.get("content")
    text = as_text(content) if content is not None or "parts" not in body else (parts_text(body["parts"]) or "")
    return role, text, bool(body.get("tool_calls"))


def _messages(value: Any) -> list[Any] | None:
    if isinstance(value, Mapping):
        messages = value.get("messages", value.get("contents"))  # chat APIs' messages, Gemini's contents
        if isinstance(messages, list):
            # LangChain chat-model inputs are a batch: a list holding one list of messages.
            if len(messages) == 1 and isinstance(messages[0], list):
                return list(messages[0])
            return messages
    return None


def question_text(value: object, *, whole: bool = True) -> str:
    """The task a span's input value states: the first user message of a message list, a known text field, or the
    value itself (with ``whole=False``, "" instead: a JSON object without a known field, such as a workflow's
    state, names no question)."""
    parsed = parse_json(value)
    if parsed is None:
        return _repr_text(value) if isinstance(value, str) else ""
    messages = _messages(parsed)
    if messages is not None:
        for message in messages:
            found = _message_role_content(message)
            if found and found[0] in _HUMAN_ROLES and found[1]:
                return found[1]
        return ""
    text = _text_field(parsed, 0)
    return text if text is not None else as_text(parsed) if whole else ""


def answer_text(value: object) -> str:
    """The answer a span's output value states: the last assistant message without tool calls, an OpenAI response's
    first choice, a known text field, or the value itself."""
    parsed = parse_json(value)
    if parsed is None:
        return _repr_text(value) if isinstance(value, str) else ""
    messages = _messages(parsed)
    if messages is not None:
        for message in reversed(messages):
            found = _message_role_content(message)
            if found and found[0] in _AI_ROLES and not found[2] and found[1]:
                return found[1]
        return ""
    if isinstance(parsed, Mapping) and isinstance(parsed.get("choices"), list) and parsed["choices"]:
        choice = parsed["choices"][0]
        if isinstance(choice, Mapping) and isinstance(choice.get("message"), Mapping):
            return as_text(choice["message"].get("content"))
    return _known_text(parsed)


def _known_text(parsed: Any) -> str:
    found = _text_field(parsed, 0)
    return found if found is not None else as_text(parsed)


def _text_field(parsed: Any, depth: int) -> str | None:
    """A known text field of a JSON object, looked for inside nested objects too (a workflow's ``init_state``, a
    crew's task), breadth first so the outermost wins; None when there is none."""
    if isinstance(parsed, str):
        return _repr_text(parsed)
    if not isinstance(parsed, Mapping) or depth > _MAX_DEPTH:
        return None
    for key in _TEXT_KEYS:
        if isinstance(parsed.get(key), str) and parsed[key].strip():
            return _repr_text(str(parsed[key]))
    for key in (*_TEXT_KEYS, "parts"):  # a message or event: its text parts or content blocks
        text = parts_text(parsed.get(key))
        if text is not None:
            return text
    for key in (*_TEXT_KEYS, *parsed.keys()):
        nested = parsed.get(key)
        if isinstance(nested, Mapping):
            found = _text_field(nested, depth + 1)
            if found is not None:
                return found
    return None


def _repr_text(text: str) -> str:
    """The text field of a Python repr (``StopEvent(result='The answer is 396.')`` -> ``The answer is 396.``);
    any other text as it is."""
    shape = _REPR.match(text)
    if shape is None:
        return text
    field = _REPR_FIELD.search(shape["body"])
    if field is None:
        return text
    try:
        return str(json.loads('"' + field["text"].replace('"', '\\"').replace("\\'", "'") + '"'))
    except ValueError:
        return field["text"]


_FUNCTION_RESPONSE_KEYS = frozenset({"id", "name", "response", "will_continue", "scheduling", "parts"})
"""A function response: the call's id and name around the tool's ``response`` (Gemini, Google ADK)."""


def _result_wrapper(parsed: Mapping[str, Any]) -> tuple[str | None, Any] | None:
    """(call id, wrapped value) when ``parsed`` is a function response or a ``tool_result`` content block."""
    if "response" in parsed and parsed.keys() <= _FUNCTION_RESPONSE_KEYS:
        call_id = parsed.get("id")
        return (str(call_id) if call_id else None), parsed["response"]
    if parsed.get("type") == "tool_result" and "content" in parsed:
        call_id = parsed.get("tool_use_id")
        return (str(call_id) if call_id else None), parsed["content"]
    return None


def _unwrapped(value: Any) -> Any:
    """A tool's result out of its wrappers: function responses, ``tool_result`` blocks, ``{"result": ...}``, and
    result objects whose content is text parts (MCP's ``CallToolResult`` ``content``, LlamaIndex's ``ToolOutput``
    ``blocks``)."""
    for _ in range(_MAX_DEPTH):
        if isinstance(value, Mapping):
            wrapper = _result_wrapper(value)
            if wrapper is not None:
                value = wrapper[1]
                continue
            if value.keys() in ({"result"}, {"output"}):
                value = next(iter(value.values()))
                continue
            for key in ("content", "blocks"):
                text = parts_text(value.get(key))
                if text is not None:
                    return text
        text = parts_text(value)
        return text if text is not None else value
    return value


def tool_result_text(value: object) -> object:
    """A tool result as the model reads it: the value out of its wrappers (see the module docstring), else
    ``value``. A string that is not JSON is returned as it is."""
    parsed = parse_json(value) if isinstance(value, str) else value
    if parsed is None:
        return value
    unwrapped = _unwrapped(parsed)
    return value if unwrapped is parsed and isinstance(value, str) else unwrapped


def tool_message(value: object) -> tuple[str | None, str] | None:
    """(tool_call_id, content) when ``value`` is a tool's answer that names its call: a serialised LangChain
    ``ToolMessage``, a function response, or a ``tool_result`` block; otherwise None."""
    parsed = parse_json(value)
    if isinstance(parsed, Mapping) and parsed.keys() == {"output"}:  # a LangChain.js run's outputs
        parsed = parsed["output"]
    if not isinstance(parsed, Mapping):
        return None
    wrapper = _result_wrapper(parsed)
    if wrapper is not None:
        return wrapper[0], as_text(_unwrapped(wrapper[1]))
    if "lc" in parsed and isinstance(parsed.get("kwargs"), Mapping):
        body: Mapping[str, Any] = parsed["kwargs"]
    elif isinstance(parsed.get("data"), Mapping):
        body = parsed["data"]
    else:
        body = parsed
    if body.get("type") != "tool" and "tool_call_id" not in body:
        return None
    call_id = body.get("tool_call_id")
    return (str(call_id) if call_id else None), as_text(body.get("content"))


def _call_arguments(parsed: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of a recorded Python call, ``{"args": [...], "kwargs": {...}}`` (``args`` may be absent) plus at
    most some flags of the
    wrapper (true/false), as instrumentations that wrap ``__call__`` write them: the keyword arguments, with the
    positional ones under ``args`` when there are any. None for any other object."""
    args, kwargs = parsed.get("args", []), parsed.get("kwargs")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return None
    if any(not isinstance(v, bool | None) for k, v in parsed.items() if k not in ("args", "kwargs")):
        return None  # other data: these are the tool's own arguments, named args and kwargs
    return ({"args": args} if args else {}) | kwargs


def tool_args(value: object) -> dict[str, Any]:
    """Tool-call arguments as a dict: a JSON object as it is (a recorded Python call unwrapped to its arguments);
    anything else under the key ``input``."""
    parsed = parse_json(value)
    if isinstance(parsed, dict):
        unwrapped = _call_arguments(parsed)
        return unwrapped if unwrapped is not None else parsed
    if value is None or value == "":
        return {}
    return {"input": parsed if parsed is not None else value}


def to_int(value: object) -> int | None:
    """An integer attribute that some instrumentations write as a string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut (:func:`untruncated` reads it back)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[truncated {len(text) - limit} chars]"


_TRUNCATED = re.compile(r"…\[truncated ([0-9]{1,12}) chars\]\Z")


def untruncated(text: str) -> tuple[str, int]:
    """What :func:`truncate` kept of a text and how many characters it cut (0 when ``text`` was not cut)."""
    found = _TRUNCATED.search(text)
    return (text[: found.start()], int(found.group(1))) if found else (text, 0)


def utf8_text(text: str) -> str:
    """``text`` with lone surrogates (JSON may carry ``"\\ud800"``, which no UTF-8 writer accepts) replaced."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def utf8_clean(value: Any) -> Any:
    """Parsed JSON with :func:`utf8_text` applied to every string, keys included."""
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, dict):
        return {utf8_text(k) if isinstance(k, str) else k: utf8_clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [utf8_clean(v) for v in value]
    return value
