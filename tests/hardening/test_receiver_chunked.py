"""Chunked request bodies, as Node's HTTP client sends the OTel JS SDK's OTLP exports: read to their end within the
same byte limit as sized ones, and a malformed or ambiguous one refused with a clear answer."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from reflect_otel.collectors.receiver import OTLPReceiver, ReceiverLimits
from reflect_otel.testing import TraceSink
from tests.hardening.test_receiver_limits import body, span, start


def _post(port: int, headers: str, payload: bytes) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + headers.encode()
            + b"\r\n"
            + payload
        )
        raw.shutdown(socket.SHUT_WR)  # nothing more comes: a cut-off body ends here
        answer = b""
        while chunk := raw.recv(4096):  # a chunked request's connection is closed after the answer
            answer += chunk
    return answer.decode()


def _chunked(payload: bytes, size: int) -> bytes:
    pieces = [payload[i : i + size] for i in range(0, len(payload), size)]
    return b"".join(f"{len(p):x};ext=1\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\nX-Trailer: 1\r\n\r\n"


def test_a_chunked_export_is_received_whole() -> None:
    collected = TraceSink()
    receiver = start(collected, grace_s=0.0)
    try:
        payload = body(span(31, 1, parent=None, text="y" * 5000))
        answer = _post(receiver.http_port, "Transfer-Encoding: chunked\r\n", _chunked(payload, 777))
        assert answer.startswith("HTTP/1.1 200"), answer
        assert receiver.force_flush(10_000)
    finally:
        receiver.shutdown(10_000)
    assert f"{31:032x}" in collected.traces


@pytest.fixture(scope="module")
def refusing() -> Iterator[OTLPReceiver]:
    """One receiver for every refused body: each comes on a connection of its own (a shutdown waits 0.5 s)."""
    receiver = start(TraceSink())
    try:
        yield receiver
    finally:
        receiver.shutdown(10_000)


@pytest.mark.parametrize(
    ("headers", "payload", "status", "says"),
    [
        ("Transfer-Encoding: chunked\r\n", b"zz\r\nabc\r\n0\r\n\r\n", 400, "malformed chunk-size"),
        ("Transfer-Encoding: chunked\r\n", b"0x5\r\nabcde\r\n0\r\n\r\n", 400, "malformed chunk-size"),
        ("Transfer-Encoding: chunked\r\n", b"a\r\nabc", 400, "ended inside a chunk"),
        ("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", b"5\r\nabcde\r\n0\r\n\r\n", 400, "beside"),
        ("Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n", 400, "not supported"),
        ("", b"", 411, "chunked body"),
    ],
)
def test_a_malformed_or_ambiguous_body_is_refused(
    refusing: OTLPReceiver, headers: str, payload: bytes, status: int, says: str
) -> None:
    answer = _post(refusing.http_port, headers, payload)
    assert answer.startswith(f"HTTP/1.1 {status}") and says in answer, answer


def test_a_chunked_body_over_the_limit_is_413_before_it_is_all_read() -> None:
    receiver = start(TraceSink(), limits=ReceiverLimits(max_body_bytes=1000))
    try:
        answer = _post(receiver.http_port, "Transfer-Encoding: chunked\r\n", _chunked(b"x" * 3000, 600))
    finally:
        receiver.shutdown(10_000)
    assert answer.startswith("HTTP/1.1 413") and "1000-byte limit" in answer
