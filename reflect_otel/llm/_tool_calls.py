"""Native tool calling on the embedded llama.cpp server: the chat handler ``reflect-tools`` that
:mod:`reflect_otel.llm._llama_server` registers, so an OpenAI tool loop (``tools``, ``tool_choice="auto"``, streamed
or not) runs on the local model as on any OpenAI-compatible endpoint.

llama-cpp-python's server, started on the model's own chat template, renders the tools but returns whatever the model
writes as text: a call comes back as ``<tool_call>{...}</tool_call>`` in the content, never as ``tool_calls``. Its
``chatml-function-calling`` format returns calls but drops ``tool`` messages from the prompt, so the model never sees
a result. This handler keeps the model's own template (which knows tools, calls and results for Qwen2.5 and other
Hermes-style templates) and translates at both ends:

- the request: the server's request model accepts an assistant message with ``content: null`` (it answered 500),
  and a message's ``content: null`` (an assistant turn that only calls tools, as every tool loop sends it)
  becomes ``""``, and a call's ``arguments`` JSON text becomes the object the template writes; a template that does
  not render tools gets them described in the system message, in the same ``<tool_call>`` form;
- the reply, with ``tool_choice="auto"``: the model writes its turn under a grammar made from the tools' JSON schemas
  (:func:`reply_grammar`), so what it writes is either a valid call of one of the tools (in the template's
  ``<tool_call>`` form, or a bare JSON object, after text or not) or a plain message: one that does not begin with a
  tag, a JSON object or a tool's name (a small model otherwise writes ``<tools></tools>`` or ``final_answer,42``
  where a call belongs, and its loop stops with no call). Decoding is as the request asks (greedy at temperature 0,
  so a replay through this server repeats). The call is returned as ``tool_calls``, text before it as ``content``.
  ``"required"`` decodes a call under the tools' schemas at once; a named function, ``"none"`` and requests without
  tools go to the template's own handler.

One call per turn (the first one the model writes). With ``stream`` the reply is sent as chunks once decided.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

__all__ = ["HANDLER_NAME", "accept_null_content", "register", "reply_grammar"]

HANDLER_NAME = "reflect-tools"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FALLBACK_MAX_TOKENS = 1024
_MAX_CALL_CHARS = 20_000
_MAX_OBJECT_STARTS = 50
"""A call is looked for at the first 50 ``{`` of the model's first 20,000 characters (its text is bounded; so is the
search)."""
_TAGGED = re.compile(r"<(\w+)>\s*(\{.*?\})\s*</\1>|```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)

_TOOLS_SYSTEM = """

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's messages as the model's chat template takes them (see the module)."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("content") is None:
            message["content"] = ""
        calls = message.get("tool_calls")
        if calls:
            fixed = []
            for call in calls:
                call = dict(call)
                function = dict(call.get("function") or {})
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    with contextlib.suppress(ValueError):
                        function["arguments"] = json.loads(arguments)
                call["function"] = function
                fixed.append(call)
            message["tool_calls"] = fixed
        out.append(message)
    return out


def _names(tools: list[dict[str, Any]]) -> list[str]:
    return [str((t.get("function") or {}).get("name")) for t in tools if (t.get("function") or {}).get("name")]


def _call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One call of one of ``tools``: ``{"name": <tool>, "arguments": <its parameters>}``."""
    options = []
    for tool in tools:
        function = tool.get("function") or {}
        parameters = function.get("parameters") or {"type": "object"}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": function.get("name")}, "arguments": parameters},
                "required": ["name", "arguments"],
            }
        )
    return options[0] if len(options) == 1 else {"oneOf": options}


_RULE = "reflect"
"""The prefix of this module's grammar rules (the JSON-schema converter's own rules have no prefix)."""
_NOT_A_START = "<{ \t\r\n"
"""What a plain message may not begin with: a tag, a JSON object, or blank space."""
_TEXT_CHAR = f'{_RULE}-char ::= [^<] | "<" [^a-zA-Z/!?<]'
"""A character of a plain message: anything but the start of a tag (``<tool_call>``, ``<tools>``, ``</...>``), so a
model that begins a tag mid-text can only go on into a call."""


def _gbnf_char(char: str) -> str:
    """``char`` as GBNF writes it inside a literal or a character class: ASCII letters and digits as they are,
    anything else by its code point."""
    if char.isascii() and char.isalnum():
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x80 else (f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")


def _either_case(char: str) -> str:
    """``char`` in either case, as a GBNF character class (a literal when it has one case only)."""
    cases = sorted({char, char.upper()})
    return f"[{''.join(_gbnf_char(c) for c in cases)}]" if len(cases) > 1 else f'"{_gbnf_char(char)}"'


def _message_rules(names: list[str]) -> list[str]:
    """The rules of a plain message (``reflect-text``): text that does not begin with a tag, a JSON object, blank
    space or one of ``names`` in any case (the default model wrote ``Final_answer("...")`` once ``final_answer`` was
    refused). The names are spelt out as a trie of their lower-case letters: at each letter the message may leave
    every name (any other character, then any text), go on along one in either case (never to its last letter), or,
    past its first letter, stop."""
    rules: list[str] = []
    counter = itertools.count()
    folded = {n.lower() for n in names}

    def node(prefix: str) -> str:
        name = f"{_RULE}-start" if not prefix else f"{_RULE}-n{next(counter)}"
        following = sorted({n[len(prefix)] for n in folded if n.startswith(prefix) and len(n) > len(prefix)})
        alternatives = [
            f"{_either_case(c)} {node(prefix + c)}" for c in following if prefix + c not in folded
        ]  # a name's last letter is never written: the message would begin with the name
        spelt = {v for c in following for v in (c, c.upper())}
        leave = "".join(_gbnf_char(c) for c in sorted(spelt | set(_NOT_A_START if not prefix else "<")))
        alternatives.append(f"[^{leave}] {_RULE}-char*")
        body = " | ".join(alternatives)
        rules.append(f"{name} ::= {body}" if not prefix else f"{name} ::= ({body})?")
        return name

    node("")
    return [*rules, f"{_RULE}-text ::= {_RULE}-start", _TEXT_CHAR]


def reply_grammar(tools: list[dict[str, Any]]) -> str:
    """The GBNF grammar of a reply to a request that carries ``tools`` (``tool_choice="auto"``): a call of one of
    them, each with its JSON schema's arguments (``<tool_call>`` then the call object then ``</tool_call>``, or the
    bare object), a plain message (:func:`_message_rules`), or a plain message followed by a call."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    call = json_schema_to_gbnf(json.dumps(_call_schema(tools)))
    call = re.sub(r"^root ::=", f"{_RULE}-call ::=", call, count=1, flags=re.MULTILINE)
    tagged = f'{_RULE}-tagged ::= "{OPEN}\\n" {_RULE}-call "\\n{CLOSE}"'
    root = f"root ::= {_RULE}-tagged | {_RULE}-call | {_RULE}-text {_RULE}-tagged?"
    return "\n".join([root, tagged, *_message_rules(_names(tools)), call.strip()]) + "\n"


def _call_of(value: object, names: list[str]) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` when ``value`` is ``{"name": <one of names>, "arguments": {...}}`` (or ``parameters``;
    arguments as an object or as its JSON text)."""
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return (str(value["name"]), arguments) if isinstance(arguments, dict) else None


def _parsed_call(text: str, names: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The call ``text`` writes: the whole text as one call object, else the first call object inside it. Qwen2.5's
    own template shows the call form as ``{{"name": ...}}`` (a Jinja string literal, rendered as written), and the
    model copies the doubled braces: ``{{"name": "f", "arguments": {}}}`` is read as the call it wraps."""
    stripped = text.strip()
    try:
        return _call_of(json.loads(stripped), names)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for match in list(re.finditer(r"\{", stripped[:_MAX_CALL_CHARS]))[:_MAX_OBJECT_STARTS]:
        try:
            value, _ = decoder.raw_decode(stripped, match.start())
        except ValueError:
            continue
        call = _call_of(value, names)
        if call is not None:
            return call
    return None


def _written_call(text: str, names: list[str]) -> tuple[int, str, bool] | None:
    """Where the model started a call in ``text``, the call's text, and whether it is in the template's form."""
    start = text.find(OPEN)
    if start >= 0:
        return start, text[start + len(OPEN) :].split(CLOSE, 1)[0], True
    for match in _TAGGED.finditer(text):
        body = match.group(2) or match.group(3) or ""
        if _parsed_call(body, names) is not None:
            return match.start(), body, False
    stripped = text.strip()
    if stripped.startswith("{") and _parsed_call(stripped, names) is not None:
        return text.find("{"), stripped, False
    return None


class _Formatter:
    """The model's own chat template (from its GGUF metadata), rendering prompts with or without tools."""

    def __init__(self, llama: Any) -> None:
        from llama_cpp import llama_chat_format

        template = llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError("the model has no chat template for tool calling (tokenizer.chat_template)")
        eos_id, bos_id = llama.token_eos(), llama.token_bos()
        self.eos = llama._model.token_get_text(eos_id) if eos_id != -1 else ""
        bos = llama._model.token_get_text(bos_id) if bos_id != -1 else ""
        formatter: Any = llama_chat_format.Jinja2ChatFormatter(template=template, eos_token=self.eos, bos_token=bos)
        self._jinja = formatter  # Any: it is annotated with llama_types' TypedDicts; requests arrive as plain dicts
        probe = [{"role": "user", "content": "x"}]
        tool = [{"type": "function", "function": {"name": "reflect_probe_tool", "parameters": {"type": "object"}}}]
        self.renders_tools = "reflect_probe_tool" in self._jinja(messages=probe, tools=tool).prompt

    def prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        if not self.renders_tools:
            described = _TOOLS_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
            if messages and messages[0].get("role") == "system":
                messages = [{**messages[0], "content": f"{messages[0]['content']}{described}"}, *messages[1:]]
            else:
                messages = [{"role": "system", "content": described.strip()}, *messages]
            return str(self._jinja(messages=messages).prompt)
        return str(self._jinja(messages=messages, tools=tools).prompt)


_formatters: dict[int, _Formatter] = {}


def _formatter(llama: Any) -> _Formatter:
    key = id(llama)
    if key not in _formatters:
        _formatters[key] = _Formatter(llama)
    return _formatters[key]


_SAMPLING = ("top_p", "top_k", "min_p", "typical_p", "seed", "presence_penalty", "frequency_penalty", "repeat_penalty")


class _Completion:
    """Raw completions of one chat request at its temperature, length and sampling, their token usage summed."""

    def __init__(self, llama: Any, request: dict[str, Any]) -> None:
        self.llama = llama
        self.temperature = request.get("temperature", 0.2)
        self.max_tokens = request.get("max_tokens")
        self.sampling = {k: request[k] for k in _SAMPLING if request.get(k) is not None}
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}

    def __call__(self, text: str, **extra: Any) -> dict[str, Any]:
        tokens = self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        options = {"temperature": self.temperature, "max_tokens": self.max_tokens, **self.sampling, **extra}
        result: dict[str, Any] = self.llama.create_completion(prompt=tokens, stream=False, **options)
        for key in self.usage:
            self.usage[key] += int(result.get("usage", {}).get(key, 0))
        return result


def handler(*, llama: Any, messages: list[dict[str, Any]], **request: Any) -> Any:
    """The ``reflect-tools`` chat handler (llama-cpp-python's handler signature: ``tools``, ``tool_choice``,
    ``stream``, ``temperature``, ``max_tokens`` and the sampling options come as keywords; see the module)."""
    template_messages = _template_messages(messages)
    tools, tool_choice = request.get("tools"), request.get("tool_choice")
    if not tools or tool_choice == "none" or isinstance(tool_choice, dict):
        offered = tools if isinstance(tool_choice, dict) else None
        passed = {**request, "tools": offered, "tool_choice": tool_choice if offered else None}
        passed.setdefault("temperature", 0.2)
        return _template_handler(llama)(llama=llama, messages=template_messages, **passed)
    return _tool_reply(_formatter(llama), template_messages, _Completion(llama, request), request)


def _tool_reply(
    formatter: _Formatter, messages: list[dict[str, Any]], complete: _Completion, request: dict[str, Any]
) -> Any:
    """A reply to a request with tools: a valid call of one of them or a plain message (under the reply grammar),
    else, when a call is required or was cut short, a call decoded under the tools' JSON schema."""
    from llama_cpp import llama_grammar

    tools, stream = request["tools"], bool(request.get("stream", False))
    names = _names(tools)
    prompt = formatter.prompt(messages, tools)
    content, call = "", None
    if request.get("tool_choice") != "required":  # a call of one of the tools, or a plain message: nothing else
        reply = llama_grammar.LlamaGrammar.from_string(reply_grammar(tools), verbose=False)
        first = complete(prompt, stop=[formatter.eos, CLOSE], grammar=reply)
        written = first["choices"][0]["text"]
        found = _written_call(written, names)
        if found is None:
            return _reply(first, written.strip(), None, complete.usage, stream)
        start, body, _ = found
        content = written[:start].strip()
        call = _parsed_call(body, names)
        prompt += written[:start]
        if call is not None:
            return _reply(first, content, call, complete.usage, stream)
    # "required", or a call cut short (max_tokens) that the grammar let the model begin
    grammar = llama_grammar.LlamaGrammar.from_json_schema(json.dumps(_call_schema(tools)), verbose=False)
    constrained = complete(f"{prompt}{OPEN}\n", grammar=grammar, max_tokens=complete.max_tokens or _FALLBACK_MAX_TOKENS)
    call = _parsed_call(constrained["choices"][0]["text"], names)
    if call is None:
        raise ValueError("the model's constrained tool call did not parse")
    return _reply(constrained, content, call, complete.usage, stream)


def _template_handler(llama: Any) -> Any:
    """The model's own chat-template handler (ChatML where it has none): for a request this handler does not
    constrain (no tools, ``tool_choice`` "none", or one tool named)."""
    own = llama._chat_handlers.get("chat_template.default")
    if own is None:
        from llama_cpp import llama_chat_format

        own = llama_chat_format.get_chat_completion_handler("chatml")
    return own


def _reply(
    completion: dict[str, Any],
    content: str,
    call: tuple[str, dict[str, Any]] | None,
    usage: dict[str, int],
    stream: bool,
) -> dict[str, Any] | Iterator[dict[str, Any]]:
    """The chat completion (or its chunks) for a decided turn."""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    finish = completion["choices"][0].get("finish_reason") or "stop"
    if call is not None:
        name, arguments = call
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        ]
        finish = "tool_calls"
    head = {
        "id": f"chat{completion.get('id', uuid.uuid4().hex)}",
        "created": completion.get("created", int(time.time())),
        "model": completion.get("model", ""),
    }
    if not stream:
        return head | {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage,
        }
    return _chunks(head, message, finish)


def _chunks(head: dict[str, Any], message: dict[str, Any], finish: str) -> Iterator[dict[str, Any]]:
    chunk = head | {"object": "chat.completion.chunk"}
    yield chunk | {"choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]}
    if message["content"]:
        delta = {"content": message["content"]}
        yield chunk | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
    for index, call in enumerate(message.get("tool_calls") or ()):
        delta = {"tool_calls": [call | {"index": index}]}
        yield chunk | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
    yield chunk | {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]}


def register() -> None:
    """Register :func:`handler` with llama-cpp-python under :data:`HANDLER_NAME` (in the server's process)."""
    from llama_cpp import llama_chat_format

    llama_chat_format.register_chat_completion_handler(HANDLER_NAME)(handler)


def accept_null_content() -> None:
    """Let the server's request model take an assistant message with ``content: null`` and ``tool_calls``, as the
    OpenAI API does (its TypedDict says ``str``, and the server answered 500). Must run before
    ``llama_cpp.server`` builds its request models."""
    from typing import Optional

    from llama_cpp import llama_types

    # Optional[...] rather than "| None": the TypedDict's other annotations are typing objects too
    llama_types.ChatCompletionRequestAssistantMessage.__annotations__["content"] = Optional[str]  # noqa: UP045
