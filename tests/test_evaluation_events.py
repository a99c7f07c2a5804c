"""Attributions and verdicts as ``gen_ai.evaluation.result`` log records (the OTel GenAI conventions' event, through
the Logs API), parented to the spans they judge; through the real OTLP log exporters, HTTP and gRPC, from the
``attribute`` command. The endpoint here is a sink on loopback that decodes OTLP requests with the OTLP protos
(``OTLPSink``): reflect-otel's receiver takes traces only, and no OpenTelemetry Collector installs on this
machine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reflect_otel.exporters.attribution_spans import AttributionSpanExporter
from reflect_otel.reading.semconv import GenAIEvaluation, ReflectAttributes
from reflect_otel.record import AttributionStatus
from reflect_otel.store import ExportResult
from reflect_otel.testing.examples import verified_attribution
from reflect_otel.verdict import Verdict


def _events(memory: InMemoryLogRecordExporter) -> list[tuple[str, str, str | None, dict[str, Any]]]:
    """(trace id, span id, event name, attributes) of each record."""
    return [
        (
            format(r.log_record.trace_id or 0, "032x"),
            format(r.log_record.span_id or 0, "016x"),
            r.log_record.event_name,
            dict(r.log_record.attributes or {}),
        )
        for r in memory.get_finished_logs()
    ]


def test_an_attribution_and_a_verdict_are_evaluation_events_on_the_spans_they_judge() -> None:
    trace, record = verified_attribution()
    trace = trace.model_copy(update={"root_span_id": "00000000000000aa"})
    memory = InMemoryLogRecordExporter()
    exporter = AttributionSpanExporter(InMemorySpanExporter(), log_exporter=memory)
    assert exporter.export([record]) is ExportResult.SUCCESS
    assert record.original_verdict is not None
    exporter.export_verdict(trace, record.original_verdict)
    assert exporter.force_flush()
    (attribution, verdict) = _events(memory)

    trace_id, span_id, name, attributes = attribution
    assert (trace_id, span_id, name) == (record.trace_id, record.span_id, GenAIEvaluation.EVENT)  # the decisive step
    expected: dict[str, Any] = {
        GenAIEvaluation.NAME: "decisive_error",
        GenAIEvaluation.SCORE_LABEL: "incorrect_problem_identification",
        GenAIEvaluation.SCORE_VALUE: 1.0,  # measured: the replay from step 1 flipped (the auditor said 0.8)
        GenAIEvaluation.EXPLANATION: record.explanation,
        ReflectAttributes.STATUS: "verified",
        ReflectAttributes.METHOD: "reflect",
        ReflectAttributes.ERROR_STEP_INDEX: 2,
        ReflectAttributes.CLAIM: "decisive",
        ReflectAttributes.EVALUATION_ANNOTATOR_KIND: "LLM",
    }
    for key, value in expected.items():  # exhaustive: pop each expected key, then nothing may be left
        assert attributes.pop(key) == value, key
    assert attributes == {}

    trace_id, span_id, name, attributes = verdict
    assert (trace_id, span_id, name) == (trace.trace_id, "00000000000000aa", GenAIEvaluation.EVENT)  # the run's root
    expected = {
        GenAIEvaluation.NAME: "run_verdict",
        GenAIEvaluation.SCORE_LABEL: "incorrect",
        GenAIEvaluation.EXPLANATION: "differs from the expected answer",
        ReflectAttributes.VERDICT_VERIFIER: "oracle",
        ReflectAttributes.EVALUATION_ANNOTATOR_KIND: "CODE",
    }
    for key, value in expected.items():
        assert attributes.pop(key) == value, key
    assert attributes == {}
    exporter.shutdown()


def test_what_an_event_says_of_a_hypothesis_a_failed_verifier_and_a_run_without_a_root() -> None:
    trace, verified = verified_attribution()
    unverified = verified.model_copy(
        update={"status": AttributionStatus.UNVERIFIED, "confidence": None, "confidence_samples": None, "effect": None}
    )
    skipped = verified.model_copy(update={"status": AttributionStatus.SKIPPED, "step_index": None})
    failed = Verdict(verifier="self", is_correct=None, confidence=None, error="the model endpoint is down")
    flagged = Verdict(
        verifier="consistency", is_correct=False, score=0.8, basis="consistency", reasoning="2 of 5 agree"
    )
    memory = InMemoryLogRecordExporter()
    exporter = AttributionSpanExporter(InMemorySpanExporter(), log_exporter=memory)
    assert exporter.export([unverified]) is ExportResult.SUCCESS
    assert exporter.export([skipped]) is ExportResult.SUCCESS  # judged right: no attribution event, the verdict says it
    assert trace.root_span_id is None  # no root recorded: the verdict goes to the step that answered
    exporter.export_verdict(trace, failed)
    exporter.export_verdict(trace, flagged)
    assert exporter.force_flush()
    hypothesis, down, scored = _events(memory)
    assert GenAIEvaluation.SCORE_VALUE not in hypothesis[3]  # no self-reported figure as a score
    assert str(hypothesis[3][GenAIEvaluation.EXPLANATION]).startswith("Hypothesis, not verified: ")
    assert down[1] == scored[1] == trace.steps[-1].span_id
    assert down[3] == {
        GenAIEvaluation.NAME: "run_verdict",
        GenAIEvaluation.EXPLANATION: "the model endpoint is down",
        GenAIEvaluation.ERROR_TYPE: "verifier_failed",
        ReflectAttributes.VERDICT_VERIFIER: "self",
        ReflectAttributes.EVALUATION_ANNOTATOR_KIND: "LLM",
    }
    assert (scored[3][GenAIEvaluation.SCORE_LABEL], scored[3][GenAIEvaluation.SCORE_VALUE]) == ("incorrect", 0.8)
    assert scored[3][ReflectAttributes.VERDICT_BASIS] == "consistency"
    exporter.shutdown()


@dataclass
class OTLPSink:
    """OTLP over HTTP (``/v1/traces``, ``/v1/logs``, protobuf) and gRPC (the trace and logs services) on loopback,
    keeping every request decoded with the OTLP protos."""

    logs: list[logs_service_pb2.ExportLogsServiceRequest] = field(default_factory=list)
    spans: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, path: str, body: bytes) -> bytes:
        with self.lock:
            if path.endswith("/v1/logs"):
                self.logs.append(logs_service_pb2.ExportLogsServiceRequest.FromString(body))
                return logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            self.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            return trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    def records(self) -> list[Any]:
        with self.lock:
            return [
                record
                for request in self.logs
                for resource in request.resource_logs
                for scope in resource.scope_logs
                for record in scope.log_records
            ]


@pytest.fixture
def sink() -> Iterator[tuple[OTLPSink, str, str]]:
    """The sink, its HTTP endpoint and its gRPC endpoint."""
    kept = OTLPSink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            answer = kept.take(self.path, body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            return logs_service_pb2.ExportLogsServiceResponse.FromString(
                kept.take("/v1/logs", request.SerializeToString())
            )

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            return trace_service_pb2.ExportTraceServiceResponse.FromString(
                kept.take("/v1/traces", request.SerializeToString())
            )

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield kept, f"http://127.0.0.1:{http.server_address[1]}", f"http://127.0.0.1:{port}"
    finally:
        http.shutdown()
        http.server_close()
        server.stop(0)


def _value(value: common_pb2.AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value") or "string_value")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_the_attribute_command_sends_the_events_through_the_otlp_exporters(
    protocol: str, sink: tuple[OTLPSink, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--export otlp`` with the standard variables: every run's verdict and every attribution that names a step
    arrive as log records with the convention's event name, their span, and its attributes; the spans too."""
    import json

    from reflect_otel.cli import main

    kept, http_url, grpc_url = sink
    traces = tmp_path / "t.jsonl"
    assert main(["import", "--example", "-o", str(traces)]) == 0
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", http_url if protocol == "http/protobuf" else grpc_url)
    out = tmp_path / "r.jsonl"
    code = main(["attribute", str(traces), "--method", "first-step", "-o", str(out), "--export", "otlp"])
    assert code == 0
    runs = [json.loads(line) for line in traces.read_text().splitlines()]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    received = kept.records()
    by_name: dict[str, list[Any]] = {}
    for record in received:
        attributes = {a.key: _value(a.value) for a in record.attributes}
        assert record.event_name == GenAIEvaluation.EVENT
        by_name.setdefault(attributes[GenAIEvaluation.NAME], []).append((record, attributes))
    verdicts = by_name.pop("run_verdict")
    attributions = by_name.pop("decisive_error")
    assert by_name == {}
    # one verdict per run, on its root span (else its answering step's), each labelled and explained
    roots = {
        r["trace_id"]: r["root_span_id"] or next(s["span_id"] for s in reversed(r["steps"]) if s["span_id"])
        for r in runs
    }
    assert sorted((r.trace_id.hex(), r.span_id.hex()) for r, _ in verdicts) == sorted(roots.items())
    labels = sorted(str(a.get(GenAIEvaluation.SCORE_LABEL)) for _, a in verdicts)
    assert labels == ["incorrect"] * 4 + ["undecided"], labels  # one example run carries no expected answer
    # one attribution event per record that names a step, on that step's span, with the convention's attributes
    named = {(r["trace_id"], r["span_id"]) for r in records if r["step_index"] is not None and r["span_id"]}
    assert {(r.trace_id.hex(), r.span_id.hex()) for r, _ in attributions} == named
    explained = {r["trace_id"]: r["explanation"] for r in records}
    for record, attributes in attributions:
        assert attributes[GenAIEvaluation.SCORE_LABEL]  # the error type, or unclassified
        assert attributes.get(GenAIEvaluation.EXPLANATION, "") == explained[record.trace_id.hex()]
        assert attributes[ReflectAttributes.EVALUATION_ANNOTATOR_KIND] == "CODE"  # first-step asks no model
    assert kept.spans == len(records)  # the evaluator spans stay
