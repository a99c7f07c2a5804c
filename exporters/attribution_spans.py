"""Attribution records as spans: each record becomes an OpenInference ``EVALUATOR`` span, a child of (and linked
to) the decisive step's span, so any OTLP backend (Tempo, Logfire, Jaeger, Phoenix) shows it inside the trace it
judges and can query its flat ``reflect.attribution.*`` attributes. It also carries OpenInference annotation
attributes and a ``gen_ai.evaluation.result`` span event.

Beside the span, each attribution and each verdict on a run is a ``gen_ai.evaluation.result`` log record, as the OTel
GenAI conventions define the event (:mod:`reflect_otel.exporters.evaluation_events`): through the Logs API, parented
to the judged span, sent by the OTLP log exporter the ``OTEL_EXPORTER_OTLP_LOGS_*`` variables configure
(``OTEL_LOGS_EXPORTER=none`` sends none: Phoenix takes no OTLP logs).

The exporter has its own ``TracerProvider`` and ``LoggerProvider``, so it never touches the application's. Each
record's span is sent at once, in the ``export`` call, so that a backend that is down or refusing comes back as an
:class:`~reflect_otel.store.ExportResult` ``FAILURE`` with its cause (the store keeps the record); the evaluation
events go through a batch processor (the SDK logs their failures).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags

from reflect_otel.exporters._otlp import logs_exported, otlp_log_exporter, otlp_span_exporter, service_resource
from reflect_otel.exporters.evaluation_events import ATTRIBUTION_EVALUATION, EvaluationEvents, explanation
from reflect_otel.reading.semconv import (
    AnnotationAttributes,
    GenAIEvaluation,
    OpenInferenceSpanKindValues,
    ReflectAttributes,
    SpanAttributes,
)
from reflect_otel.reading.spans import is_span_id, is_trace_id
from reflect_otel.record import AttributionRecord
from reflect_otel.store import ExportResult

if TYPE_CHECKING:
    from opentelemetry.sdk._logs.export import LogRecordExporter

    from reflect_otel.trace import StructuredTrace
    from reflect_otel.verdict import Verdict

__all__ = ["ANNOTATION_NAME", "AttributionSpanExporter", "record_attributes"]

ANNOTATION_NAME = ATTRIBUTION_EVALUATION


def record_attributes(record: AttributionRecord) -> dict[str, str | int | float | bool]:
    """The span attributes of a record (None values left out, as OTel requires)."""
    verified_by = record.verified_by
    sensitivity = record.effect.sensitivity if record.effect else None
    test = record.localization_test
    values: dict[str, str | int | float | bool | None] = {
        SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.EVALUATOR.value,
        ReflectAttributes.TRACE_ID: record.trace_id,
        ReflectAttributes.METHOD: record.method,
        ReflectAttributes.STATUS: record.status.value,
        ReflectAttributes.MODE: record.mode.value,
        ReflectAttributes.ERROR_STEP_INDEX: record.step_index,
        ReflectAttributes.ERROR_SPAN_ID: record.span_id,
        ReflectAttributes.ERROR_TYPE: record.error_type.value if record.error_type else None,
        ReflectAttributes.ROLLBACK_POINT: record.intervention.rollback_point if record.intervention else None,
        ReflectAttributes.CONFIDENCE: record.confidence,
        ReflectAttributes.CONFIDENCE_SAMPLES: record.confidence_samples,
        ReflectAttributes.CORRECTED_ANSWER: record.corrected_answer,
        ReflectAttributes.VERIFIED_BY_SOURCE: verified_by.source if verified_by else None,
        ReflectAttributes.VERIFIED_BY_KIND: verified_by.kind.value if verified_by else None,
        ReflectAttributes.REPLACEMENT_CALL: (
            verified_by.replacement.render()[:1000] if verified_by and verified_by.replacement else None
        ),
        ReflectAttributes.EFFECT: record.effect.text() if record.effect else None,
        ReflectAttributes.EFFECT_INTERVENTION_FLIPS: record.effect.intervention.flips if record.effect else None,
        ReflectAttributes.EFFECT_INTERVENTION_REPLAYS: record.effect.intervention.replays if record.effect else None,
        ReflectAttributes.EFFECT_CONTROL_FLIPS: record.effect.control.flips if record.effect else None,
        ReflectAttributes.EFFECT_CONTROL_REPLAYS: record.effect.control.replays if record.effect else None,
        ReflectAttributes.EFFECT_SENSITIVITY_FLIPS: sensitivity.flips if sensitivity else None,
        ReflectAttributes.EFFECT_SENSITIVITY_REPLAYS: sensitivity.replays if sensitivity else None,
        ReflectAttributes.CLAIM: record.claim,
        ReflectAttributes.LOCALIZATION_TEST: test.outcome.value if test else None,
        ReflectAttributes.OBSTACLE: record.obstacle.value if record.obstacle else None,
        ReflectAttributes.FIDELITY_CONTROLS: record.fidelity.controls if record.fidelity else None,
        ReflectAttributes.FIDELITY_REPRODUCED: record.fidelity.reproduced if record.fidelity else None,
        SpanAttributes.INPUT_VALUE: record.trace_id,
        SpanAttributes.OUTPUT_VALUE: explanation(record) or None,
        AnnotationAttributes.ANNOTATION_NAME: ANNOTATION_NAME,
        AnnotationAttributes.ANNOTATION_LABEL: record.error_type.value if record.error_type else None,
        AnnotationAttributes.ANNOTATION_SCORE: record.confidence,
        AnnotationAttributes.ANNOTATION_EXPLANATION: explanation(record) or None,
        AnnotationAttributes.ANNOTATION_ANNOTATOR_KIND: record.annotator_kind,
        AnnotationAttributes.ANNOTATION_IDENTIFIER: f"reflect:{record.method}:{record.trace_id}",
        AnnotationAttributes.ANNOTATION_METADATA: json.dumps(
            {
                "status": record.status.value,
                "step_index": record.step_index,
                "rollback_point": record.intervention.rollback_point if record.intervention else None,
                "claim": record.claim,
            }
        ),
    }
    return {k: v for k, v in values.items() if v is not None}


class _Said(logging.Handler):
    """What the SDK's exporters log on this thread during :meth:`listening`: the cause of a failed export
    (``Connection refused``, when they say it), which their ``SpanExportResult`` does not carry."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.first = ""
        self._thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self._thread and len(self.first) < 500:
            self.first = f"{self.first}; {record.getMessage()}"[2:502] if self.first else record.getMessage()[:500]

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        logger = logging.getLogger("opentelemetry.exporter")
        logger.addHandler(self)
        try:
            yield
        finally:
            logger.removeHandler(self)


class _Ended(SpanProcessor):
    """Keeps the spans that end, for the exporter to send them itself (and hear how it went)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


class AttributionSpanExporter:
    """With no arguments, the spans and the evaluation events go where the standard ``OTEL_EXPORTER_OTLP_*``
    variables say (protocol included; the events not under ``OTEL_LOGS_EXPORTER=none``, see
    :func:`~reflect_otel.exporters._otlp.logs_exported`). Given a ``span_exporter``, the events are sent only with a
    ``log_exporter`` of their own. The service name is ``OTEL_SERVICE_NAME`` when set, else ``service_name``."""

    def __init__(
        self,
        span_exporter: SpanExporter | None = None,
        *,
        log_exporter: LogRecordExporter | None = None,
        service_name: str = "reflect-otel",
    ) -> None:
        if span_exporter is None:
            span_exporter = otlp_span_exporter()
            if log_exporter is None and logs_exported():
                log_exporter = otlp_log_exporter()
        self._events = EvaluationEvents(log_exporter, service_name=service_name) if log_exporter else None
        self._span_exporter = span_exporter
        self._ended = _Ended()
        self._provider = TracerProvider(resource=service_resource(service_name))
        self._provider.add_span_processor(self._ended)
        self._tracer = self._provider.get_tracer("reflect_otel.exporters.attribution_spans")
        self.failure = ""

    def export(self, records: Sequence[AttributionRecord]) -> ExportResult:
        """Each record's span, sent now; FAILURE (and ``failure`` says why) when the span exporter failed."""
        for record in records:
            self._span(record)
        spans, self._ended.spans = self._ended.spans, []
        said = _Said()
        try:
            with said.listening():
                result = self._span_exporter.export(spans)
        except Exception as error:  # an exporter that raises: reported as the SDK's own would be
            result, said.first = SpanExportResult.FAILURE, f"{type(error).__name__}: {error}"
        sender = type(self._span_exporter).__name__
        where = getattr(self._span_exporter, "_endpoint", "")  # the OTLP exporters keep it there
        why = f"the span exporter ({sender}) failed to send {len(spans)} span(s){f' to {where}' if where else ''}: "
        why += said.first or "no cause given"
        self.failure = "" if result is SpanExportResult.SUCCESS else why
        return ExportResult.SUCCESS if result is SpanExportResult.SUCCESS else ExportResult.FAILURE

    def _span(self, record: AttributionRecord) -> None:
        decisive = None
        if is_trace_id(record.trace_id) and record.span_id and is_span_id(record.span_id):
            decisive = SpanContext(
                trace_id=int(record.trace_id, 16),
                span_id=int(record.span_id, 16),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
        parent = otel_trace.set_span_in_context(NonRecordingSpan(decisive)) if decisive else None
        span = self._tracer.start_span(
            f"reflect.attribution {record.status.value}",
            context=parent,
            links=[Link(decisive, {"reflect.link": "decisive_step"})] if decisive else (),
            attributes=record_attributes(record),
        )
        event = {
            GenAIEvaluation.NAME: ANNOTATION_NAME,
            GenAIEvaluation.SCORE_VALUE: record.confidence,
            GenAIEvaluation.SCORE_LABEL: record.error_type.value if record.error_type else None,
            GenAIEvaluation.EXPLANATION: explanation(record) or None,
        }
        span.add_event(GenAIEvaluation.EVENT, {k: v for k, v in event.items() if v is not None})
        span.end()
        if self._events is not None:
            self._events.attribution(record)

    def export_verdict(self, trace: StructuredTrace, verdict: Verdict) -> ExportResult:
        """The verdict on the run's answer, as an evaluation event on the run's span (its root, else its last step's),
        queued for the log exporter."""
        if self._events is not None:
            self._events.verdict(trace, verdict)
        return ExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        spans = self._span_exporter.force_flush(timeout_millis)
        return (self._events.force_flush(timeout_millis) if self._events is not None else True) and spans

    def shutdown(self) -> None:
        self._provider.shutdown()
        self._span_exporter.shutdown()
        if self._events is not None:
            self._events.shutdown()

    @classmethod
    def from_env(cls) -> AttributionSpanExporter:
        """OTLP as the ``OTEL_EXPORTER_OTLP_*`` variables say (endpoint, protocol, headers)."""
        return cls()
