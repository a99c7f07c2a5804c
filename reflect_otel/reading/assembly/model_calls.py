"""An LLM span as the model call it records (:class:`ModelCall`): what the model wrote, the tools it asked for,
the results it was shown, and what it was asked; None for an LLM-kind span that made no call we can see."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from reflect_otel import _values
from reflect_otel.reading.semconv import SpanAttributes
from reflect_otel.reading.spans import AttributeValue, SpanRecord
from reflect_otel.reading.tool_definitions import read_output_tools, read_tool_definitions
from reflect_otel.trace import ToolDefinition

from .context import StepContext, tool_name
from .messages import Conversation, Message, read_conversation
from .scrub import TextRules
from .tree import Placed, SpanTree

__all__ = ["ModelCall", "ToolRequest", "mean_logprob", "read_model_call"]

_TOKEN_COUNTS = (SpanAttributes.LLM_TOKEN_COUNT_PROMPT, SpanAttributes.LLM_TOKEN_COUNT_COMPLETION)
_REASONING_KEYS = ("thought", "reasoning")
"""Where a model's result object keeps the text written beside its tool calls."""


class ToolRequest(NamedTuple):
    """A tool call the model asked for, its arguments cleaned."""

    name: str
    call_id: str | None
    args: dict[str, Any]


class ModelCall(NamedTuple):
    """One model call: a step of its own, or one step per tool call it asked for."""

    span_id: str
    context: StepContext
    reasoning: str
    """What the model wrote (cleaned): its reply, or the words beside its tool calls."""
    requests: tuple[ToolRequest, ...]
    model_name: str | None
    model_input: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    logprob: float | None
    """The mean log-probability of the tokens it wrote, where the recorded response carries them."""
    tool_messages: tuple[Message, ...]
    """The tool results the model was shown, each naming the call it answers (as recorded, not yet cleaned)."""
    user_text: str
    """The first user message the model saw, as recorded ("" when none)."""
    tools: tuple[ToolDefinition, ...]
    """The tools the call offered, as recorded."""
    output_tools: frozenset[str]
    """Those its definitions mark as output tools (:func:`reflect_otel.reading.tool_definitions.read_output_tools`)."""
    gap: bool
    """Some message indexes are missing."""
    secrets: int
    """Secrets replaced in the texts above."""


def read_model_call(placed: Placed, conversation: Conversation, tree: SpanTree, rules: TextRules) -> ModelCall | None:
    """``placed`` as a model call; None when it has no messages, no output and no token counts (a framework's
    preparation step, LLM-kind but no call)."""
    span = placed.span
    attrs = span.attributes
    if not conversation.inputs and not conversation.outputs and not _called_a_model(attrs):
        return None
    scrubber = rules.scrubber()
    text = "\n".join(m.text for m in conversation.outputs if m.text)
    if not conversation.outputs:
        text = _values.answer_text(attrs.get(SpanAttributes.OUTPUT_VALUE))
    calls = conversation.requested_calls
    if calls and not text:  # a wrapper that keeps the model's words apart from its calls
        text = _words_beside_calls(span, tree)
    user = next((m for m in conversation.inputs if m.role in ("user", "human") and m.text), None)
    return ModelCall(
        span_id=span.span_id,
        context=StepContext.of(span, placed.agent, scrubber, placed.agent_span_id),
        reasoning=scrubber.text(text),
        requests=tuple(
            ToolRequest(name=tool_name(c.name), call_id=c.call_id, args=scrubber.args(c.arguments)) for c in calls
        ),
        model_name=str(attrs[SpanAttributes.LLM_MODEL_NAME]) if SpanAttributes.LLM_MODEL_NAME in attrs else None,
        model_input=scrubber.model_input(attrs.get(SpanAttributes.INPUT_VALUE)),
        prompt_tokens=_values.to_int(attrs.get(SpanAttributes.LLM_TOKEN_COUNT_PROMPT)),
        completion_tokens=_values.to_int(attrs.get(SpanAttributes.LLM_TOKEN_COUNT_COMPLETION)),
        logprob=mean_logprob(_values.parse_json(attrs.get(SpanAttributes.OUTPUT_VALUE))),
        tool_messages=conversation.tool_messages_named(),
        user_text=user.text if user is not None else "",
        tools=tuple(read_tool_definitions(attrs)),
        output_tools=read_output_tools(attrs),
        gap=conversation.gap,
        secrets=scrubber.secrets,
    )


def mean_logprob(output: Any, depth: int = 0) -> float | None:
    """The mean of the token log-probabilities in a recorded response (its output value, parsed): the first
    ``logprobs`` object holding a ``content`` list of ``{"logprob": number}`` entries, as OpenAI's chat completion
    keeps it under ``choices[0]`` and LangChain's result under ``generation_info``; None when there is none (an
    endpoint asked for none, or one that returns none)."""
    if depth > 5:
        return None
    if isinstance(output, Mapping):
        logprobs = output.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
        if isinstance(content, list):
            values = [
                float(entry["logprob"])
                for entry in content
                if isinstance(entry, Mapping)
                and isinstance(entry.get("logprob"), int | float)
                and not isinstance(entry.get("logprob"), bool)
            ]
            finite = [v for v in values if v == v and -1e9 < v <= 0]
            if finite:
                return round(sum(finite) / len(finite), 6)
        children: list[Any] = list(output.values())
    elif isinstance(output, list):
        children = output[:8]
    else:
        return None
    for child in children:
        found = mean_logprob(child, depth + 1)
        if found is not None:
            return found
    return None


def _called_a_model(attrs: Mapping[str, AttributeValue]) -> bool:
    """An LLM-kind span without messages still called a model when it counted tokens or its output reads as a
    reply; an output that is a prompt (a message list with no assistant reply, as a framework's preparation step
    returns) does not."""
    if any(key in attrs for key in _TOKEN_COUNTS):
        return True
    output = attrs.get(SpanAttributes.OUTPUT_VALUE)
    return output is not None and bool(_values.answer_text(output).strip())


def _words_beside_calls(span: SpanRecord, tree: SpanTree) -> str:
    """The text a model wrote with its tool calls when the span's output messages hold only the calls: the text
    of the model call nested in it (the client's own span), else a ``thought`` or ``reasoning`` text in its
    output value (a framework's result object, as AutoGen's ``CreateResult`` keeps it)."""
    for inner in tree.inner_llm.get(span.span_id, ()):
        outputs = read_conversation(inner.attributes).outputs
        text = "\n".join(m.text for m in outputs if m.text)
        if text:
            return text
    parsed = _values.parse_json(span.attributes.get(SpanAttributes.OUTPUT_VALUE))
    if isinstance(parsed, Mapping):
        for key in _REASONING_KEYS:
            if isinstance(parsed.get(key), str):
                return str(parsed[key])
    return ""
