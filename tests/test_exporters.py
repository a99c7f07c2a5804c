"""Attribution spans (through the real OTLP exporter to our real receiver) and metrics (a real scrape endpoint)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reflect_otel.exporters.attribution_spans import ANNOTATION_NAME, AttributionSpanExporter
from reflect_otel.exporters.metrics import AttributionMetrics
from reflect_otel.reading.semconv import AnnotationAttributes, GenAIEvaluation, ReflectAttributes, SpanAttributes
from reflect_otel.record import AttributionRecord
from reflect_otel.store import ExportResult
from reflect_otel.testing.examples import verified_attribution
from reflect_otel.trace import StructuredTrace
from tests.test_store import _record


def test_record_becomes_an_evaluator_span_inside_the_judged_trace() -> None:
    record = _record()
    memory = InMemorySpanExporter()
    exporter = AttributionSpanExporter(memory)
    assert exporter.export([record]) is ExportResult.SUCCESS
    (span,) = memory.get_finished_spans()  # sent in the export call
    assert format(span.context.trace_id, "032x") == record.trace_id
    assert span.parent is not None and format(span.parent.span_id, "016x") == record.span_id
    (link,) = span.links
    assert format(link.context.span_id, "016x") == record.span_id
    attributes = dict(span.attributes or {})
    expected = {
        SpanAttributes.OPENINFERENCE_SPAN_KIND: "EVALUATOR",
        ReflectAttributes.TRACE_ID: record.trace_id,
        ReflectAttributes.METHOD: "reflect",
        ReflectAttributes.STATUS: "verified",
        ReflectAttributes.MODE: "replay",
        ReflectAttributes.ERROR_STEP_INDEX: 2,
        ReflectAttributes.ERROR_SPAN_ID: record.span_id,
        ReflectAttributes.ERROR_TYPE: "incorrect_problem_identification",
        ReflectAttributes.ROLLBACK_POINT: 1,  # step 1 kept, step 2 regenerated
        ReflectAttributes.CONFIDENCE: 1.0,  # measured: the one replay from step 1 flipped (the auditor said 0.8)
        ReflectAttributes.CONFIDENCE_SAMPLES: 1,
        ReflectAttributes.CORRECTED_ANSWER: "The answer is 42",
        ReflectAttributes.VERIFIED_BY_SOURCE: "proposal:llm",  # the agent's own step under the auditor's plan
        ReflectAttributes.VERIFIED_BY_KIND: "action",  # executed as an action
        ReflectAttributes.REPLACEMENT_CALL: 'multiply({"a": 6, "b": 7})',
        ReflectAttributes.EFFECT: "intervention flipped 1 of 1, control 0 of 1, sensitivity 0 of 1",
        ReflectAttributes.EFFECT_INTERVENTION_FLIPS: 1,
        ReflectAttributes.EFFECT_INTERVENTION_REPLAYS: 1,
        ReflectAttributes.EFFECT_CONTROL_FLIPS: 0,
        ReflectAttributes.EFFECT_CONTROL_REPLAYS: 1,
        ReflectAttributes.EFFECT_SENSITIVITY_FLIPS: 0,  # step 2 changed in text only did not flip the run
        ReflectAttributes.EFFECT_SENSITIVITY_REPLAYS: 1,
        ReflectAttributes.CLAIM: "decisive",  # the localization test found nothing to test elsewhere
        ReflectAttributes.LOCALIZATION_TEST: "untested",
        ReflectAttributes.FIDELITY_CONTROLS: 1,
        ReflectAttributes.FIDELITY_REPRODUCED: 1,
        SpanAttributes.INPUT_VALUE: record.trace_id,
        SpanAttributes.OUTPUT_VALUE: record.explanation,
        AnnotationAttributes.ANNOTATION_NAME: ANNOTATION_NAME,
        AnnotationAttributes.ANNOTATION_LABEL: "incorrect_problem_identification",
        AnnotationAttributes.ANNOTATION_SCORE: 1.0,
        AnnotationAttributes.ANNOTATION_EXPLANATION: record.explanation,
        AnnotationAttributes.ANNOTATION_ANNOTATOR_KIND: "LLM",
        AnnotationAttributes.ANNOTATION_IDENTIFIER: f"reflect:reflect:{record.trace_id}",
    }
    for key, value in expected.items():  # exhaustive: pop each expected key, then nothing may be left
        assert attributes.pop(key) == value, key
    metadata = json.loads(str(attributes.pop(AnnotationAttributes.ANNOTATION_METADATA)))
    assert metadata == {"status": "verified", "step_index": 2, "rollback_point": 1, "claim": "decisive"}
    assert attributes == {}
    (event,) = span.events
    assert event.name == GenAIEvaluation.EVENT
    assert dict(event.attributes or {}) == {
        GenAIEvaluation.NAME: ANNOTATION_NAME,
        GenAIEvaluation.SCORE_VALUE: 1.0,
        GenAIEvaluation.SCORE_LABEL: "incorrect_problem_identification",
        GenAIEvaluation.EXPLANATION: record.explanation,
    }
    exporter.shutdown()


def test_no_surface_shows_a_self_reported_figure_as_confidence() -> None:
    """An unverified record: the auditor said 0.8; spans, Phoenix's payloads and the report show no score, and
    say the explanation is a hypothesis."""
    from reflect_otel.exporters.attribution_spans import record_attributes
    from reflect_otel.exporters.phoenix import annotation_payloads
    from reflect_otel.exporters.report import render_report
    from reflect_otel.record import AttributionStatus

    trace, verified = verified_attribution()
    record = AttributionRecord.model_validate(
        verified.model_dump()
        | {
            "status": AttributionStatus.UNVERIFIED,
            "intervention": None,
            "effect": None,
            "confidence": None,
            "confidence_samples": None,
        }
    )
    assert record.auditor_confidence == 0.8 and record.confidence is None
    attributes = record_attributes(record)
    assert ReflectAttributes.CONFIDENCE not in attributes and AnnotationAttributes.ANNOTATION_SCORE not in attributes
    assert str(attributes[AnnotationAttributes.ANNOTATION_EXPLANATION]).startswith("Hypothesis, not verified: ")
    spans, whole = annotation_payloads(record)
    (span,) = spans  # no flip-rate annotation: nothing was measured
    assert span["result"]["score"] is None and whole["result"]["score"] is None
    assert "hypothesis, not verified" in span["result"]["label"]
    assert span["result"]["explanation"].startswith("Hypothesis, not verified: ")
    assert 0.8 not in [a["result"]["score"] for a in (*spans, whole)]
    # verified: the measured rate under a name that says what it is, apart from the error type's label
    spans, whole = annotation_payloads(verified)
    assert [(a["name"], a["result"]["score"]) for a in spans] == [("decisive_error", None), ("replay_flip_rate", 1.0)]
    assert (
        spans[1]["result"]["explanation"]
        == "intervention flipped 1 of 1, control 0 of 1, sensitivity 0 of 1 (measured)"
    )
    assert (whole["result"]["label"], whole["result"]["score"]) == ("verified", None)
    html = render_report(trace, record)
    assert "0.8" not in html and "Hypothesis, not verified" in html and "not measured" in html
    verified_html = render_report(trace, verified)
    assert "intervention flipped 1 of 1, control 0 of 1, sensitivity 0 of 1 (measured)" in verified_html


def test_a_record_of_an_earlier_version_keeps_its_self_report_apart() -> None:
    _, verified = verified_attribution()
    old = verified.model_dump(mode="json")
    del old["auditor_confidence"], old["confidence_samples"]
    old["confidence"] = 0.95  # what earlier versions stored: the auditor's figure
    loaded = AttributionRecord.model_validate(old)
    assert (loaded.auditor_confidence, loaded.confidence, loaded.confidence_samples) == (0.95, 1.0, 1)  # measured


def test_attribution_span_over_real_otlp_to_our_receiver() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from reflect_otel.collectors.receiver import OTLPReceiver
    from reflect_otel.collectors.trace_collector import BufferLimits

    received: list[StructuredTrace] = []
    receiver = OTLPReceiver(
        received.append, http=("127.0.0.1", 0), buffer_limits=BufferLimits(grace_s=0, ttl_s=0.2)
    ).start()
    try:
        record = _record()
        exporter = AttributionSpanExporter(
            OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces")
        )
        assert exporter.export([record]) is ExportResult.SUCCESS
        exporter.shutdown()
        receiver.shutdown(10_000)  # the span's parent (the decisive step) lives elsewhere: assembled at shutdown
    finally:
        receiver.shutdown(1000)
    (trace,) = received
    assert trace.trace_id == record.trace_id and receiver.stats()["spans_taken"] == 1


def test_export_to_a_down_endpoint_does_not_raise_and_says_why() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exporter = AttributionSpanExporter(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=1))
    assert exporter.export([_record()]) is ExportResult.FAILURE  # sent on this thread: the failure comes back
    assert f"failed to send 1 span(s) to http://127.0.0.1:{port}/v1/traces" in exporter.failure
    exporter.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_are_scraped_by_prometheus_format() -> None:
    from tests.test_pipeline import five_step_trace

    port = _free_port()
    metrics = AttributionMetrics(prometheus_port=port)
    try:
        record: AttributionRecord = _record()
        metrics.trace_seen(five_step_trace(), flagged=True)
        metrics.trace_seen(five_step_trace(), flagged=False)
        metrics.record_attributed(record)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        metrics.shutdown()
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if not k.startswith("otel_scope_"))
            values[f"{sample.name}{{{labels}}}"] = sample.value
    assert values['reflect_traces_seen_total{framework="unknown"}'] == 2
    assert values['reflect_traces_flagged_total{framework="unknown"}'] == 1
    assert values['reflect_traces_attributed_total{method="reflect"}'] == 1
    assert values['reflect_traces_verified_total{method="reflect"}'] == 1
    assert values['reflect_attributions_total{error_type="incorrect_problem_identification",method="reflect"}'] == 1
    localize = next(c for c in record.cost if c.stage == "localize")
    assert values['reflect_llm_tokens_total{direction="prompt",stage="localize"}'] == localize.prompt_tokens
    assert values['reflect_llm_requests_total{stage="localize"}'] == localize.requests


def _needs(binary: str) -> str:
    import os
    import shutil

    import pytest

    path = shutil.which(binary) or (f"/usr/bin/{binary}" if os.path.exists(f"/usr/bin/{binary}") else None)
    if path is None:
        message = f"{binary} is not installed (apt-get install {binary}); .ci/run installs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_real_prometheus_scrapes_the_metrics_endpoint(tmp_path: Path) -> None:
    import subprocess
    import time

    from tests.test_pipeline import five_step_trace

    prometheus = _needs("prometheus")
    port, prom_port = _free_port(), _free_port()
    metrics = AttributionMetrics(prometheus_port=port)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: reflect, static_configs: [{{targets: ['127.0.0.1:{port}']}}]}}]\n"
    )
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        metrics.trace_seen(five_step_trace(), flagged=True)
        metrics.record_attributed(_record())
        value = None
        deadline = time.monotonic() + 60
        while value is None and time.monotonic() < deadline:
            time.sleep(1)
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{prom_port}/api/v1/query",
                    params={"query": "sum(reflect_traces_verified_total)"},
                    timeout=5,
                ).json()
            except (httpx.HTTPError, ValueError):
                continue
            result = answer.get("data", {}).get("result", [])
            value = float(result[0]["value"][1]) if result else None
        assert value == 1.0
    finally:
        server.terminate()
        server.wait(timeout=20)
        metrics.shutdown()


def test_attribute_command_exports_and_survives_a_down_endpoint(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """The OTLP export goes over gRPC because OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says so; Phoenix is down: every
    record is kept, the OTLP ones arrive, and the command exits 1 saying what was not exported."""
    import duckdb

    from reflect_otel.cli import main
    from reflect_otel.collectors.receiver import OTLPReceiver
    from reflect_otel.collectors.trace_collector import BufferLimits

    received: list[StructuredTrace] = []
    receiver = OTLPReceiver(
        received.append, http=None, grpc_endpoint=("127.0.0.1", 0), buffer_limits=BufferLimits(grace_s=0, ttl_s=0.1)
    ).start()
    traces = tmp_path / "t.jsonl"
    assert main(["import", "--example", "-o", str(traces)]) == 0
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{receiver.grpc_port}")
    monkeypatch.setenv("PHOENIX_COLLECTOR_ENDPOINT", f"http://127.0.0.1:{_free_port()}")  # nobody listens
    monkeypatch.setattr(
        "reflect_otel.exporters.phoenix.PhoenixAnnotationExporter.from_env", classmethod(lambda cls: cls(retries=0))
    )
    code = main(
        [
            "attribute",
            str(traces),
            "--method",
            "first-step",
            "-o",
            str(tmp_path / "r.jsonl"),
            "--store",
            str(tmp_path / "s.duckdb"),
            "--export",
            "otlp",
            "--export",
            "phoenix",
        ]
    )
    receiver.shutdown(10_000)
    assert code == 1
    err = capsys.readouterr().err
    assert "5 record(s) could not be exported to phoenix" in err and "not every export succeeded" in err
    with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as db:  # nothing lost
        assert db.execute("SELECT count(*) FROM attributions").fetchone() == (5,)
    assert sorted(t.trace_id for t in received) == sorted(
        json.loads(line)["trace_id"] for line in (tmp_path / "r.jsonl").read_text().splitlines()
    )


def test_exporters_follow_the_otel_environment(monkeypatch: Any) -> None:
    from reflect_otel.errors import ConfigError
    from reflect_otel.exporters._otlp import otlp_protocol, otlp_span_exporter, service_resource

    assert otlp_protocol("traces") == "http/protobuf"  # the specification's default
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert type(otlp_span_exporter()).__module__.endswith("proto.grpc.trace_exporter")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")  # the signal's own variable wins
    with pytest.raises(ConfigError, match="grpc' and 'http/protobuf"):
        otlp_protocol("traces")
    assert service_resource("reflect-otel").attributes["service.name"] == "reflect-otel"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "checkout-evaluator")
    assert service_resource("reflect-otel").attributes["service.name"] == "checkout-evaluator"


def test_annotations_say_code_for_a_method_that_asked_no_model() -> None:
    from reflect_otel.exporters.phoenix import annotation_payloads
    from reflect_otel.testing.examples import verified_attribution

    _, record = verified_attribution()
    spans, trace = annotation_payloads(record)
    assert {a["annotator_kind"] for a in (*spans, trace)} == {"LLM"}
    floor = record.model_copy(update={"method": "first-step", "cost": ()})
    spans, trace = annotation_payloads(floor)
    assert {a["annotator_kind"] for a in (*spans, trace)} == {"CODE"}


def test_the_store_keeps_measured_confidence_and_the_self_report_apart(tmp_path: Path) -> None:
    from reflect_otel.exporters.duckdb_store import DuckDBStore
    from reflect_otel.record import AttributionStatus

    _, verified = verified_attribution()
    unverified = AttributionRecord.model_validate(
        verified.model_dump()
        | {
            "method": "aao",
            "status": AttributionStatus.UNVERIFIED,
            "intervention": None,
            "confidence": None,
            "confidence_samples": None,
        }
    )
    with DuckDBStore(tmp_path / "c.duckdb") as store:
        store.write_record(verified)
        store.write_record(unverified)
        store.force_flush()
        rows = store._read(
            "SELECT method, confidence, confidence_samples, auditor_confidence FROM attributions ORDER BY method", []
        )
    assert rows == [("aao", None, None, 0.8), ("reflect", 1.0, 1, 0.8)]
