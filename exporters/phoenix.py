"""Attributions as Phoenix annotations, through Phoenix's REST API (Phoenix ignores inline annotation attributes
and span links on ingest). On the decisive span: ``decisive_error`` (label = the error type, marked as a hypothesis
when no replay verified it; the explanation; the intervention in its metadata) and, only when a replay measured
it, ``replay_flip_rate`` (score = the share of the intervention's replays that flipped the outcome; its
explanation says what the control replay from the same prefix did). On the
trace: ``reflect_attribution`` (label = verified or unverified). Phoenix's UI shows an annotation's score in place
of its label when it has one, so no annotation carries both: a number always sits under a name that says what it
measured. Each has a stable ``identifier``, so posting a record again updates it instead of adding another.

Phoenix takes no OTLP logs, so the OTel GenAI conventions' evaluation events (``gen_ai.evaluation.result`` log
records, :mod:`reflect_otel.exporters.evaluation_events`) reach it through :class:`PhoenixEvaluationLogExporter`, a
log-record exporter that writes each as an annotation of the span it is parented to; the annotation exporter writes
a run's verdict so too (``run_verdict`` on the run's root span).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult

from reflect_otel.errors import ReflectError
from reflect_otel.exporters.evaluation_events import run_span, verdict_evaluation
from reflect_otel.reading.semconv import GenAIEvaluation, ReflectAttributes
from reflect_otel.record import AttributionRecord, AttributionStatus, ReplayArm
from reflect_otel.store import ExportResult

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import ReadableLogRecord

    from reflect_otel.trace import StructuredTrace
    from reflect_otel.verdict import Verdict

__all__ = [
    "PhoenixAnnotationError",
    "PhoenixAnnotationExporter",
    "PhoenixEvaluationLogExporter",
    "annotation_payloads",
    "evaluation_annotation",
]

_log = logging.getLogger(__name__)

ANNOTATION_NAME = "decisive_error"
FLIP_RATE_ANNOTATION_NAME = "replay_flip_rate"
TRACE_ANNOTATION_NAME = "reflect_attribution"


class PhoenixAnnotationError(ReflectError):
    """Phoenix refused or could not be reached after the retries."""


def annotation_payloads(record: AttributionRecord) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(span annotations, none when the record names no span; trace annotation), as Phoenix's REST API takes them."""
    flipped = any(a.flipped for a in record.replays if a.arm is ReplayArm.INTERVENTION)
    metadata: dict[str, Any] = {
        "method": record.method,
        "status": record.status.value,
        "mode": record.mode.value,
        "step_index": record.step_index,
        "rollback_point": record.intervention.rollback_point if record.intervention else None,
        "flipped": flipped,
        "injection": record.intervention.injection if record.intervention else None,
        "corrected_answer": record.corrected_answer,
        "confidence": record.confidence_text,
        "effect": record.effect.text() if record.effect else None,
        "fidelity": record.fidelity.text() if record.fidelity else None,
        "auditor_confidence": record.auditor_confidence,  # the auditor's self-report: never shown as a score
    }
    label = record.error_type.value if record.error_type else "unknown"
    verified = record.status is AttributionStatus.VERIFIED
    hypothesis = "" if verified else "Hypothesis, not verified: "
    if not verified:
        label = f"{label} (hypothesis, not verified)"
    spans: list[dict[str, Any]] = []
    if record.span_id:
        explanation = f"{hypothesis}{record.explanation[:10_000]}" if record.explanation else None
        spans.append(_annotation(record, ANNOTATION_NAME, _result(label, None, explanation), metadata))
        if record.confidence is not None:  # measured by replays
            flip = _result("flipped" if flipped else "not flipped", record.confidence, record.confidence_text)
            spans.append(_annotation(record, FLIP_RATE_ANNOTATION_NAME, flip, metadata))
    summary = f"{hypothesis}step {record.step_index} ({label}): {record.explanation[:2000]}"
    trace = _annotation(record, TRACE_ANNOTATION_NAME, _result(record.status.value, None, summary), metadata)
    del trace["span_id"]
    return spans, {"trace_id": record.trace_id, **trace}


def evaluation_annotation(span_id: str, attributes: Mapping[str, Any]) -> dict[str, Any] | None:
    """A ``gen_ai.evaluation.result`` event's attributes as a Phoenix span annotation on ``span_id`` (None without
    the required name). As above, no annotation carries both a label and a score: with both, the score goes to its
    metadata (``score``), beside the event's other attributes."""
    name = attributes.get(GenAIEvaluation.NAME)
    if not name:
        return None
    label = attributes.get(GenAIEvaluation.SCORE_LABEL)
    score = attributes.get(GenAIEvaluation.SCORE_VALUE)
    result = {"label": label, "score": None if label is not None else score}
    result["explanation"] = attributes.get(GenAIEvaluation.EXPLANATION)
    shown = (GenAIEvaluation.NAME, GenAIEvaluation.SCORE_LABEL, GenAIEvaluation.EXPLANATION)
    metadata = {
        k: v for k, v in attributes.items() if k not in shown and k != ReflectAttributes.EVALUATION_ANNOTATOR_KIND
    }
    if label is None:
        metadata.pop(GenAIEvaluation.SCORE_VALUE, None)
    return {
        "span_id": span_id,
        "name": str(name),
        "annotator_kind": str(attributes.get(ReflectAttributes.EVALUATION_ANNOTATOR_KIND) or "CODE"),
        "result": result,
        "metadata": {("score" if k == GenAIEvaluation.SCORE_VALUE else k): v for k, v in metadata.items()},
        "identifier": f"{GenAIEvaluation.EVENT}:{name}:{span_id}",
    }


def _result(label: str, score: float | None, explanation: str | None) -> dict[str, Any]:
    return {"label": label, "score": score, "explanation": explanation}


def _annotation(
    record: AttributionRecord, name: str, result: dict[str, Any], metadata: dict[str, Any]
) -> dict[str, Any]:
    """An annotation named ``name`` of the record's decisive span, identified by the record (a later export of the
    same record updates it)."""
    return {
        "span_id": record.span_id,
        "name": name,
        "annotator_kind": record.annotator_kind,
        "result": result,
        "metadata": metadata,
        "identifier": f"reflect:{record.method}:{record.trace_id}",
    }


class PhoenixAnnotationExporter:
    """``base_url`` defaults to ``PHOENIX_COLLECTOR_ENDPOINT`` (then ``http://127.0.0.1:6006``); ``api_key`` to
    ``PHOENIX_API_KEY``. Connection errors, 429 and 5xx are retried with backoff; then the export is a FAILURE and
    ``failure`` says what failed (the store still has the record)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        retries: int = 3,
        timeout_s: float = 30.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("PHOENIX_COLLECTOR_ENDPOINT") or "http://127.0.0.1:6006").rstrip(
            "/"
        )
        key = api_key or os.environ.get("PHOENIX_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = client or httpx.Client(timeout=timeout_s, headers=headers)
        self.retries = retries
        self.failure = ""

    def _post(self, path: str, payload: Mapping[str, Any]) -> Any:
        url = f"{self.base_url}{path}"
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                response = self._client.post(url, params={"sync": "true"}, json={"data": [payload]})
            except httpx.HTTPError as error:
                problem = f"cannot reach {url}: {error}"
            else:
                if response.status_code < 400:
                    return response.json()
                problem = f"{url} answered {response.status_code}: {response.text[:300]}"
                if response.status_code not in (408, 429) and response.status_code < 500:
                    raise PhoenixAnnotationError(problem)
            if attempt < self.retries:
                time.sleep(delay)
                delay *= 2
        raise PhoenixAnnotationError(f"{problem} (after {self.retries} retries)")

    def export(self, records: Sequence[AttributionRecord]) -> ExportResult:
        """Annotate each record's decisive span and its trace."""
        posts: list[tuple[str, Mapping[str, Any]]] = []
        for record in records:
            spans, trace = annotation_payloads(record)
            posts += [("/v1/span_annotations", span) for span in spans] + [("/v1/trace_annotations", trace)]
        return self._sent(posts)

    def export_verdict(self, trace: StructuredTrace, verdict: Verdict) -> ExportResult:
        """The verdict on the run's answer (``run_verdict``) on the run's span (its root, else its last step's)."""
        span_id = run_span(trace)
        payload = evaluation_annotation(span_id, verdict_evaluation(verdict)) if span_id else None
        return self._sent([("/v1/span_annotations", payload)] if payload is not None else [])

    def _sent(self, posts: Sequence[tuple[str, Mapping[str, Any]]]) -> ExportResult:
        """Post each (path, payload) in turn; FAILURE at the first that fails, ``failure`` saying why."""
        try:
            for path, payload in posts:
                self._post(path, payload)
        except PhoenixAnnotationError as error:
            self.failure = str(error)
            return ExportResult.FAILURE
        self.failure = ""
        return ExportResult.SUCCESS

    def post_annotation(self, payload: Mapping[str, Any]) -> None:
        """One span annotation as Phoenix's REST API takes it. Raises :class:`PhoenixAnnotationError`."""
        self._post("/v1/span_annotations", payload)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every export is sent before it returns

    def shutdown(self) -> None:
        self._client.close()

    @classmethod
    def from_env(cls) -> PhoenixAnnotationExporter:
        """``PHOENIX_COLLECTOR_ENDPOINT`` and ``PHOENIX_API_KEY``."""
        return cls()


class PhoenixEvaluationLogExporter(LogRecordExporter):
    """Writes ``gen_ai.evaluation.result`` log records as Phoenix span annotations on the span each is parented to
    (other records, and those with no span, are left out). Give it to a ``LoggerProvider``'s batch processor, or as
    ``AttributionSpanExporter(log_exporter=...)``. The span must be in Phoenix: an annotation of a span it has not
    ingested yet is refused, and the batch fails (logged, as the SDK logs any export that fails)."""

    def __init__(
        self, base_url: str | None = None, *, api_key: str | None = None, client: httpx.Client | None = None
    ) -> None:
        self._phoenix = PhoenixAnnotationExporter(base_url, api_key=api_key, client=client)

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        result = LogRecordExportResult.SUCCESS
        for item in batch:
            record = item.log_record
            if record.event_name != GenAIEvaluation.EVENT or not record.span_id:
                continue
            payload = evaluation_annotation(format(record.span_id, "016x"), dict(record.attributes or {}))
            if payload is None:
                continue
            try:
                self._phoenix.post_annotation(payload)
            except PhoenixAnnotationError as error:
                _log.warning("annotating span %s in Phoenix failed: %s", payload["span_id"], error)
                result = LogRecordExportResult.FAILURE
        return result

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        self._phoenix.shutdown()
