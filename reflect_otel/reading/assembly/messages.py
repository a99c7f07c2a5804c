"""An LLM span's messages, read once from ``llm.input_messages.N.message.*`` and ``llm.output_messages.N.message.*``
into frozen values (:func:`read_conversation`); every later pass reads these, never the attributes again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import NamedTuple

from reflect_otel.reading.semconv import (
    INPUT_MESSAGES_PREFIX,
    OUTPUT_MESSAGES_PREFIX,
    MessageAttributes,
    MessageContentAttributes,
    ToolCallAttributes,
)
from reflect_otel.reading.spans import AttributeValue

from .tree import LLM, SpanTree

__all__ = ["Conversation", "Message", "RequestedCall", "read_conversation", "read_conversations"]

_INPUT_LEN = len(INPUT_MESSAGES_PREFIX)
_OUTPUT_LEN = len(OUTPUT_MESSAGES_PREFIX)
_CONTENTS = MessageAttributes.MESSAGE_CONTENTS.removeprefix("message.") + "."  # "contents."
_CONTENT_TEXT = "." + MessageContentAttributes.MESSAGE_CONTENT_TEXT  # ".message_content.text"
_TOOL_CALL_ID_FIELD = MessageAttributes.MESSAGE_TOOL_CALL_ID.removeprefix("message.")  # "tool_call_id"
_TOOL_CALLS = "tool_calls."
_CALL_NAME = ToolCallAttributes.TOOL_CALL_FUNCTION_NAME.removeprefix("tool_call.")  # "function.name"
_CALL_ID = ToolCallAttributes.TOOL_CALL_ID.removeprefix("tool_call.")  # "id"
_CALL_ARGUMENTS = ToolCallAttributes.TOOL_CALL_FUNCTION_ARGUMENTS_JSON.removeprefix("tool_call.")


class RequestedCall(NamedTuple):
    """A tool call in a model's reply, as recorded."""

    name: str = ""
    call_id: str | None = None
    arguments: str | None = None
    """The arguments' JSON text."""


class Message(NamedTuple):
    role: str = ""
    text: str = ""
    """The content, else the text parts of a multi-part message (``message.contents.N.message_content.text``)."""
    tool_call_id: str | None = None
    """On a tool message: the call it answers."""
    calls: tuple[RequestedCall, ...] = ()


class Conversation(NamedTuple):
    """One model call's messages, in index order."""

    inputs: tuple[Message, ...] = ()
    outputs: tuple[Message, ...] = ()
    gap: bool = False
    """Some message indexes are missing (the SDK's attribute limit dropped them)."""

    @property
    def requested_calls(self) -> tuple[RequestedCall, ...]:
        return tuple(call for message in self.outputs for call in message.calls)

    @property
    def output_signature(self) -> tuple[str, ...]:
        """What the call answered: its texts and tool calls (name and arguments), in order."""
        signature: list[str] = []
        for message in self.outputs:
            signature.append(message.text)
            for call in message.calls:
                signature += [call.name, call.arguments or ""]
        return tuple(signature)

    def tool_messages_named(self) -> tuple[Message, ...]:
        """The tool messages of the input with the call each answers: its own ``tool_call_id``, or, when the
        instrumentation did not record it (OpenInference's LiteLLM), the calls of the assistant turn before it, in
        order (a tool turn answers its calls in the order they were made)."""
        named: list[Message] = []
        unanswered: list[str] = []
        for message in self.inputs:
            if message.role != "tool":
                if message.calls:
                    unanswered = [c.call_id for c in message.calls if c.call_id]
                continue
            if message.tool_call_id:
                if message.tool_call_id in unanswered:
                    unanswered.remove(message.tool_call_id)
                named.append(message)
            elif unanswered:
                named.append(message._replace(tool_call_id=unanswered.pop(0)))
        return tuple(named)


def read_conversations(tree: SpanTree) -> Mapping[str, Conversation]:
    """The conversation of every LLM span that is not inside another, by span id."""
    return MappingProxyType(
        {
            placed.span.span_id: read_conversation(placed.span.attributes)
            for placed in tree.order
            if placed.acting_kind == LLM and placed.span.span_id not in tree.nested_llm
        }
    )


class _Reading:
    """One message while its attributes are read (they come in any order)."""

    __slots__ = ("calls", "content", "parts", "role", "tool_call_id")

    def __init__(self) -> None:
        self.role = ""
        self.content = ""
        self.tool_call_id: str | None = None
        self.parts: dict[int, str] | None = None
        self.calls: dict[int, dict[str, str]] | None = None

    def frozen(self) -> Message:
        text = self.content
        if not text and self.parts:
            text = "\n".join(self.parts[i] for i in sorted(self.parts) if self.parts[i])
        calls = (
            tuple(
                RequestedCall(c.get(_CALL_NAME, ""), c.get(_CALL_ID) or None, c.get(_CALL_ARGUMENTS))
                for _, c in sorted(self.calls.items())
            )
            if self.calls
            else ()
        )
        return Message(self.role, text, self.tool_call_id, calls)


def read_conversation(attributes: Mapping[str, AttributeValue]) -> Conversation:
    """Rebuild ``llm.input_messages.N.message.*`` and ``llm.output_messages.N.message.*`` in one pass."""
    inputs: dict[int, _Reading] = {}
    outputs: dict[int, _Reading] = {}
    for key, value in attributes.items():
        if key.startswith(INPUT_MESSAGES_PREFIX):
            messages, rest = inputs, key[_INPUT_LEN:]
        elif key.startswith(OUTPUT_MESSAGES_PREFIX):
            messages, rest = outputs, key[_OUTPUT_LEN:]
        else:
            continue
        index_text, _, name = rest.partition(".message.")
        if not index_text.isdigit():
            continue
        message = messages.get(int(index_text))
        if message is None:
            message = messages[int(index_text)] = _Reading()
        if name == "role":
            message.role = str(value)
        elif name == "content":
            message.content = str(value)
        elif name == _TOOL_CALL_ID_FIELD:
            message.tool_call_id = str(value)
        elif name.startswith(_CONTENTS) and name.endswith(_CONTENT_TEXT):  # multi-part content: the text parts
            index = name[len(_CONTENTS) : -len(_CONTENT_TEXT)]
            if index.isdigit():
                if message.parts is None:
                    message.parts = {}
                message.parts[int(index)] = str(value)
        elif name.startswith(_TOOL_CALLS):
            call_index, _, call_field = name[len(_TOOL_CALLS) :].partition(".tool_call.")
            if call_index.isdigit():
                if message.calls is None:
                    message.calls = {}
                message.calls.setdefault(int(call_index), {})[call_field] = str(value)
    return Conversation(
        inputs=tuple(inputs[i].frozen() for i in sorted(inputs)),
        outputs=tuple(outputs[i].frozen() for i in sorted(outputs)),
        gap=_has_gap(inputs) or _has_gap(outputs),
    )


def _has_gap(indexes: Iterable[int]) -> bool:
    """Missing indexes: the list must run on from 0, or from 1 (as some instrumentations number messages)."""
    ordered = sorted(indexes)
    return bool(ordered) and (ordered[0] > 1 or ordered != list(range(ordered[0], ordered[0] + len(ordered))))
