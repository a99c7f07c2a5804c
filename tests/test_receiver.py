"""The OTLP receiver with the real OTLP exporters (HTTP protobuf, HTTP gzip, gRPC) and hand-made bodies."""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import format_trace_id

from reflect_otel.collectors.receiver import OTLPReceiver, ReceiverLimits
from reflect_otel.collectors.trace_collector import BufferLimits
from reflect_otel.errors import ConfigError
from reflect_otel.testing.otlp_bodies import json_request, json_span
from reflect_otel.trace import StructuredTrace, WarningCode
from tests import agents
from tests.conftest import Instrumented

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


@dataclass
class Running:
    receiver: OTLPReceiver
    traces: list[StructuredTrace] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.receiver.http_port}/v1/traces"

    def flushed(self) -> dict[str, StructuredTrace]:
        assert self.receiver.force_flush(10_000)
        with self.lock:
            return {t.trace_id: t for t in self.traces}


def _start(**kwargs: object) -> Running:
    running = Running(receiver=None)  # type: ignore[arg-type]

    def sink(trace: StructuredTrace) -> None:
        with running.lock:
            running.traces.append(trace)

    running.receiver = OTLPReceiver(
        sink,
        http=("127.0.0.1", 0),
        grpc_endpoint=("127.0.0.1", 0),
        buffer_limits=kwargs.pop("buffer_limits", BufferLimits(grace_s=0.0)),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    ).start()
    return running


@pytest.fixture
def running() -> Iterator[Running]:
    r = _start()
    yield r
    r.receiver.shutdown(10_000)


def _agent_spans(instrumented: Instrumented) -> tuple[str, list]:  # type: ignore[type-arg]
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    agents.run_langgraph_agent(agents.build_langgraph_agent(), thread_id="otlp-thread")
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    return trace_id, instrumented.spans_of(trace_id)


def _same_as_in_process(received: StructuredTrace, instrumented: Instrumented) -> None:
    in_process = instrumented.assembled(received.trace_id)
    assert received.source.collector == "otlp"
    assert received == in_process.model_copy(update={"source": received.source})
    assert received.source.framework == "langgraph" and len(received.steps) == 4


# -- real exporters ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", ["none", "gzip", "deflate"])
def test_http_exporter(running: Running, instrumented: Instrumented, compression: str) -> None:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    codec = {"none": Compression.NoCompression, "gzip": Compression.Gzip, "deflate": Compression.Deflate}[compression]
    trace_id, spans = _agent_spans(instrumented)
    exporter = OTLPSpanExporter(endpoint=running.url, compression=codec)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    _same_as_in_process(running.flushed()[trace_id], instrumented)


def test_grpc_exporter(running: Running, instrumented: Instrumented) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    trace_id, spans = _agent_spans(instrumented)
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{running.receiver.grpc_port}", insecure=True)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    _same_as_in_process(running.flushed()[trace_id], instrumented)


def test_children_before_parents_across_requests(running: Running, instrumented: Instrumented) -> None:
    trace_id, spans = _agent_spans(instrumented)
    root = [s for s in spans if s.parent is None]
    children = [s for s in spans if s.parent is not None]
    for batch in (children, root):
        body = encode_spans(batch).SerializeToString()
        assert httpx.post(running.url, content=body, headers=PROTOBUF).status_code == 200
    _same_as_in_process(running.flushed()[trace_id], instrumented)


# -- hand-made JSON ---------------------------------------------------------------------------------------------
TRACE = "5b8efff798038103d269b633813fc60c"


def test_hand_made_json_with_partial_success(running: Running) -> None:
    root = json_span(TRACE, "a" * 16, None, "AGENT", 100, input__value="What is 2+2?", output__value="4")
    model = json_span(TRACE, "b" * 16, "a" * 16, "LLM", 110, llm__output_messages__0__message__content="4")
    bad_id = json_span(TRACE, "zz", "a" * 16, "LLM", 120)
    response = httpx.post(running.url, content=json.dumps(json_request(model, bad_id, root)), headers=JSON)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "invalid trace or span id" in partial["errorMessage"]
    trace = running.flushed()[TRACE]
    assert trace.question == "What is 2+2?" and trace.final_answer == "4"
    assert [s.reasoning for s in trace.steps] == ["4"]
    assert running.receiver.stats()["spans_rejected"] == 1


def test_non_utf8_json_is_replaced_and_protobuf_is_rejected(running: Running) -> None:
    root = json_span(TRACE, "c" * 16, None, "AGENT", 1, input__value="QUESTION")
    body = json.dumps(json_request(root)).replace("QUESTION", "caf\udce9").encode("utf-8", "surrogateescape")
    assert httpx.post(running.url, content=body, headers=JSON).status_code == 200
    assert running.flushed()[TRACE].question == "caf\ufffd"
    # protobuf string fields must be UTF-8: such a body is undecodable as a whole
    request = encode_spans([])
    scope = request.resource_spans.add().scope_spans.add()
    scope.spans.add(trace_id=bytes.fromhex("d" * 32), span_id=bytes.fromhex("e" * 16), name="x")
    corrupted = request.SerializeToString().replace(b"x", b"\xff")  # the name's only byte, now not UTF-8
    response = httpx.post(running.url, content=corrupted, headers=PROTOBUF)
    assert response.status_code == 400
    assert "not a valid OTLP protobuf" in status_pb2.Status.FromString(response.content).message


def test_bad_requests_get_clear_statuses() -> None:
    running = _start(limits=ReceiverLimits(max_body_bytes=50_000, max_decompressed_bytes=200_000))
    try:
        url = running.url
        full = encode_spans([]).SerializeToString()
        root = json_span(TRACE, "f" * 16, None, "AGENT", 1)
        body = json.dumps(json_request(root)).encode()
        proto_request = _proto_with_spans(3)
        cases = [
            (httpx.post(url, content=body, headers={"Content-Type": "text/plain"}), 415, "Content-Type"),
            (httpx.post(url, content=b"\x0a\xff\xff\xff", headers=PROTOBUF), 400, "not a valid OTLP protobuf"),
            (httpx.post(url, content=proto_request[:-7], headers=PROTOBUF), 400, "not a valid OTLP protobuf"),
            (httpx.post(url, content=b"{not json", headers=JSON), 400, "not valid JSON"),
            (httpx.post(url, content=b'{"x": 1}', headers=JSON), 400, "resourceSpans"),
            (httpx.post(url, content=b"x" * 60_000, headers=JSON), 413, "over the 50000-byte limit"),
            (
                httpx.post(
                    url, content=gzip.compress(b"\0" * 5_000_000), headers=PROTOBUF | {"Content-Encoding": "gzip"}
                ),
                413,
                "decompressed",
            ),
            (httpx.post(url, content=b"not gzip", headers=PROTOBUF | {"Content-Encoding": "gzip"}), 400, "gzip"),
            (httpx.post(url, content=body, headers=JSON | {"Content-Encoding": "br"}), 415, "Content-Encoding"),
            (httpx.post(url.replace("/v1/traces", "/v1/logs"), content=body, headers=JSON), 404, "/v1/traces"),
        ]
        for response, status, text in cases:
            assert response.status_code == status, (status, text, response.content)
            message = (
                response.json()["message"]
                if "json" in response.headers["content-type"]
                else (status_pb2.Status.FromString(response.content).message)
            )
            assert text in message, (text, message)
        assert running.receiver.stats()["requests_rejected"] == len(cases)
        # an empty request is a valid no-op
        assert httpx.post(url, content=full, headers=PROTOBUF).status_code == 200
        # the receiver still serves after all that
        assert httpx.post(url, content=body, headers=JSON).status_code == 200
    finally:
        running.receiver.shutdown(10_000)


def _proto_with_spans(count: int) -> bytes:
    request = encode_spans([])
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(count):
        scope.spans.add(trace_id=bytes.fromhex("1" * 32), span_id=(i + 1).to_bytes(8, "big"), name=f"s{i}")
    return request.SerializeToString()


def test_deflate_and_raw_deflate_bodies(running: Running) -> None:
    body = json.dumps(json_request(json_span(TRACE, "9" * 16, None, "AGENT", 1, input__value="zipped"))).encode()
    for data in (zlib.compress(body), zlib.compress(body)[2:-4]):
        response = httpx.post(running.url, content=data, headers=JSON | {"Content-Encoding": "deflate"})
        assert response.status_code == 200
    assert running.flushed()[TRACE].question == "zipped"


def test_ten_thousand_span_trace_over_protobuf() -> None:
    running = _start(limits=ReceiverLimits(max_body_bytes=64 * 1024 * 1024))
    try:
        request = encode_spans([])
        scope = request.resource_spans.add().scope_spans.add()
        trace_id = bytes.fromhex("7" * 32)
        root = scope.spans.add(trace_id=trace_id, span_id=(1).to_bytes(8, "big"), name="root")
        root.end_time_unix_nano = 10**9
        for i in range(2, 10_001):
            span = scope.spans.add(trace_id=trace_id, span_id=i.to_bytes(8, "big"), parent_span_id=root.span_id)
            span.name, span.start_time_unix_nano, span.end_time_unix_nano = "tool", i, i + 1
            span.attributes.add(key="openinference.span.kind").value.string_value = "TOOL"
            span.attributes.add(key="tool.name").value.string_value = f"t{i}"
        response = httpx.post(running.url, content=request.SerializeToString(), headers=PROTOBUF, timeout=60)
        assert response.status_code == 200
        assert not ExportTraceServiceResponse.FromString(response.content).HasField("partial_success")
        trace = running.flushed()["7" * 32]
        assert len(trace.steps) == 9_999
        assert trace.steps[0].tool_name == "t2" and trace.steps[-1].tool_name == "t10000"
    finally:
        running.receiver.shutdown(10_000)


def test_parent_never_arrives_and_duplicates() -> None:
    running = _start(buffer_limits=BufferLimits(grace_s=0.0, ttl_s=0.2))
    try:
        # no root ever arrives: assembled when the TTL passes, marked incomplete and with orphans noted
        lost = json_span(TRACE, "4" * 16, "5" * 16, "LLM", 1, llm__output_messages__0__message__content="alone")
        body = json.dumps(json_request(lost, lost)).encode()
        assert httpx.post(running.url, content=body, headers=JSON).status_code == 200
        import time

        deadline = time.monotonic() + 5
        while TRACE not in running.flushed() and time.monotonic() < deadline:
            time.sleep(0.05)
        trace = running.flushed()[TRACE]
        codes = {w.code for w in trace.warnings}
        # the one span that arrived recorded no user message: the question is missing too, and said so
        assert codes == {
            WarningCode.ROOT_NEVER_ENDED,
            WarningCode.ORPHAN_SPANS,
            WarningCode.DUPLICATE_SPANS,
            WarningCode.NO_QUESTION,
        }
        assert [s.reasoning for s in trace.steps] == ["alone"]
        assert running.receiver.stats()["traces_expired"] == 1
        # a span of that trace arriving afterwards is counted late, not turned into a second partial trace
        assert httpx.post(running.url, content=body, headers=JSON).status_code == 200
        running.flushed()
        assert running.receiver.stats()["spans_dropped_late"] == 2
    finally:
        running.receiver.shutdown(10_000)


def test_refuses_non_loopback_without_opt_in() -> None:
    with pytest.raises(ConfigError, match="no authentication"):
        OTLPReceiver(lambda t: None, http=("0.0.0.0", 0))
