"""Phoenix, for real: ``phoenix serve`` started on loopback with telemetry and external resources off; a real
LangGraph run is sent to it over OTLP, attributed (scripted auditor, real replay), and its annotation read back."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.trace import format_trace_id

from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.record import AttributionStatus
from reflect_otel.store import ExportResult
from tests import replay_agents
from tests.conftest import Instrumented

pytestmark = pytest.mark.phoenix


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("REFLECT_TEST_PHOENIX_URL"):  # a Phoenix already running (while writing a test)
        yield os.environ["REFLECT_TEST_PHOENIX_URL"]
        return
    if importlib.util.find_spec("phoenix") is None:
        message = "Phoenix is not installed: pip install 'reflect-otel[phoenix]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    port = _free_port()
    work = tmp_path_factory.mktemp("phoenix")
    env = os.environ | {
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_free_port()),
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    }
    log = (work / "phoenix.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "phoenix.server.main", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"phoenix serve exited: {(work / 'phoenix.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            pytest.fail("phoenix serve did not answer within 180 s")
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_attribution_is_annotated_on_the_decisive_span(phoenix: str, instrumented: Instrumented) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    from reflect_otel.exporters.phoenix import PhoenixAnnotationExporter
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    graph = replay_agents.build_graph()
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    assert replay_agents.run_graph(graph, "phoenix-thread") == replay_agents.WRONG
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    exporter = OTLPSpanExporter(endpoint=f"{phoenix}/v1/traces")
    assert exporter.export(instrumented.spans_of(trace_id)) is SpanExportResult.SUCCESS
    exporter.shutdown()

    trace = instrumented.assembled(trace_id)
    record = ReflectPipeline(
        replay_agents.scripted_auditor(), verifier=OracleVerifier(), config=ReflectConfig(gate=GateMode.HARD)
    ).attribute(trace, expected="2101000", replay=LangGraphReplayAdapter(graph, tracer_provider=instrumented.provider))
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 1 and record.span_id

    annotator = PhoenixAnnotationExporter(phoenix)
    deadline = time.monotonic() + 60
    while annotator.export([record]) is not ExportResult.SUCCESS:  # the spans are ingested asynchronously
        assert time.monotonic() < deadline, annotator.failure
        time.sleep(1)
    assert annotator.export([record]) is ExportResult.SUCCESS  # again: an update, not a second annotation
    spans = httpx.get(f"{phoenix}/v1/projects/default/span_annotations", params={"span_ids": record.span_id}).json()[
        "data"
    ]
    (annotation,) = [a for a in spans if a["name"] == "decisive_error"]
    assert (annotation["result"]["label"], annotation["result"]["score"]) == ("incorrect_problem_identification", None)
    # the score is measured (the share of replays from the verifying rollback point that flipped), not the 0.7 the
    # auditor said of itself, and has an annotation of its own: Phoenix's UI shows a score in place of the label
    (rate,) = [a for a in spans if a["name"] == "replay_flip_rate"]
    assert record.confidence is not None and rate["result"]["score"] == pytest.approx(record.confidence)
    assert annotation["metadata"]["confidence"].endswith("(measured)")
    # the explanation: the evidence of the replays, then the auditor's reading (its diagnosis is skipped when the
    # evidence proves the step: 2554a0f)
    assert annotation["result"]["explanation"] == record.explanation
    assert record.explanation.startswith('Step 1 did: lookup_population({"city": "Lyon"})')
    # step 1 regenerated with nothing kept before it (the rollback point counts the kept steps)
    assert annotation["metadata"]["rollback_point"] == 0 and annotation["metadata"]["flipped"] is True
    assert annotation["identifier"] == f"reflect:reflect:{trace_id}"
    traces = httpx.get(f"{phoenix}/v1/projects/default/trace_annotations", params={"trace_ids": trace_id}).json()[
        "data"
    ]
    assert [(a["result"]["label"], a["result"]["score"]) for a in traces if a["name"] == "reflect_attribution"] == [
        ("verified", None)
    ]
    annotator.shutdown()


def test_an_unverified_attribution_is_annotated_as_a_hypothesis_without_a_score(
    phoenix: str, instrumented: Instrumented
) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from reflect_otel.exporters.phoenix import PhoenixAnnotationExporter

    graph = replay_agents.build_graph()
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    assert replay_agents.run_graph(graph, "phoenix-unverified") == replay_agents.WRONG
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    exporter = OTLPSpanExporter(endpoint=f"{phoenix}/v1/traces")
    exporter.export(instrumented.spans_of(trace_id))
    exporter.shutdown()
    # no replay adapter: the auditor's localization stays its hypothesis (it said 0.7 of itself)
    record = ReflectPipeline(replay_agents.scripted_auditor(), verifier=OracleVerifier()).attribute(
        instrumented.assembled(trace_id), expected="2101000"
    )
    assert record.status is AttributionStatus.UNVERIFIED and record.span_id
    assert record.confidence is None and record.auditor_confidence == pytest.approx(0.7)

    annotator = PhoenixAnnotationExporter(phoenix)
    deadline = time.monotonic() + 60
    while annotator.export([record]) is not ExportResult.SUCCESS:
        assert time.monotonic() < deadline, annotator.failure
        time.sleep(1)
    spans = httpx.get(f"{phoenix}/v1/projects/default/span_annotations", params={"span_ids": record.span_id}).json()[
        "data"
    ]
    (annotation,) = spans  # no replay_flip_rate: nothing was measured
    assert annotation["name"] == "decisive_error"
    assert annotation["result"]["score"] is None  # no self-reported figure shown as a score
    assert annotation["result"]["label"] == "incorrect_problem_identification (hypothesis, not verified)"
    assert annotation["result"]["explanation"].startswith("Hypothesis, not verified: ")
    assert "0.7" not in str(annotation["metadata"].get("confidence"))
    traces = httpx.get(f"{phoenix}/v1/projects/default/trace_annotations", params={"trace_ids": trace_id}).json()[
        "data"
    ]
    (summary,) = [a for a in traces if a["name"] == "reflect_attribution"]
    assert (summary["result"]["label"], summary["result"]["score"]) == ("unverified", None)
    annotator.shutdown()


def _spans(phoenix: str, trace_id: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{phoenix}/v1/projects/default/spans", params={"trace_id": trace_id, "limit": 1000})
    data: list[dict[str, Any]] = response.json().get("data", [])
    return [s for s in data if s["context"]["trace_id"] == trace_id]


def _span_ids(phoenix: str, trace_id: str) -> set[str]:
    return {s["context"]["span_id"] for s in _spans(phoenix, trace_id)}


def _annotations_of(phoenix: str, span_id: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{phoenix}/v1/projects/default/span_annotations", params={"span_ids": span_id})
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def test_evaluation_events_show_on_the_judged_spans(phoenix: str, instrumented: Instrumented) -> None:
    """An attribution and the run's verdict as ``gen_ai.evaluation.result`` log records through the Logs API, which
    Phoenix shows as annotations of the spans they are parented to (the decisive step's, the run's root); the
    evaluator span, with its span event, sits under the decisive step."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from reflect_otel.exporters.attribution_spans import AttributionSpanExporter
    from reflect_otel.exporters.evaluation_events import explanation
    from reflect_otel.exporters.phoenix import PhoenixAnnotationExporter, PhoenixEvaluationLogExporter
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    graph = replay_agents.build_graph()
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    assert replay_agents.run_graph(graph, "phoenix-events") == replay_agents.WRONG
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    exporter = OTLPSpanExporter(endpoint=f"{phoenix}/v1/traces")
    exporter.export(instrumented.spans_of(trace_id))
    exporter.shutdown()
    trace = instrumented.assembled(trace_id)
    record = ReflectPipeline(
        replay_agents.scripted_auditor(), verifier=OracleVerifier(), config=ReflectConfig(gate=GateMode.HARD)
    ).attribute(trace, expected="2101000", replay=LangGraphReplayAdapter(graph, tracer_provider=instrumented.provider))
    assert record.status is AttributionStatus.VERIFIED and record.span_id and record.original_verdict
    assert trace.root_span_id

    deadline = time.monotonic() + 60
    while trace.root_span_id not in _span_ids(phoenix, trace_id):  # Phoenix ingests spans asynchronously
        assert time.monotonic() < deadline, "Phoenix did not ingest the run's spans within 60 s"
        time.sleep(0.5)
    events = AttributionSpanExporter(
        OTLPSpanExporter(endpoint=f"{phoenix}/v1/traces"), log_exporter=PhoenixEvaluationLogExporter(phoenix)
    )
    assert events.export([record]) is ExportResult.SUCCESS
    assert events.export_verdict(trace, record.original_verdict) is ExportResult.SUCCESS
    assert events.force_flush()
    events.shutdown()
    while len(_span_ids(phoenix, trace_id)) == len(instrumented.spans_of(trace_id)):  # the evaluator span, ingested
        assert time.monotonic() < deadline, "Phoenix did not ingest the evaluator span within 60 s"
        time.sleep(0.5)
    (decisive,) = _annotations_of(phoenix, record.span_id)
    assert decisive["name"] == "decisive_error" and decisive["annotator_kind"] == "LLM"
    assert (decisive["result"]["label"], decisive["result"]["score"]) == ("incorrect_problem_identification", None)
    assert decisive["metadata"]["score"] == pytest.approx(record.confidence)  # the measured rate, beside the label
    assert decisive["metadata"]["reflect.attribution.status"] == "verified"
    assert decisive["result"]["explanation"] == explanation(record)  # the event's, which starts with the evidence
    assert decisive["result"]["explanation"].startswith('Step 1 did: lookup_population({"city": "Lyon"})')
    (verdict,) = _annotations_of(phoenix, trace.root_span_id)
    assert (verdict["name"], verdict["annotator_kind"]) == ("run_verdict", "CODE")
    assert (verdict["result"]["label"], verdict["result"]["explanation"]) == (
        "incorrect",
        record.original_verdict.reasoning,
    )
    # the annotation exporter (--export phoenix) writes the same verdict annotation: an update, not a second one
    annotator = PhoenixAnnotationExporter(phoenix)
    assert annotator.export_verdict(trace, record.original_verdict) is ExportResult.SUCCESS
    annotator.shutdown()
    assert [a["id"] for a in _annotations_of(phoenix, trace.root_span_id)] == [verdict["id"]]
    # the evaluator span: in the judged trace, under the decisive step, its gen_ai.evaluation.result event kept
    (evaluator,) = [s for s in _spans(phoenix, trace_id) if s["name"].startswith("reflect.attribution")]
    assert evaluator["parent_id"] == record.span_id
    assert [e["name"] for e in evaluator["events"]] == ["gen_ai.evaluation.result"]


def test_phoenix_down_is_a_failure_that_says_why() -> None:
    from reflect_otel.exporters.phoenix import PhoenixAnnotationExporter
    from tests.test_store import _record

    exporter = PhoenixAnnotationExporter(f"http://127.0.0.1:{_free_port()}", retries=1)
    assert exporter.export([_record()]) is ExportResult.FAILURE
    assert "cannot reach" in exporter.failure and "(after 1 retries)" in exporter.failure
