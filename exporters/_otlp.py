"""The OTLP exporters we create, configured as the OTel specification says every SDK exporter is: the protocol
from ``OTEL_EXPORTER_OTLP_{TRACES,METRICS,LOGS}_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc`` or
``http/protobuf``, the default), endpoint and headers from the exporter's own ``OTEL_EXPORTER_OTLP_*`` variables,
and the service name from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` when the user set one."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from opentelemetry.sdk.resources import SERVICE_NAME, Resource

from reflect_otel.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk._logs.export import LogRecordExporter
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "logs_exported",
    "otlp_log_exporter",
    "otlp_metric_exporter",
    "otlp_protocol",
    "otlp_span_exporter",
    "service_resource",
]

Signal = Literal["traces", "metrics", "logs"]


def otlp_protocol(signal: Signal) -> str:
    """The configured protocol for ``signal``; a clear error for one the Python exporters do not speak."""
    specific = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
    value = (os.environ.get(specific) or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if value not in ("grpc", "http/protobuf"):
        raise ConfigError(
            f"{specific} / OTEL_EXPORTER_OTLP_PROTOCOL is {value!r}: the Python OTLP exporters speak 'grpc' and "
            "'http/protobuf' (there is no http/json exporter for Python); set one of those"
        )
    return value


def otlp_span_exporter() -> SpanExporter:
    if otlp_protocol("traces") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def otlp_metric_exporter() -> MetricExporter:
    if otlp_protocol("metrics") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        return GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()


def otlp_log_exporter() -> LogRecordExporter:
    if otlp_protocol("logs") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter

        return GrpcLogExporter()
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    return OTLPLogExporter()


def logs_exported() -> bool:
    """Whether to send log records beside the spans: not under ``OTEL_LOGS_EXPORTER=none`` (the SDK's switch, for a
    backend that takes no OTLP logs: Phoenix among them), and not when only the traces have an endpoint of their own
    (the logs would go to the default local endpoint, where the spans do not: set ``OTEL_EXPORTER_OTLP_ENDPOINT``
    or ``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT``)."""
    if os.environ.get("OTEL_LOGS_EXPORTER", "").strip().lower() == "none":
        return False
    named = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
    return any(os.environ.get(v) for v in named) or not os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def service_resource(default_name: str) -> Resource:
    """The SDK's resource from the environment; ``default_name`` only where the user named no service."""
    detected = Resource.create()
    if os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        return detected
    return detected.merge(Resource({SERVICE_NAME: default_name}))
