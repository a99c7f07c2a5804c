"""The receiver under pressure and at shutdown: nothing acknowledged is lost, memory is bounded in bytes, a full
or closing receiver tells the sender to retry, and ambiguous or truncated bodies get a clear answer (HTTP and
gRPC)."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from reflect_otel.collectors.receiver import OTLPReceiver, ReceiverLimits
from reflect_otel.collectors.trace_collector import BufferLimits
from reflect_otel.errors import ConfigError
from reflect_otel.testing import TraceSink
from reflect_otel.trace import WarningCode

JSON = {"Content-Type": "application/json"}
PROTOBUF = {"Content-Type": "application/x-protobuf"}
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def start(collected: TraceSink, **limits: object) -> OTLPReceiver:
    return OTLPReceiver(
        collected,
        http=("127.0.0.1", 0),
        grpc_endpoint=("127.0.0.1", 0),
        limits=limits.pop("limits", None),  # type: ignore[arg-type]
        buffer_limits=BufferLimits(**limits),  # type: ignore[arg-type]
    ).start()


def span(trace: int, number: int, *, parent: int | None = 1, text: str = "x") -> dict[str, object]:
    out: dict[str, object] = {
        "traceId": f"{trace:032x}",
        "spanId": f"{number:016x}",
        "name": "tool",
        "startTimeUnixNano": str(100 + number),
        "endTimeUnixNano": str(200 + number),
        "attributes": [
            {"key": "openinference.span.kind", "value": {"stringValue": "TOOL"}},
            {"key": "output.value", "value": {"stringValue": text}},
        ],
    }
    if parent is not None:
        out["parentSpanId"] = f"{parent:016x}"
    return out


def body(*spans: dict[str, object]) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}).encode()


def url(receiver: OTLPReceiver) -> str:
    return f"http://127.0.0.1:{receiver.http_port}/v1/traces"


def test_a_full_receiver_answers_429_with_retry_after_and_keeps_none_of_the_refused_batch() -> None:
    collected = TraceSink()
    receiver = start(collected, max_buffered_bytes=20_000, grace_s=60.0)
    try:
        held = body(*(span(1, n, text="a" * 4_000) for n in range(2, 6)))  # ~16 KB, its root never comes
        assert httpx.post(url(receiver), content=held, headers=JSON).status_code == 200
        assert receiver.force_flush(10_000)
        refused = httpx.post(url(receiver), content=body(span(2, 2, text="b" * 8_000)), headers=JSON)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert "full" in refused.json()["message"]
        assert receiver.stats()["requests_refused"] == 1
        small = body(span(3, 1, parent=None, text="c"))  # fits: taken
        assert httpx.post(url(receiver), content=small, headers=JSON).status_code == 200
    finally:
        receiver.shutdown(10_000)
    assert set(collected.traces) == {f"{1:032x}", f"{3:032x}"}  # the refused trace was never acknowledged
    stats = receiver.stats()
    assert stats["peak_buffered_bytes"] <= 20_000 + 2_000
    assert sum(v for k, v in stats.items() if k.startswith("spans_dropped")) == 0


def test_a_trace_over_its_byte_limit_keeps_what_fits_and_says_so() -> None:
    collected = TraceSink()
    receiver = start(collected, max_bytes_per_trace=5_000, grace_s=0.0)
    try:
        spans = [span(7, 1, parent=None)] + [span(7, n, text="d" * 1_500) for n in range(2, 8)]
        assert httpx.post(url(receiver), content=body(*spans), headers=JSON).status_code == 200
    finally:
        receiver.shutdown(10_000)
    trace = collected.traces[f"{7:032x}"]
    (warning,) = [w for w in trace.warnings if w.code is WarningCode.DROPPED_SPANS]
    assert "5000 bytes" in warning.message and "max_bytes_per_trace" in warning.message
    assert receiver.stats()["spans_dropped_span_limit"] == 4  # root + 2 of 1.5 KB fit under 5 KB


def test_requests_over_the_span_count_limit_get_413_on_both_transports() -> None:
    receiver = start(TraceSink(), limits=ReceiverLimits(max_spans_per_request=10))
    try:
        many = [span(4, n) for n in range(1, 12)]
        response = httpx.post(url(receiver), content=body(*many), headers=JSON)
        assert response.status_code == 413 and "11 spans" in response.json()["message"]
        request = ExportTraceServiceRequest()
        scope = request.resource_spans.add().scope_spans.add()
        for n in range(1, 12):
            scope.spans.add(trace_id=bytes.fromhex("4" * 32), span_id=n.to_bytes(8, "big"), name="s")
        with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            export = channel.unary_unary(EXPORT)
            with pytest.raises(grpc.RpcError) as raised:
                export(request.SerializeToString(), timeout=10)
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "11 spans" in raised.value.details()
    finally:
        receiver.shutdown(10_000)


def test_grpc_garbage_is_invalid_argument_not_internal() -> None:
    receiver = start(TraceSink())
    try:
        with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            export = channel.unary_unary(EXPORT)
            with pytest.raises(grpc.RpcError) as raised:
                export(b"\x0a\xff\xff\xff\x0f", timeout=10)
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid OTLP protobuf" in raised.value.details()
        assert receiver.stats()["requests_rejected"] == 1
    finally:
        receiver.shutdown(10_000)


def test_truncated_gzip_is_400_and_x_gzip_is_gzip() -> None:
    collected = TraceSink()
    receiver = start(collected)
    try:
        zipped = gzip.compress(body(span(5, 1, parent=None, text="zipped")))
        for cut in (len(zipped) - 1, len(zipped) - 8, len(zipped) // 2):
            response = httpx.post(url(receiver), content=zipped[:cut], headers=JSON | {"Content-Encoding": "gzip"})
            assert response.status_code == 400, cut
        response = httpx.post(url(receiver), content=zipped, headers=JSON | {"Content-Encoding": "x-gzip"})
        assert response.status_code == 200
        assert receiver.force_flush(10_000)
    finally:
        receiver.shutdown(10_000)
    assert f"{5:032x}" in collected.traces


def test_two_content_length_headers_are_refused() -> None:
    receiver = start(TraceSink())
    try:
        payload = body(span(6, 1, parent=None))
        with socket.create_connection(("127.0.0.1", receiver.http_port), timeout=10) as raw:
            raw.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(payload)}\r\nContent-Length: 5\r\n\r\n".encode()
                + payload
            )
            answer = b""
            while chunk := raw.recv(4096):  # the receiver closes the connection after a 400
                answer += chunk
        assert answer.decode().startswith("HTTP/1.1 400") and "exactly one Content-Length" in answer.decode()
    finally:
        receiver.shutdown(10_000)


def test_nothing_acknowledged_is_lost_at_shutdown_and_later_posts_are_told_to_retry() -> None:
    collected = TraceSink()
    receiver = start(collected, grace_s=60.0)  # traces stay buffered until shutdown assembles them
    connection = http.client.HTTPConnection("127.0.0.1", receiver.http_port, timeout=10)  # kept alive
    acknowledged = []
    for trace in range(10, 20):
        connection.request("POST", "/v1/traces", body(span(trace, 1, parent=None)), JSON)
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        acknowledged.append(f"{trace:032x}")
    receiver.shutdown(10_000)
    connection.request("POST", "/v1/traces", body(span(99, 1, parent=None)), JSON)  # the handler thread lives on
    late = connection.getresponse()
    assert late.status == 503 and late.getheader("Retry-After") == "1" and b"shutting down" in late.read()
    connection.close()
    assert set(collected.traces) == set(acknowledged)
    assert receiver.stats()["requests_refused"] == 1


def test_more_concurrent_requests_than_slots_get_503_not_a_reset() -> None:
    receiver = start(TraceSink(), limits=ReceiverLimits(max_concurrent_requests=1, read_timeout_s=5))
    try:
        payload = body(span(8, 1, parent=None))
        slow = socket.create_connection(("127.0.0.1", receiver.http_port), timeout=10)
        slow.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        )  # holds the only slot while it "sends" its body
        threading.Event().wait(0.3)
        response = httpx.post(url(receiver), content=payload, headers=JSON)
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        slow.sendall(payload)
        assert slow.recv(4096).startswith(b"HTTP/1.1 200")
        slow.close()
    finally:
        receiver.shutdown(10_000)


def test_a_second_receiver_on_the_same_ports_fails_clearly() -> None:
    """gRPC must not share a port (SO_REUSEPORT would split the traffic between two collectors silently)."""
    first = start(TraceSink())
    try:
        with pytest.raises(ConfigError, match="is the port in use"):
            OTLPReceiver(lambda trace: None, http=None, grpc_endpoint=("127.0.0.1", first.grpc_port))
        with pytest.raises(ConfigError, match="could not listen"):
            OTLPReceiver(lambda trace: None, http=("127.0.0.1", first.http_port))
    finally:
        first.shutdown(10_000)


def test_two_hundred_concurrent_posts_are_all_answered() -> None:
    receiver = start(TraceSink(), grace_s=0.0)
    payload = body(span(7, 1, parent=None))

    def post(_: int) -> tuple[int, str | None]:
        response = httpx.post(url(receiver), content=payload, headers=JSON, timeout=30)
        return response.status_code, response.headers.get("retry-after")

    try:
        with ThreadPoolExecutor(max_workers=200) as pool:
            answers = list(pool.map(post, range(200)))
    finally:
        receiver.shutdown(10_000)
    # none reset by a full listen backlog: each is taken, or told to retry when over the concurrent-request slots
    assert all(answer in ((200, None), (503, "1")) for answer in answers), set(answers)
    refused = sum(1 for status, _ in answers if status == 503)
    assert receiver.stats()["requests_refused"] == refused
    assert receiver.stats()["requests_ok"] == 200 - refused
