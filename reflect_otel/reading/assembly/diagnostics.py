"""What the rebuilt trace lacks or had to work around, each warning with the fix at the source."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from reflect_otel.reading.genai import CAPTURE_CONTENT_HINT
from reflect_otel.reading.redaction import Redactor
from reflect_otel.trace import Step, StepKind, TraceWarning, WarningCode

from .actions import Actions
from .tree import SpanTree

__all__ = ["ATTRIBUTE_LIMIT_FIX", "Findings", "trace_warnings"]

ATTRIBUTE_LIMIT_FIX = (
    "the OTel SDK keeps 128 attributes per span by default and drops the oldest; create the provider with "
    "openinference.instrumentation.TracerProvider, or set OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT=10000"
)


@dataclass(frozen=True, slots=True)
class Findings:
    """What the passes found, as the warnings need it."""

    tree: SpanTree
    actions: Actions
    steps: tuple[Step, ...]
    question: str
    secrets: int
    redactor: Redactor


def trace_warnings(given: Iterable[TraceWarning], found: Findings) -> tuple[TraceWarning, ...]:
    """``given`` (the collector's: dropped spans, a root that never ended) first, then the passes' in the order the
    trace was rebuilt: spans, attributes, steps, question, content, secrets."""
    return (*given, *_span_warnings(found.tree), *_attribute_warnings(found.actions), *_content_warnings(found))


def _span_warnings(tree: SpanTree) -> list[TraceWarning]:
    warnings = []
    if tree.duplicates:
        warnings.append(
            TraceWarning(
                code=WarningCode.DUPLICATE_SPANS,
                message=f"{tree.duplicates} duplicate span(s) ignored (same span id twice)",
            )
        )
    if tree.orphans:
        warnings.append(
            TraceWarning(
                code=WarningCode.ORPHAN_SPANS,
                message=f"{tree.orphans} span(s) name a parent that never arrived; they are placed by start time. "
                "Flush the exporter before the process exits, and export every span of a trace to the same place",
            )
        )
    return warnings


def _attribute_warnings(actions: Actions) -> list[TraceWarning]:
    warnings = []
    if actions.dropped_spans:
        warnings.append(
            TraceWarning(
                code=WarningCode.DROPPED_ATTRIBUTES,
                message=f"{actions.dropped_attributes} attribute(s) were dropped on {actions.dropped_spans} span(s); "
                f"{ATTRIBUTE_LIMIT_FIX}",
            )
        )
    gaps = [call.span_id for call in actions.model_calls if call.gap]
    if gaps:
        warnings.append(
            TraceWarning(
                code=WarningCode.MESSAGE_INDEX_GAP,
                message=f"message indexes have gaps on {len(gaps)} LLM span(s), so messages are missing; "
                f"{ATTRIBUTE_LIMIT_FIX}",
                span_id=gaps[0],
            )
        )
    return warnings


def _content_warnings(found: Findings) -> list[TraceWarning]:
    warnings = []
    contentless = found.tree.contentless_llm_spans
    if not found.steps:
        warnings.append(
            TraceWarning(
                code=WarningCode.NO_STEPS,
                message="no LLM or TOOL spans found; is OpenInference instrumentation enabled?",
            )
        )
    if not found.question and found.steps:
        fix = (
            "the model calls were recorded without their messages (see the no_message_content warning)"
            if contentless
            else "instrument the model client as well (OpenInference's OpenAI or LiteLLM instrumentor, or any "
            "emitter of gen_ai.input.messages) so the trace carries what the agent was asked"
        )
        warnings.append(
            TraceWarning(
                code=WarningCode.NO_QUESTION,
                message="no question found: the root span has no input.value stating one and no LLM span recorded a "
                f"user message; {fix}",
                span_id=found.tree.root.span_id,
            )
        )
    if contentless:
        warnings.append(
            TraceWarning(
                code=WarningCode.NO_MESSAGE_CONTENT,
                message=f"{contentless} model call(s) recorded without their messages, so their steps have no text, "
                f"tool arguments or results; {CAPTURE_CONTENT_HINT}",
            )
        )
    elif not found.actions.model_calls and any(s.kind is StepKind.TOOL_CALL for s in found.steps):
        warnings.append(
            TraceWarning(
                code=WarningCode.NO_MODEL_CALLS,
                message="no model call is on the trace: the tool steps have no reasoning and the answer has no step "
                "of its own; instrument the model client the framework calls as well (OpenInference's OpenAI, "
                "Anthropic, Google GenAI or LiteLLM instrumentor), or turn on the framework's own GenAI spans",
            )
        )
    if found.secrets:
        kinds = ", ".join(kind for kind, _ in found.redactor.patterns)
        warnings.append(
            TraceWarning(
                code=WarningCode.SECRETS_REDACTED,
                message=f"{found.secrets} secret(s) replaced by [REDACTED:kind] before storing or sending ({kinds}); "
                "add patterns with REFLECT_REDACT_PATTERNS",
            )
        )
    return warnings
