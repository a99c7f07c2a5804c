"""Spans in, :class:`StructuredTrace` out: a pure function, the same for every collector.

The rules, each learned from real instrumented runs (LangGraph via openinference-instrumentation-langchain, the
OpenAI client via openinference-instrumentation-openai, smolagents in TRAIL):

* The span tree is walked from the root by parent id; siblings in start-time then end-time order. LLM and TOOL
  spans are found by ``openinference.span.kind`` only: names and depth lie (LangGraph marks a node AGENT because
  it is called "agent").
* Each tool call in an LLM span's output message is one step; the LLM's text is its reasoning and the arguments
  come from the LLM span (a LangChain TOOL span's ``input.value`` is lossy for one-argument tools).
* A TOOL span answers the call with its tool call id (``tool_call.id``, or the id inside the serialised
  ``ToolMessage`` LangChain writes to ``output.value``); without an id, the oldest unanswered call of the same
  tool; a TOOL span with neither id nor tool name (an agent handoff), the oldest unanswered call. A TOOL span that answers no call (a tool invoked from code) is a step of its own.
* Two LLM spans with the same output, one within the other's time (two instrumentations of one model call that
  do not nest by parent), are one call: the outer one.
* An LLM span with no tool calls is a step (code agents act through text); one with no messages, no output and no
  token counts made no model call that we can see, and is not a step. An LLM span inside another LLM span
  (a chat-model wrapper calling an instrumented client) is part of the outer call, not a step. A trace made of one LLM span and
  nothing else is a chain of thought: one step per non-empty line of its output.
* Spans that follow the OTel GenAI conventions (``gen_ai.operation.name``) are read through
  :func:`reflect_otel.genai.as_openinference` first, so these rules hold for both conventions.
* The question is the root's input, else the first AGENT span's, else the first user message an LLM saw. The final
  answer is the root's output, else the first AGENT span's, else the final-answer step's text.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from reflect_otel import _values
from reflect_otel.errors import InputError
from reflect_otel.genai import CAPTURE_CONTENT_HINT, as_openinference, lacks_message_content
from reflect_otel.redaction import Redactor, default_redactor
from reflect_otel.semconv import (
    INPUT_MESSAGES_PREFIX,
    OUTPUT_MESSAGES_PREFIX,
    LangGraphMetadataKeys,
    MessageAttributes,
    MessageContentAttributes,
    OpenInferenceSpanKindValues,
    ReflectAttributes,
    SpanAttributes,
    ToolCallAttributes,
)
from reflect_otel.spans import SpanRecord
from reflect_otel.tool_definitions import MAX_TOOLS, read_tool_definitions
from reflect_otel.trace import (
    ReplayMetadata,
    Step,
    StepKind,
    StepStatus,
    StructuredTrace,
    ToolDefinition,
    TraceSource,
    TraceWarning,
    WarningCode,
)
from reflect_otel.tracefile import EXPECTED_ANSWER_FIELD

__all__ = ["ATTRIBUTE_LIMIT_FIX", "AssemblyLimits", "assemble_trace"]

ATTRIBUTE_LIMIT_FIX = (
    "the OTel SDK keeps 128 attributes per span by default and drops the oldest; create the provider with "
    "openinference.instrumentation.TracerProvider, or set OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT=10000"
)

_LLM = OpenInferenceSpanKindValues.LLM.value
_TOOL = OpenInferenceSpanKindValues.TOOL.value
_AGENT = OpenInferenceSpanKindValues.AGENT.value
_KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
_NEVER = 2**63
_INPUT_LEN = len(INPUT_MESSAGES_PREFIX)
_OUTPUT_LEN = len(OUTPUT_MESSAGES_PREFIX)
_STATUS = {"ok": StepStatus.OK, "error": StepStatus.ERROR}
_RAW_VALUE_CHARS = 2_000
_TOKEN_COUNTS = (SpanAttributes.LLM_TOKEN_COUNT_PROMPT, SpanAttributes.LLM_TOKEN_COUNT_COMPLETION)


def _scalar_values(arguments: Mapping[str, Any]) -> list[str]:
    """A call's argument values that are text or numbers, one level into a list (``{"answers": ["a"]}``)."""
    out = []
    for value in arguments.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str | int | float) and not isinstance(item, bool):
                out.append(str(item))
    return out


def _normal_answer(text: str) -> str:
    return " ".join(text.split()).casefold()


def _is_object(value: object) -> bool:
    """A tool result that is a JSON object: a framework's result wrapper, or the tool's own data."""
    return isinstance(_values.parse_json(value), Mapping)


def _called_a_model(attrs: Mapping[str, Any]) -> bool:
    """An LLM-kind span without messages still called a model when it counted tokens or its output reads as a
    reply; an output that is a prompt (a message list with no assistant reply, as a framework's preparation step
    returns) does not."""
    if any(key in attrs for key in _TOKEN_COUNTS):
        return True
    output = attrs.get(SpanAttributes.OUTPUT_VALUE)
    return output is not None and bool(_values.answer_text(output).strip())


_CONTENTS = MessageAttributes.MESSAGE_CONTENTS.removeprefix("message.") + "."  # "contents."
_CONTENT_TEXT = "." + MessageContentAttributes.MESSAGE_CONTENT_TEXT  # ".message_content.text"
_TOOL_CALL_ID_FIELD = MessageAttributes.MESSAGE_TOOL_CALL_ID.removeprefix("message.")  # "tool_call_id"


@dataclass(frozen=True, slots=True)
class AssemblyLimits:
    """Bounds on what one trace may hold; longer text is cut with a note of how much was cut."""

    max_text_chars: int = 100_000
    max_model_input_chars: int = 1_000_000


@dataclass(slots=True)
class _Message:
    role: str = ""
    content: str = ""
    tool_call_id: str | None = None
    """On a tool message: the call it answers."""
    tool_calls: dict[int, dict[str, str]] | None = None
    parts: dict[int, str] | None = None
    """``message.contents.N.message_content.text``: the text parts of a multi-part message, by N."""

    @property
    def text(self) -> str:
        if self.content or not self.parts:
            return self.content
        return "\n".join(self.parts[i] for i in sorted(self.parts) if self.parts[i])


def _llm_messages(attributes: Mapping[str, Any]) -> tuple[dict[int, _Message], dict[int, _Message]]:
    """Rebuild ``llm.input_messages.N.message.*`` and ``llm.output_messages.N.message.*`` in one pass."""
    inputs: dict[int, _Message] = {}
    outputs: dict[int, _Message] = {}
    for key, value in attributes.items():
        if key.startswith(INPUT_MESSAGES_PREFIX):
            messages, rest = inputs, key[_INPUT_LEN:]
        elif key.startswith(OUTPUT_MESSAGES_PREFIX):
            messages, rest = outputs, key[_OUTPUT_LEN:]
        else:
            continue
        index_text, _, field = rest.partition(".message.")
        if not index_text.isdigit():
            continue
        message = messages.get(int(index_text))
        if message is None:
            message = messages[int(index_text)] = _Message()
        if field == "role":
            message.role = str(value)
        elif field == "content":
            message.content = str(value)
        elif field == _TOOL_CALL_ID_FIELD:
            message.tool_call_id = str(value)
        elif field.startswith(_CONTENTS) and field.endswith(_CONTENT_TEXT):  # multi-part content: the text parts
            index = field[len(_CONTENTS) : -len(_CONTENT_TEXT)]
            if index.isdigit():
                if message.parts is None:
                    message.parts = {}
                message.parts[int(index)] = str(value)
        elif field.startswith("tool_calls."):
            call_index, _, call_field = field[11:].partition(".tool_call.")
            if call_index.isdigit():
                if message.tool_calls is None:
                    message.tool_calls = {}
                message.tool_calls.setdefault(int(call_index), {})[call_field] = str(value)
    return inputs, outputs


_REASONING_KEYS = ("thought", "reasoning")
"""Where a model's result object keeps the text written beside its tool calls."""


def _tool_messages_named(inputs: Mapping[int, _Message]) -> list[_Message]:
    """The tool messages of a conversation with the call each answers: its own ``tool_call_id``, or, when the
    instrumentation did not record it (OpenInference's LiteLLM), the calls of the assistant turn before it, in
    order (a tool turn answers its calls in the order they were made)."""
    named: list[_Message] = []
    unanswered: list[str] = []
    for _, message in sorted(inputs.items()):
        if message.role != "tool":
            if message.tool_calls:
                unanswered = [c["id"] for _, c in sorted(message.tool_calls.items()) if c.get("id")]
            continue
        if message.tool_call_id:
            if message.tool_call_id in unanswered:
                unanswered.remove(message.tool_call_id)
            named.append(message)
        elif unanswered:
            named.append(replace(message, tool_call_id=unanswered.pop(0)))
    return named


def _any_contained(spans: list[SpanRecord]) -> bool:
    """Whether some span's interval lies within another's (sweep by start time)."""
    latest_end = -1
    for span in sorted(spans, key=lambda s: (s.start_ns, -(s.end_ns or _NEVER))):
        end = span.end_ns if span.end_ns is not None else _NEVER
        if end <= latest_end:
            return True
        latest_end = max(latest_end, end)
    return False


def _output_signature(outputs: Mapping[int, _Message]) -> tuple[str, ...]:
    """What a model call answered: its texts and tool calls (name and arguments), in order."""
    signature: list[str] = []
    for _, message in sorted(outputs.items()):
        signature.append(message.text)
        for _, call in sorted((message.tool_calls or {}).items()):
            signature += [call.get("function.name", ""), call.get("function.arguments", "")]
    return tuple(signature)


def _has_gap(indexes: Iterable[int]) -> bool:
    """Missing indexes: the list must run on from 0, or from 1 (as some instrumentations number messages)."""
    ordered = sorted(indexes)
    return bool(ordered) and (ordered[0] > 1 or ordered != list(range(ordered[0], ordered[0] + len(ordered))))


def _tool_name(name: str) -> str:
    """A tool's name as its author wrote it: instrumentations that wrap a callable object name it ``X.__call__``."""
    return name.removesuffix(".__call__")


def _raw(value: object, extracted: str | None) -> str | None:
    """The root's raw input or output value when the question or answer was extracted from it (JSON, a repr), cut
    short; None when it is the text itself."""
    if not isinstance(value, str) or value == extracted:
        return None
    return _values.truncate(value, _RAW_VALUE_CHARS)


def _metadata(span: SpanRecord) -> Mapping[str, Any]:
    parsed = _values.parse_json(span.attributes.get(SpanAttributes.METADATA))
    return parsed if isinstance(parsed, Mapping) else {}


def _infer_dropped_kind(attributes: Mapping[str, Any]) -> str | None:
    """The kind of a span whose ``openinference.span.kind`` was dropped by the SDK's attribute limit (it is set
    first, so it is the first to go), from the attributes only that kind writes."""
    if any(key.startswith(OUTPUT_MESSAGES_PREFIX) for key in attributes):
        return _LLM
    if SpanAttributes.TOOL_NAME in attributes:
        return _TOOL
    return None


def _time_key(span: SpanRecord) -> tuple[int, int]:
    return span.start_ns, span.end_ns if span.end_ns is not None else _NEVER


class _Draft:
    """A step under construction; becomes a frozen :class:`Step` at the end."""

    __slots__ = ("fields", "has_result")

    def __init__(self, **fields: Any) -> None:
        self.fields = fields
        self.has_result = False


class _Assembler:
    def __init__(self, spans: Iterable[SpanRecord], collector: str, limits: AssemblyLimits, redactor: Redactor) -> None:
        self.limits = limits
        self.redactor = redactor
        self.redacted = 0
        self.collector = collector
        self.warnings: list[TraceWarning] = []
        self.drafts: list[_Draft] = []
        self.waiting_by_id: dict[str, _Draft] = {}
        self.calls_by_id: dict[str, _Draft] = {}
        self.waiting_by_name: dict[str, deque[_Draft]] = defaultdict(deque)
        self.llm_span_count = 0
        self.tool_span_count = 0
        self.contentless_llm_spans = 0
        self.first_user_message = ""
        self.tools: dict[str, ToolDefinition] = {}
        """The agent's tools as its LLM spans recorded them, by name, first definition kept."""
        self.first_metadata: Mapping[str, Any] = {}
        self.nested_llm_spans: set[str] = set()
        self.inner_llm_spans: defaultdict[str, list[SpanRecord]] = defaultdict(list)
        """The LLM spans nested directly in each LLM span (the client's span inside a framework's)."""
        self.messages: dict[str, tuple[dict[int, _Message], dict[int, _Message]]] = {}
        """Each LLM span's messages, read once (duplicate detection, then the step)."""
        self.by_id = self._dedupe(spans)
        self.order = self._walk()

    # -- tree -------------------------------------------------------------------------------------------------
    def _dedupe(self, spans: Iterable[SpanRecord]) -> dict[str, SpanRecord]:
        by_id: dict[str, SpanRecord] = {}
        duplicates = 0
        trace_id: str | None = None
        for span in spans:
            if trace_id is None:
                trace_id = span.trace_id
            elif span.trace_id != trace_id:
                raise InputError(f"spans of traces {trace_id} and {span.trace_id} given together; assemble one trace")
            if span.span_id in by_id:
                duplicates += 1
                continue
            by_id[span.span_id] = as_openinference(span)
            self.contentless_llm_spans += lacks_message_content(span)
        if not by_id:
            raise InputError("no spans to assemble")
        if duplicates:
            self._warn(WarningCode.DUPLICATE_SPANS, f"{duplicates} duplicate span(s) ignored (same span id twice)")
        return by_id

    def _walk(self) -> list[tuple[SpanRecord, str | None]]:
        children: dict[str, list[SpanRecord]] = defaultdict(list)
        roots: list[SpanRecord] = []
        orphans = 0
        for span in self.by_id.values():
            if span.is_local_root:
                roots.append(span)
            elif span.parent_id not in self.by_id or span.parent_id == span.span_id:
                roots.append(span)
                orphans += 1
            else:
                children[span.parent_id].append(span)
        roots.sort(key=_time_key)
        self.root = next((s for s in roots if s.is_local_root), roots[0] if roots else None)
        order: list[tuple[SpanRecord, str | None]] = []
        seen: set[str] = set()

        def visit(starts: list[SpanRecord], *, descend: bool = True) -> None:
            # (span, agent name, inside an LLM span): an LLM span nested in another (a chat-model wrapper calling
            # an instrumented client) is part of the outer call, not a decision of its own
            stack: list[tuple[SpanRecord, str | None, bool]] = [(s, None, False) for s in reversed(starts)]
            while stack:
                span, agent, inside_llm = stack.pop()
                if span.span_id in seen:
                    continue
                seen.add(span.span_id)
                kind = span.attributes.get(_KIND)
                if kind == _AGENT:
                    agent = str(span.attributes.get(SpanAttributes.AGENT_NAME) or span.name)
                if inside_llm and kind == _LLM:
                    self.nested_llm_spans.add(span.span_id)
                    if span.parent_id:
                        self.inner_llm_spans[span.parent_id].append(span)
                order.append((span, agent))
                kids = children.get(span.span_id) if descend else None
                if kids:
                    kids.sort(key=_time_key, reverse=True)
                    nested = inside_llm or kind == _LLM
                    stack.extend((kid, agent, nested) for kid in kids)

        visit(roots)
        if len(seen) < len(self.by_id):  # parent links that form a cycle never reach a root
            stranded = sorted((s for s in self.by_id.values() if s.span_id not in seen), key=_time_key)
            orphans += len(stranded)
            if self.root is None:
                self.root = stranded[0]
            visit(stranded, descend=False)  # in a cycle no span is really another's parent
        if orphans:
            self._warn(
                WarningCode.ORPHAN_SPANS,
                f"{orphans} span(s) name a parent that never arrived; they are placed by start time. "
                "Flush the exporter before the process exits, and export every span of a trace to the same place",
            )
        return order

    def _mark_duplicate_model_calls(self) -> None:
        """Two instrumentations of one model call (LangChain's ``ChatOpenAI`` span and the OpenAI client's span
        inside it) give two LLM spans; when the client's span cannot parent to the chat model's (LangChain does
        not set the OTel context), it lands beside it. The same output, produced within the other span's
        interval, is the same call: the inner span is part of the outer one, as if nested."""
        llm_spans = [
            span
            for span, _ in self.order
            if span.attributes.get(_KIND) == _LLM and span.span_id not in self.nested_llm_spans
        ]
        if not _any_contained(llm_spans):
            return  # calls one after another (nearly every trace): nothing can be a second record of another
        by_output: dict[tuple[str, ...], list[SpanRecord]] = defaultdict(list)
        for span in llm_spans:
            messages = self.messages[span.span_id] = _llm_messages(span.attributes)
            if messages[1]:
                by_output[_output_signature(messages[1])].append(span)
        for spans in by_output.values():
            if len(spans) < 2:
                continue
            for inner in spans:
                if inner.end_ns is None:
                    continue
                end = inner.end_ns
                if any(
                    outer is not inner
                    and outer.span_id not in self.nested_llm_spans
                    and outer.start_ns <= inner.start_ns
                    and outer.end_ns is not None
                    and end <= outer.end_ns
                    and (outer.start_ns, -outer.end_ns, outer.span_id) < (inner.start_ns, -end, inner.span_id)
                    for outer in spans
                ):
                    self.nested_llm_spans.add(inner.span_id)

    # -- steps ------------------------------------------------------------------------------------------------
    def build(self) -> StructuredTrace:
        self._mark_duplicate_model_calls()
        gaps: list[str] = []
        dropped_spans, dropped_total = 0, 0
        for span, agent in self.order:
            if span.dropped_attributes:
                dropped_spans += 1
                dropped_total += span.dropped_attributes
            kind = span.attributes.get(_KIND)
            if kind is None and span.dropped_attributes:
                kind = _infer_dropped_kind(span.attributes)
            if kind == _LLM and span.span_id not in self.nested_llm_spans:
                if self._add_llm(span, agent):
                    gaps.append(span.span_id)
            elif kind == _TOOL:
                self._add_tool(span, agent)
        if dropped_spans:
            self._warn(
                WarningCode.DROPPED_ATTRIBUTES,
                f"{dropped_total} attribute(s) were dropped on {dropped_spans} span(s); {ATTRIBUTE_LIMIT_FIX}",
            )
        if gaps:
            self._warn(
                WarningCode.MESSAGE_INDEX_GAP,
                f"message indexes have gaps on {len(gaps)} LLM span(s), so messages are missing; {ATTRIBUTE_LIMIT_FIX}",
                span_id=gaps[0],
            )
        if self.llm_span_count == 1 and self.tool_span_count == 0 and len(self.drafts) == 1:
            self._split_chain_of_thought()
        self._mark_final_answer()
        if not self.drafts:
            self._warn(WarningCode.NO_STEPS, "no LLM or TOOL spans found; is OpenInference instrumentation enabled?")
        return self._trace()

    def _text(self, value: object) -> str:
        return self._clean(_values.truncate(_values.as_text(value), self.limits.max_text_chars))

    def _result(self, value: object, extracted: str | None = None) -> tuple[str, str | None]:
        """A tool result as text, out of its wrappers (``extracted`` when the caller has taken it out already), and
        the recorded value when that differs."""
        inner = extracted if extracted is not None else _values.tool_result_text(value)
        text = self._text(inner)
        if value is None or _values.as_text(inner) == _values.as_text(value):
            return text, None
        # the secrets of the raw value are the result's own, counted once (in the text)
        raw, _count = self.redactor.redact(_values.truncate(_values.as_text(value), self.limits.max_text_chars))
        return text, raw

    def _clean(self, text: str) -> str:
        """Every text of the trace passes here: secrets out (see :mod:`reflect_otel.redaction`)."""
        cleaned, count = self.redactor.redact(text)
        self.redacted += count
        return cleaned

    def _args(self, value: object) -> dict[str, Any]:
        cleaned, count = self.redactor.redact_value(_values.tool_args(value))
        self.redacted += count
        return cleaned  # type: ignore[no-any-return]

    def _common(self, span: SpanRecord, agent: str | None) -> dict[str, Any]:
        metadata = _metadata(span)
        if metadata and not self.first_metadata:
            self.first_metadata = metadata
        step = _values.to_int(metadata.get(LangGraphMetadataKeys.STEP))
        node = metadata.get(LangGraphMetadataKeys.NODE)
        return {
            "agent": agent if agent is not None else (str(node) if node else None),
            "start_time_ns": span.start_ns,
            "end_time_ns": span.end_ns,
            "status": _STATUS.get(span.status, StepStatus.UNSET),
            "status_message": self._clean(span.status_message) if span.status_message else None,
            "langgraph_step": step,
            "langgraph_node": str(node) if node else None,
        }

    def _answer_from_tool_messages(self, inputs: Mapping[int, _Message]) -> None:
        """A loop that runs its tools without tool spans still sends their results to the model: the next call's
        tool messages answer the calls they name. A tool span has answered them already, and keeps its answer
        unless it is a JSON object and the model was shown text: the observation is what the model saw, not the
        framework's result wrapper (LlamaIndex's ``ToolOutput``)."""
        for message in _tool_messages_named(inputs):
            assert message.tool_call_id is not None
            draft = self.calls_by_id.get(message.tool_call_id)
            answered = draft is not None and draft.has_result
            if draft is None or (answered and not _is_object(draft.fields.get("tool_result"))):
                continue
            text, raw = self._result(message.text)
            if answered and (not text.strip() or _is_object(text)):
                continue
            draft.has_result = True
            self.waiting_by_id.pop(message.tool_call_id, None)
            draft.fields["tool_result"], draft.fields["tool_result_raw"] = text, raw

    def _words_beside_calls(self, span: SpanRecord) -> str:
        """The text a model wrote with its tool calls when the span's output messages hold only the calls: the text
        of the model call nested in it (the client's own span), else a ``thought`` or ``reasoning`` text in its
        output value (a framework's result object, as AutoGen's ``CreateResult`` keeps it)."""
        for inner in self.inner_llm_spans.get(span.span_id, ()):
            _inputs, outputs = _llm_messages(inner.attributes)
            text = "\n".join(m.text for _, m in sorted(outputs.items()) if m.text)
            if text:
                return text
        parsed = _values.parse_json(span.attributes.get(SpanAttributes.OUTPUT_VALUE))
        if isinstance(parsed, Mapping):
            for key in _REASONING_KEYS:
                if isinstance(parsed.get(key), str):
                    return str(parsed[key])
        return ""

    def _add_llm(self, span: SpanRecord, agent: str | None) -> bool:
        """Add the steps one LLM span decided; True when its message indexes have gaps."""
        attrs = span.attributes
        read = self.messages.pop(span.span_id, None)
        inputs, outputs = read if read is not None else _llm_messages(attrs)
        if not inputs and not outputs and not _called_a_model(attrs):
            return False  # LLM-kind but no model call seen (a framework's preparation step): not a decision
        self.llm_span_count += 1
        self._add_tools(attrs)
        self._answer_from_tool_messages(inputs)
        if not self.first_user_message:
            user = next((m for _, m in sorted(inputs.items()) if m.role in ("user", "human") and m.text), None)
            if user is not None:
                self.first_user_message = user.text
        text = "\n".join(m.text for _, m in sorted(outputs.items()) if m.text)
        if not outputs:
            text = _values.answer_text(attrs.get(SpanAttributes.OUTPUT_VALUE))
        calls = [call for _, m in sorted(outputs.items()) if m.tool_calls for _, call in sorted(m.tool_calls.items())]
        if calls and not text:  # a wrapper that keeps the model's words apart from its calls
            text = self._words_beside_calls(span)
        model_input = attrs.get(SpanAttributes.INPUT_VALUE)
        common = self._common(span, agent) | {
            "span_id": span.span_id,
            "reasoning": self._text(text),
            "model_name": str(attrs[SpanAttributes.LLM_MODEL_NAME]) if SpanAttributes.LLM_MODEL_NAME in attrs else None,
            "model_input": (
                self._clean(_values.truncate(str(model_input), self.limits.max_model_input_chars))
                if model_input
                else None
            ),
        }
        tokens = {
            "prompt_tokens": _values.to_int(attrs.get(SpanAttributes.LLM_TOKEN_COUNT_PROMPT)),
            "completion_tokens": _values.to_int(attrs.get(SpanAttributes.LLM_TOKEN_COUNT_COMPLETION)),
        }
        if not calls:
            self.drafts.append(_Draft(kind=StepKind.REASONING, **common, **tokens))
        for position, call in enumerate(calls):
            name = _tool_name(call.get(ToolCallAttributes.TOOL_CALL_FUNCTION_NAME.removeprefix("tool_call."), ""))
            call_id = call.get(ToolCallAttributes.TOOL_CALL_ID.removeprefix("tool_call.")) or None
            args = call.get(ToolCallAttributes.TOOL_CALL_FUNCTION_ARGUMENTS_JSON.removeprefix("tool_call."))
            draft = _Draft(
                kind=StepKind.TOOL_CALL,
                tool_name=name or None,
                tool_args=self._args(args),
                tool_call_id=call_id,
                **common,
                **(tokens if position == 0 else {}),
            )
            self.drafts.append(draft)
            if call_id:
                self.waiting_by_id[call_id] = self.calls_by_id[call_id] = draft
            self.waiting_by_name[name].append(draft)
        return _has_gap(inputs) or _has_gap(outputs)

    def _add_tools(self, attrs: Mapping[str, Any]) -> None:
        for definition in read_tool_definitions(attrs):
            if definition.name not in self.tools and len(self.tools) < MAX_TOOLS:
                cleaned = definition.model_copy(update={"description": self._clean(definition.description)})
                self.tools[definition.name] = cleaned

    def _add_tool(self, span: SpanRecord, agent: str | None) -> None:
        self.tool_span_count += 1
        attrs = span.attributes
        name = _tool_name(str(attrs.get(SpanAttributes.TOOL_NAME) or span.name))
        output = attrs.get(SpanAttributes.OUTPUT_VALUE)
        message = _values.tool_message(output)
        call_id = attrs.get(ToolCallAttributes.TOOL_CALL_ID) or (message[0] if message else None)
        result, raw = self._result(output, message[1] if message else None)
        draft = self.waiting_by_id.pop(str(call_id), None) if call_id else None
        if draft is None:
            waiting = self.waiting_by_name.get(name)
            while waiting and draft is None:
                candidate = waiting.popleft()
                if not candidate.has_result:
                    draft = candidate
        if draft is None and not call_id:
            draft = self._written_call(name, attrs.get(SpanAttributes.INPUT_VALUE))
        if draft is None and not call_id and SpanAttributes.TOOL_NAME not in attrs:
            draft = self._oldest_unanswered()  # an anonymous action (a handoff) answers the call that asked for it
        common = self._common(span, agent)
        if draft is None:  # invoked from code, not by a model's tool call
            self.drafts.append(
                _Draft(
                    kind=StepKind.TOOL_CALL,
                    span_id=span.span_id,
                    tool_span_id=span.span_id,
                    tool_name=name,
                    tool_args=self._args(attrs.get(SpanAttributes.INPUT_VALUE)),
                    tool_call_id=str(call_id) if call_id else None,
                    tool_result=result,
                    tool_result_raw=raw,
                    **common,
                )
            )
            self.drafts[-1].has_result = True
            return
        draft.has_result = True
        fields = draft.fields
        if call_id and not fields.get("tool_call_id"):  # the model's call had no id; the tool's span has it
            fields["tool_call_id"] = str(call_id)
        if fields.get("tool_call_id"):
            self.waiting_by_id.pop(fields["tool_call_id"], None)
        fields["tool_span_id"] = span.span_id
        fields["tool_result"], fields["tool_result_raw"] = result, raw
        fields["end_time_ns"] = span.end_ns
        if common["status"] is StepStatus.ERROR:
            fields["status"], fields["status_message"] = StepStatus.ERROR, common["status_message"]
        if common["langgraph_step"] is not None:  # the checkpoint after the step is the one the tool wrote
            fields["langgraph_step"], fields["langgraph_node"] = (
                common["langgraph_step"],
                common["langgraph_node"],
            )

    def _written_call(self, name: str, arguments: object) -> _Draft | None:
        """The reply that asked for this tool in its text (a ReAct agent writes ``Action: multiply``, the framework
        parses it and runs the tool): the last step, when it is a model's reply without tool calls that names the
        tool. It becomes the tool call, its text the reasoning."""
        last = self.drafts[-1] if self.drafts else None
        if last is None or last.fields["kind"] is not StepKind.REASONING or not name:
            return None
        if not re.search(rf"\b{re.escape(name)}\b", str(last.fields.get("reasoning") or "")):
            return None
        last.fields |= {"kind": StepKind.TOOL_CALL, "tool_name": name, "tool_args": self._args(arguments)}
        return last

    def _oldest_unanswered(self) -> _Draft | None:
        for draft in self.drafts:
            if (
                draft.fields["kind"] is StepKind.TOOL_CALL
                and not draft.has_result
                and "tool_span_id" not in draft.fields
            ):
                return draft
        return None

    def _split_chain_of_thought(self) -> None:
        only = self.drafts[0].fields
        lines = [line.strip() for line in str(only["reasoning"]).splitlines() if line.strip()]
        if len(lines) < 2:
            return
        self.drafts = [
            _Draft(
                **(only | {"reasoning": line} | ({} if i == 0 else {"prompt_tokens": None, "completion_tokens": None}))
            )
            for i, line in enumerate(lines)
        ]

    def _mark_final_answer(self) -> None:
        """The run's final step, by how the run ends, whatever its tools are called: its last model turn when that
        turn calls no tool, or the call that ended the run when it carries the run's answer (one of its arguments is
        the run's output, or the call returned its own argument, as an answer tool does)."""
        last = self.drafts[-1] if self.drafts else None
        if last is None:
            return
        if last.fields["kind"] is StepKind.REASONING or (last.fields.get("tool_name") and self._answers_with(last)):
            last.fields["kind"] = StepKind.FINAL_ANSWER
            last.fields["is_final_answer"] = True

    def _answers_with(self, call: _Draft) -> bool:
        values = {_normal_answer(v) for v in _scalar_values(call.fields.get("tool_args") or {})} - {""}
        outputs = [
            _values.answer_text(span.attributes.get(SpanAttributes.OUTPUT_VALUE))
            for span in (self.root, self._first_agent())
            if span is not None
        ]
        outputs.append(str(call.fields.get("tool_result") or ""))
        return any(_normal_answer(o) in values for o in outputs if o)

    # -- trace ------------------------------------------------------------------------------------------------
    def _first_agent(self) -> SpanRecord | None:
        return next((span for span, _ in self.order if span.attributes.get(_KIND) == _AGENT), None)

    def _final_answer_of_steps(self, steps: list[Step]) -> str | None:
        final = next((s for s in reversed(steps) if s.is_final_answer), None)
        if final is None:
            return None
        if final.tool_name:
            args = final.tool_args
            value = args.get("answer", args.get("input", args.get("args", args)))
            if isinstance(value, list) and len(value) == 1:
                value = value[0]
            return self._text(value)
        return final.reasoning

    def _trace(self) -> StructuredTrace:
        steps = [Step(index=i, **d.fields) for i, d in enumerate(self.drafts, start=1)]
        root = self.root
        assert root is not None  # _dedupe guarantees at least one span
        agent = self._first_agent()
        # the root's or agent's input when it states the task, else the model's first user message, else the
        # root's input as it is (a workflow's state object names no question; the raw value stays in metadata)
        question = _values.question_text(root.attributes.get(SpanAttributes.INPUT_VALUE), whole=False)
        if not question and agent is not None:
            question = _values.question_text(agent.attributes.get(SpanAttributes.INPUT_VALUE), whole=False)
        question = question or self.first_user_message
        if not question:
            question = _values.question_text(root.attributes.get(SpanAttributes.INPUT_VALUE))
        answer: str | None = _values.answer_text(root.attributes.get(SpanAttributes.OUTPUT_VALUE))
        if not answer and agent is not None:
            answer = _values.answer_text(agent.attributes.get(SpanAttributes.OUTPUT_VALUE))
        answer = self._clean(answer) if answer else self._final_answer_of_steps(steps)
        metadata = _metadata(root) or self.first_metadata
        session = root.attributes.get(SpanAttributes.SESSION_ID) or next(
            (
                s.attributes[SpanAttributes.SESSION_ID]
                for s, _ in self.order
                if SpanAttributes.SESSION_ID in s.attributes
            ),
            None,
        )
        thread = metadata.get(LangGraphMetadataKeys.THREAD_ID)
        ends = [s.end_ns for s in self.by_id.values() if s.end_ns is not None]
        root_agent = root if root.attributes.get(_KIND) == _AGENT else agent
        question = self._text(question)
        if not question and steps:
            fix = (
                "the model calls were recorded without their messages (see the no_message_content warning)"
                if self.contentless_llm_spans
                else "instrument the model client as well (OpenInference's OpenAI or LiteLLM instrumentor, or any "
                "emitter of gen_ai.input.messages) so the trace carries what the agent was asked"
            )
            self._warn(
                WarningCode.NO_QUESTION,
                "no question found: the root span has no input.value stating one and no LLM span recorded a user "
                f"message; {fix}",
                root.span_id,
            )
        if self.contentless_llm_spans:
            self._warn(
                WarningCode.NO_MESSAGE_CONTENT,
                f"{self.contentless_llm_spans} model call(s) recorded without their messages, so their steps have no "
                f"text, tool arguments or results; {CAPTURE_CONTENT_HINT}",
            )
        elif self.llm_span_count == 0 and any(d.fields["kind"] is StepKind.TOOL_CALL for d in self.drafts):
            self._warn(
                WarningCode.NO_MODEL_CALLS,
                "no model call is on the trace: the tool steps have no reasoning and the answer has no step of its "
                "own; instrument the model client the framework calls as well (OpenInference's OpenAI, Anthropic, "
                "Google GenAI or LiteLLM instrumentor), or turn on the framework's own GenAI spans",
            )
        raw = {
            "raw_input": _raw(root.attributes.get(SpanAttributes.INPUT_VALUE), question),
            "raw_output": _raw(root.attributes.get(SpanAttributes.OUTPUT_VALUE), answer),
            EXPECTED_ANSWER_FIELD: self._text(root.attributes.get(ReflectAttributes.EXPECTED_ANSWER)),
        }
        if self.redacted:
            kinds = ", ".join(kind for kind, _ in self.redactor.patterns)
            self._warn(
                WarningCode.SECRETS_REDACTED,
                f"{self.redacted} secret(s) replaced by [REDACTED:kind] before storing or sending ({kinds}); "
                "add patterns with REFLECT_REDACT_PATTERNS",
            )
        return StructuredTrace(
            trace_id=root.trace_id,
            session_id=str(session) if session else None,
            agent=str(root_agent.attributes.get(SpanAttributes.AGENT_NAME) or root_agent.name) if root_agent else None,
            root_span_id=root.span_id,
            question=question,
            final_answer=answer or None,
            steps=tuple(steps),
            source=self._source(metadata, root),
            replay=ReplayMetadata(thread_id=str(thread) if thread else None),
            warnings=tuple(self.warnings),
            start_time_ns=min(s.start_ns for s in self.by_id.values()),
            end_time_ns=max(ends) if ends else None,
            metadata={k: self._text(v) for k, v in raw.items() if v},
            tools=tuple(self.tools.values()),
        )

    def _source(self, root_metadata: Mapping[str, Any], root: SpanRecord) -> TraceSource:
        scopes = sorted({s.scope for s in self.by_id.values() if s.scope})
        if any(str(k).startswith("langgraph") for k in root_metadata) or any(
            s.name == "LangGraph" for s, _ in self.order[:1]
        ):
            framework = "langgraph"
        elif any("smolagents" in scope for scope in scopes) or any(
            k.startswith("smolagents.")
            for s, _ in self.order
            if s.attributes.get(_KIND) == _AGENT
            for k in s.attributes
        ):
            framework = "smolagents"
        elif any("langchain" in scope for scope in scopes):
            framework = "langchain"
        elif any("openai" in scope for scope in scopes):
            framework = "openai"
        else:
            framework = "unknown"
        return TraceSource(
            framework=framework, instrumentation=tuple(scopes), collector=self.collector, service=root.service
        )

    def _warn(self, code: WarningCode, message: str, span_id: str | None = None) -> None:
        self.warnings.append(TraceWarning(code=code, message=message, span_id=span_id))


def assemble_trace(
    spans: Iterable[SpanRecord],
    *,
    collector: str = "unknown",
    limits: AssemblyLimits | None = None,
    warnings: Iterable[TraceWarning] = (),
    redactor: Redactor | None = None,
) -> StructuredTrace:
    """Rebuild one trace from its spans (any order, duplicates and missing parents tolerated).

    ``warnings`` from the collector (dropped spans, a root that never ended) are carried onto the trace. Every
    text is redacted by ``redactor`` (default: :func:`~reflect_otel.redaction.default_redactor`).
    Raises :class:`InputError` when ``spans`` is empty or mixes traces.
    """
    assembler = _Assembler(spans, collector, limits or AssemblyLimits(), redactor or default_redactor())
    assembler.warnings[:0] = list(warnings)
    return assembler.build()
