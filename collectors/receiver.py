"""An OTLP receiver for agents in other processes: OTLP/HTTP (protobuf and JSON, gzip and deflate) and OTLP/gRPC.

Both transports decode into :class:`SpanRecord` s and feed one :class:`TraceCollector`, so traces are assembled
exactly as in process. Bad input never crashes it: 400 with a message for undecodable bodies, 411 without a
length, 413 over the size limits (before and after decompression), 415 for other content types or encodings,
and OTLP ``partial_success`` when some spans of a batch are rejected.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
import zlib
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from reflect_otel.assembly import AssemblyLimits
from reflect_otel.collectors.otlp import DecodedBatch, decode_json, decode_protobuf, decode_request
from reflect_otel.collectors.trace_collector import BufferLimits, TraceCollector, TraceSink
from reflect_otel.errors import ConfigError, InputError
from reflect_otel.spans import SpanRecord

__all__ = ["OTLPReceiver", "ReceiverLimits", "parse_endpoint"]

_log = logging.getLogger("reflect_otel.collectors.receiver")
_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_TRACES_PATH = "/v1/traces"


@dataclass(frozen=True, slots=True)
class ReceiverLimits:
    """Size limits on one request."""

    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body accepted as sent (compressed or not)."""
    max_decompressed_bytes: int = 64 * 1024 * 1024
    """Largest body after decompression; a gzip bomb stops here."""
    read_timeout_s: float = 30.0
    """How long a client may take to send its body."""


def parse_endpoint(text: str, *, default_port: int) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) into a tuple; raises :class:`ConfigError` naming the format."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, str(default_port)
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"endpoint {text!r}: expected HOST:PORT, e.g. 127.0.0.1:{default_port}")
    return host, int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":  # zlib-wrapped per the HTTP spec; raw deflate is common enough to accept too
        decompressor = zlib.decompressobj(zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS)
    else:
        raise _HTTPError(415, f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none")
    try:
        out = decompressor.decompress(body, limit + 1)
    except zlib.error as error:
        raise _HTTPError(400, f"body is not valid {encoding} data ({error})") from None
    if len(out) > limit or decompressor.unconsumed_tail:
        raise _HTTPError(413, f"decompressed body is over the {limit}-byte limit")
    return out


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class OTLPReceiver:
    """Receives OTLP traces over HTTP and/or gRPC and hands assembled traces to ``sink``.

    ``http``/``grpc`` are ``(host, port)``; port 0 picks a free port (see :attr:`http_port`, :attr:`grpc_port`).
    Binding to a non-loopback address needs ``allow_remote=True``: the receiver has no authentication.
    """

    def __init__(
        self,
        sink: TraceSink,
        *,
        http: tuple[str, int] | None = ("127.0.0.1", 4318),
        grpc_endpoint: tuple[str, int] | None = None,
        limits: ReceiverLimits | None = None,
        buffer_limits: BufferLimits | None = None,
        assembly_limits: AssemblyLimits | None = None,
        allow_remote: bool = False,
    ) -> None:
        if http is None and grpc_endpoint is None:
            raise ConfigError("enable at least one of the HTTP and gRPC endpoints")
        for endpoint in (http, grpc_endpoint):
            if endpoint is not None and not allow_remote and not _is_loopback(endpoint[0]):
                raise ConfigError(
                    f"refusing to listen on {endpoint[0]}: the receiver has no authentication; "
                    "bind to 127.0.0.1, or pass --allow-remote if a trusted network is really intended"
                )
        self.limits = limits or ReceiverLimits()
        self._collector: TraceCollector[SpanRecord] = TraceCollector(
            sink,
            convert=lambda record: record,
            collector_name="otlp",
            limits=buffer_limits,
            assembly_limits=assembly_limits,
        )
        self._lock = threading.Lock()
        self.requests_ok = 0
        self.requests_rejected = 0
        self.spans_rejected = 0
        self._http_server = self._make_http_server(http) if http is not None else None
        self._http_thread: threading.Thread | None = None
        self._grpc_server: grpc.Server | None = None
        self.grpc_port: int | None = None
        if grpc_endpoint is not None:
            self._grpc_server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="reflect-otlp-grpc"),
                options=[
                    ("grpc.max_receive_message_length", self.limits.max_decompressed_bytes),
                    ("grpc.so_reuseport", 0),  # a second receiver on the same port must fail, not share the traffic
                ],
            )
            trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
                _TraceService(self), self._grpc_server
            )
            host, port = grpc_endpoint
            try:
                self.grpc_port = self._grpc_server.add_insecure_port(
                    f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
                )
            except RuntimeError:  # grpcio raises where older versions returned 0
                self.grpc_port = 0
            if self.grpc_port == 0:
                raise ConfigError(f"could not bind gRPC to {host}:{port}; is the port in use?")

    @property
    def http_port(self) -> int | None:
        return self._http_server.server_address[1] if self._http_server is not None else None

    def start(self) -> OTLPReceiver:
        if self._http_server is not None:
            self._http_thread = threading.Thread(
                target=self._http_server.serve_forever, name="reflect-otlp-http", daemon=True
            )
            self._http_thread.start()
        if self._grpc_server is not None:
            self._grpc_server.start()
        return self

    def shutdown(self, timeout_s: float = 30.0) -> bool:
        """Stop listening, then assemble and hand over everything held."""
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=min(5.0, timeout_s)).wait()
        return self._collector.shutdown(timeout_s)

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        return self._collector.force_flush(timeout_s)

    def stats(self) -> dict[str, int]:
        with self._lock:
            own = {
                "requests_ok": self.requests_ok,
                "requests_rejected": self.requests_rejected,
                "spans_rejected": self.spans_rejected,
            }
        return own | self._collector.stats().as_dict()

    # -- shared by both transports ---------------------------------------------------------------------------
    def accept(self, batch: DecodedBatch) -> trace_service_pb2.ExportTraceServiceResponse:
        self._collector.submit_many(batch.spans)
        with self._lock:
            self.requests_ok += 1
            self.spans_rejected += batch.rejected
        response = trace_service_pb2.ExportTraceServiceResponse()
        if batch.rejected:
            response.partial_success.rejected_spans = batch.rejected
            response.partial_success.error_message = batch.error_message
        return response

    def count_rejected_request(self) -> None:
        with self._lock:
            self.requests_rejected += 1

    def _make_http_server(self, endpoint: tuple[str, int]) -> _Server:
        receiver = self

        class Handler(_OTLPHTTPHandler):
            pass

        Handler.receiver = receiver
        Handler.timeout = self.limits.read_timeout_s
        server_class = _DualStackServer if ":" in endpoint[0] else _Server
        try:
            server = server_class(endpoint, Handler)
        except OSError as error:
            raise ConfigError(f"could not listen on {endpoint[0]}:{endpoint[1]} ({error.strerror})") from None
        server.daemon_threads = True
        return server


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the listen backlog: socketserver's 5 reset connections under 200 concurrent posts


class _DualStackServer(_Server):
    address_family = socket.AF_INET6


class _OTLPHTTPHandler(BaseHTTPRequestHandler):
    receiver: OTLPReceiver
    protocol_version = "HTTP/1.1"
    server_version = "reflect-otel"

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s " + format, self.address_string(), *args)

    def do_POST(self) -> None:
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        try:
            if self.path.split("?")[0] != _TRACES_PATH:
                raise _HTTPError(404, f"no such endpoint {self.path!r}; OTLP traces go to {_TRACES_PATH}")
            if content_type not in (_PROTOBUF, _JSON):
                raise _HTTPError(415, f"Content-Type {content_type!r} is not supported; use {_PROTOBUF} or {_JSON}")
            body = self._read_body()
            encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
            body = _decompress(body, encoding, self.receiver.limits.max_decompressed_bytes)
            try:
                batch = decode_protobuf(body) if content_type == _PROTOBUF else decode_json(body)
            except InputError as error:
                raise _HTTPError(400, str(error)) from None
            response = self.receiver.accept(batch)
        except _HTTPError as error:
            self.receiver.count_rejected_request()
            self._send_error(error, content_type)
            return
        payload = _response_json(response) if content_type == _JSON else response.SerializeToString()
        self._send(200, content_type, payload)

    def _read_body(self) -> bytes:
        length_header = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or length_header is None:
            self.close_connection = True
            raise _HTTPError(411, "send a Content-Length header (chunked bodies are not accepted)")
        try:
            length = int(length_header)
        except ValueError:
            self.close_connection = True
            raise _HTTPError(400, f"Content-Length {length_header!r} is not a number") from None
        if length < 0:
            self.close_connection = True
            raise _HTTPError(400, "Content-Length is negative")
        if length > self.receiver.limits.max_body_bytes:
            self.close_connection = True  # the unread body makes the connection unusable
            raise _HTTPError(
                413, f"body of {length} bytes is over the {self.receiver.limits.max_body_bytes}-byte limit"
            )
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            raise _HTTPError(400, f"body ended after {len(body)} of {length} bytes")
        return body

    def _send_error(self, error: _HTTPError, content_type: str) -> None:
        status = status_pb2.Status(code=_GRPC_CODE_FOR_HTTP.get(error.status, 3), message=error.message)
        if content_type == _PROTOBUF:
            self._send(error.status, _PROTOBUF, status.SerializeToString())
        else:
            self._send(error.status, _JSON, json.dumps({"code": status.code, "message": error.message}).encode())

    def _send(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)


_GRPC_CODE_FOR_HTTP = {400: 3, 404: 5, 411: 3, 413: 8, 415: 3}


def _response_json(response: trace_service_pb2.ExportTraceServiceResponse) -> bytes:
    if not response.HasField("partial_success"):
        return b"{}"
    partial = response.partial_success
    return json.dumps(
        {"partialSuccess": {"rejectedSpans": str(partial.rejected_spans), "errorMessage": partial.error_message}}
    ).encode()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        try:
            batch = decode_request(request)
        except Exception as error:  # a bug in decoding must reach the client as an error, not kill the server
            self._receiver.count_rejected_request()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"could not decode the request ({error})")
        return self._receiver.accept(batch)
