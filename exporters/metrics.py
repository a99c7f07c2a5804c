"""Attribution metrics for Prometheus (an HTTP scrape endpoint) and OTLP: traces seen, flagged, attributed and
verified; attributions by error type; LLM tokens by stage; record exports that failed. Counter names are in ``ReflectMetrics``; Prometheus
shows them with dots as underscores and a ``_total`` suffix (``reflect_traces_seen_total``)."""

from __future__ import annotations

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader

from reflect_otel.errors import ConfigError
from reflect_otel.exporters._otlp import otlp_metric_exporter, service_resource
from reflect_otel.reading.semconv import ReflectMetrics
from reflect_otel.record import AttributionRecord, AttributionStatus
from reflect_otel.trace import StructuredTrace

__all__ = ["AttributionMetrics"]


class AttributionMetrics:
    """Counters on a meter provider of their own (so the application's is left alone). ``prometheus_port``
    starts a scrape endpoint on ``prometheus_host`` (loopback by default); ``otlp=True`` also pushes over OTLP
    (the standard ``OTEL_EXPORTER_OTLP_*`` variables configure it). ``readers`` adds others (tests use an
    in-memory reader)."""

    def __init__(
        self,
        *,
        prometheus_port: int | None = None,
        prometheus_host: str = "127.0.0.1",
        otlp: bool = False,
        readers: list[MetricReader] | None = None,
        service_name: str = "reflect-otel",
    ) -> None:
        all_readers = list(readers or [])
        self._server = None
        if prometheus_port is not None:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import REGISTRY, start_http_server

            all_readers.append(PrometheusMetricReader())
            try:
                self._server, _ = start_http_server(prometheus_port, addr=prometheus_host, registry=REGISTRY)
            except OSError as error:
                raise ConfigError(
                    f"cannot serve metrics on {prometheus_host}:{prometheus_port}: {error.strerror}"
                ) from None
        if otlp:
            all_readers.append(PeriodicExportingMetricReader(otlp_metric_exporter()))
        self._provider = MeterProvider(metric_readers=all_readers, resource=service_resource(service_name))
        meter: Meter = self._provider.get_meter("reflect_otel")
        self._seen = meter.create_counter(ReflectMetrics.TRACES_SEEN, description="Traces collected")
        self._flagged = meter.create_counter(ReflectMetrics.TRACES_FLAGGED, description="Traces flagged as failed")
        self._uncertain = meter.create_counter(
            ReflectMetrics.TRACES_UNCERTAIN, description="Traces the verifier could not judge"
        )
        self._attributed = meter.create_counter(ReflectMetrics.TRACES_ATTRIBUTED, description="Traces attributed")
        self._verified = meter.create_counter(
            ReflectMetrics.TRACES_VERIFIED, description="Replay-verified attributions"
        )
        self._by_type = meter.create_counter(
            ReflectMetrics.ATTRIBUTIONS_BY_ERROR_TYPE, description="Attributions by error type"
        )
        self._tokens = meter.create_counter(
            ReflectMetrics.LLM_TOKENS, unit="{token}", description="LLM tokens by stage"
        )
        self._requests = meter.create_counter(
            ReflectMetrics.LLM_REQUESTS, unit="{request}", description="Model requests by stage"
        )
        self._export_failures = meter.create_counter(
            ReflectMetrics.EXPORT_FAILURES, unit="{export}", description="Record exports that failed, by exporter"
        )

    def trace_seen(self, trace: StructuredTrace, *, flagged: bool, uncertain: bool = False) -> None:
        labels = {"framework": trace.source.framework}
        self._seen.add(1, labels)
        if flagged:
            self._flagged.add(1, labels)
        if uncertain:
            self._uncertain.add(1, labels)

    def record_attributed(self, record: AttributionRecord) -> None:
        if record.status is AttributionStatus.SKIPPED:
            return
        labels = {"method": record.method}
        self._attributed.add(1, labels)
        if record.status is AttributionStatus.VERIFIED:
            self._verified.add(1, labels)
        self._by_type.add(1, {"error_type": record.error_type.value if record.error_type else "unknown", **labels})
        for cost in record.cost:
            self._tokens.add(cost.prompt_tokens, {"stage": cost.stage, "direction": "prompt"})
            self._tokens.add(cost.completion_tokens, {"stage": cost.stage, "direction": "completion"})
            self._requests.add(cost.requests, {"stage": cost.stage})

    def export_failed(self, exporter: str) -> None:
        self._export_failures.add(1, {"exporter": exporter})

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._provider.shutdown()
        if self._server is not None:
            self._server.shutdown()
