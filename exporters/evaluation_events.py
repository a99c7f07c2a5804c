"""Attributions and verdicts as the OTel GenAI conventions' evaluation events: each a ``gen_ai.evaluation.result``
log record emitted through the OTel Logs API, parented to the span it judges, as the conventions define it
(open-telemetry/semantic-conventions-genai, ``model/gen-ai/events.yaml``: the name required, the score's value and
label where there is one, the explanation recommended, ``error.type`` when the evaluation ended in an error).

An attribution judges the decisive step: its record is parented to that step's span (``decisive_error``: the
error type as the label, the measured flip rate as the value where replays measured one). A verdict judges the run's
answer: its record is parented to the run's root span (else its last step's; ``run_verdict``: ``correct``, ``incorrect`` or
``undecided``; the value is the verdict's score, how likely the run is wrong, where a flagging verifier gave one).
A backend that takes OTLP logs (the OpenTelemetry Collector, and what it feeds) shows them on those spans; Phoenix
takes no OTLP logs: :class:`reflect_otel.exporters.phoenix.PhoenixEvaluationLogExporter` writes the same records as
its span annotations.
"""

from __future__ import annotations

from opentelemetry import trace as otel_trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from reflect_otel.exporters._otlp import service_resource
from reflect_otel.reading.semconv import GenAIEvaluation, ReflectAttributes
from reflect_otel.reading.spans import is_span_id, is_trace_id
from reflect_otel.record import AttributionRecord, AttributionStatus
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = [
    "ATTRIBUTION_EVALUATION",
    "VERDICT_EVALUATION",
    "EvaluationEvents",
    "attribution_evaluation",
    "explanation",
    "run_span",
    "verdict_evaluation",
]

ATTRIBUTION_EVALUATION = "decisive_error"
"""``gen_ai.evaluation.name`` of an attribution (the Phoenix annotation of the decisive span has the same name)."""
VERDICT_EVALUATION = "run_verdict"
"""``gen_ai.evaluation.name`` of a verdict on a run's answer."""

_NO_MODEL_VERIFIERS = frozenset({"oracle", "bbm", "evidence", "consistency"})
"""Verifiers that judge without asking a model (against the expected answer, a benchmark's label, the evidence
rules, the agent's own resamples): their verdicts are ``CODE`` annotations, the others' ``LLM``."""

Attributes = dict[str, str | int | float | bool]


def explanation(record: AttributionRecord) -> str:
    """The record's explanation, said to be the auditor's hypothesis when no replay verified it."""
    text = record.explanation[:4000]
    if record.status is AttributionStatus.VERIFIED or not text:
        return text
    return f"Hypothesis, not verified: {text}"


def run_span(trace: StructuredTrace) -> str | None:
    """The span a verdict on the run's answer judges: the run's root span, else (a run whose root was not recorded)
    the span of its last step, which gave the answer."""
    if trace.root_span_id:
        return trace.root_span_id
    return next((step.span_id for step in reversed(trace.steps) if step.span_id), None)


def _kept(values: dict[str, str | int | float | bool | None]) -> Attributes:
    return {k: v for k, v in values.items() if v is not None}


def attribution_evaluation(record: AttributionRecord) -> Attributes | None:
    """The evaluation event's attributes for ``record``; None when it judges no step (skipped, or no step found)."""
    if record.status is AttributionStatus.SKIPPED or record.step_index is None:
        return None
    return _kept(
        {
            GenAIEvaluation.NAME: ATTRIBUTION_EVALUATION,
            GenAIEvaluation.SCORE_LABEL: record.error_type.value if record.error_type else "unclassified",
            GenAIEvaluation.SCORE_VALUE: record.confidence,  # measured by replays, or absent: never self-reported
            GenAIEvaluation.EXPLANATION: explanation(record) or None,
            GenAIEvaluation.ERROR_TYPE: record.errors[0].stage if record.errors else None,
            ReflectAttributes.STATUS: record.status.value,
            ReflectAttributes.METHOD: record.method,
            ReflectAttributes.ERROR_STEP_INDEX: record.step_index,
            ReflectAttributes.CLAIM: record.claim,
            ReflectAttributes.EVALUATION_ANNOTATOR_KIND: record.annotator_kind,
        }
    )


def verdict_evaluation(verdict: Verdict) -> Attributes:
    """The evaluation event's attributes for a verdict on a run's answer."""
    if verdict.is_correct is None:
        label = None if verdict.error else "undecided"
    else:
        label = "correct" if verdict.is_correct else "incorrect"
    text = verdict.reasoning or verdict.error or ""
    return _kept(
        {
            GenAIEvaluation.NAME: VERDICT_EVALUATION,
            GenAIEvaluation.SCORE_LABEL: label,
            GenAIEvaluation.SCORE_VALUE: verdict.score,
            GenAIEvaluation.EXPLANATION: text[:4000] or None,
            GenAIEvaluation.ERROR_TYPE: "verifier_failed" if verdict.error else None,
            ReflectAttributes.VERDICT_VERIFIER: verdict.verifier,
            ReflectAttributes.VERDICT_BASIS: verdict.basis,
            ReflectAttributes.EVALUATION_ANNOTATOR_KIND: "CODE" if verdict.verifier in _NO_MODEL_VERIFIERS else "LLM",
        }
    )


class EvaluationEvents:
    """Emits evaluation events through a ``LoggerProvider`` of its own (the application's is never touched), its
    batch processor sending them with ``log_exporter``: the agent's path never waits on the backend, and a backend
    that is down costs the SDK's log line, not an exception."""

    def __init__(self, log_exporter: LogRecordExporter, *, service_name: str = "reflect-otel") -> None:
        self._provider = LoggerProvider(resource=service_resource(service_name), shutdown_on_exit=False)
        self._provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
        self._logger = self._provider.get_logger("reflect_otel.exporters.evaluation_events")

    def attribution(self, record: AttributionRecord) -> None:
        """The record's event on its decisive step's span (nothing for a record that names no span)."""
        attributes = attribution_evaluation(record)
        if attributes is not None and record.span_id:
            self._emit(record.trace_id, record.span_id, attributes)

    def verdict(self, trace: StructuredTrace, verdict: Verdict) -> None:
        """The verdict's event on the run's span (:func:`run_span`; nothing for a run without spans)."""
        span_id = run_span(trace)
        if span_id:
            self._emit(trace.trace_id, span_id, verdict_evaluation(verdict))

    def _emit(self, trace_id: str, span_id: str, attributes: Attributes) -> None:
        if not (is_trace_id(trace_id) and is_span_id(span_id)):
            return
        judged = SpanContext(
            trace_id=int(trace_id, 16), span_id=int(span_id, 16), is_remote=True, trace_flags=TraceFlags(1)
        )
        context = otel_trace.set_span_in_context(NonRecordingSpan(judged))
        self._logger.emit(event_name=GenAIEvaluation.EVENT, context=context, attributes=attributes)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._provider.shutdown()
