"""An OTLP receiver for agents in other processes: OTLP/HTTP (protobuf and JSON, gzip and deflate) and OTLP/gRPC.

Both transports decode into :class:`SpanRecord` s and feed one :class:`TraceCollector`, so traces are assembled
exactly as in process. Bad input never crashes it: 400 with a message for undecodable, truncated or ambiguous
bodies (gRPC: INVALID_ARGUMENT), 411 without a length or a chunked body, 413 over the size or span-count limits (before and after
decompression), 415 for other content types or encodings, and OTLP ``partial_success`` when some spans of a batch
are rejected.

Nothing acknowledged is dropped: a batch is admitted whole or refused. When the bytes held or the queue are at
their bounds the answer is 429 (gRPC: RESOURCE_EXHAUSTED), over ``max_concurrent_requests`` or while shutting down
503 (gRPC: UNAVAILABLE), each with ``Retry-After``; OTLP exporters retry those. ``shutdown`` stops admitting
first, then assembles and hands over everything admitted.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import re
import socket
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from reflect_otel.collectors.otlp import BatchTooLargeError, DecodedBatch, decode_json, decode_protobuf
from reflect_otel.collectors.trace_collector import BufferLimits, TraceCollector, TraceSink
from reflect_otel.errors import ConfigError, InputError
from reflect_otel.reading.spans import SpanRecord, approx_bytes

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
    max_spans_per_request: int = 100_000
    """Most spans one request may carry (a small compressed body can hold millions of tiny spans)."""
    max_concurrent_requests: int = 16
    """Requests handled at once per transport; more get 503 / RESOURCE_EXHAUSTED at once."""
    max_inflight_bytes: int = 128 * 1024 * 1024
    """Decompressed bytes of the requests being decoded at once (both transports); a request that would pass it
    gets 429 / RESOURCE_EXHAUSTED. Compressed bodies are counted while they inflate, a megabyte ahead, so concurrent
    gzip bombs are refused before they are held. One request is always let through, so a body under
    ``max_decompressed_bytes`` is never refused for ever."""
    retry_after_s: int = 1
    """The ``Retry-After`` a refused sender is given."""


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


_DECOMPRESS_CHUNK = 1024 * 1024
"""Bytes decompressed between two reservations: what one request may hold beyond ``max_inflight_bytes``."""


def _decompress(body: bytes, encoding: str, limit: int, reserve: Callable[[int], None]) -> bytes:
    """``body`` decoded per ``encoding``, at most ``limit`` bytes; ``reserve(n)`` is called with the bytes about to
    be held before each chunk is inflated, so that concurrent bombs are refused while decompressing, not after."""
    if encoding in ("", "identity"):
        reserve(len(body))
        return body
    if encoding in ("gzip", "x-gzip"):
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":  # zlib-wrapped per the HTTP spec; raw deflate is common enough to accept too
        decompressor = zlib.decompressobj(zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS)
    else:
        raise _HTTPError(415, f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none")
    chunks: list[bytes] = []
    held = 0
    pending = body
    try:
        while not decompressor.eof and held <= limit:
            reserve(held + _DECOMPRESS_CHUNK)
            chunk = decompressor.decompress(pending, min(_DECOMPRESS_CHUNK, limit + 1 - held))
            pending = decompressor.unconsumed_tail
            chunks.append(chunk)
            held += len(chunk)
            if not chunk and not pending:
                break  # the input is used up and nothing more comes out: a truncated stream
    except zlib.error as error:
        raise _HTTPError(400, f"body is not valid {encoding} data ({error})") from None
    if held > limit:
        raise _HTTPError(413, f"decompressed body is over the {limit}-byte limit")
    if not decompressor.eof:
        raise _HTTPError(400, f"the {encoding} body is truncated (its stream does not end)")
    out = b"".join(chunks)
    reserve(len(out))
    return out


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


class _Refused(Exception):
    """A valid batch the receiver cannot take now; the sender should retry."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.busy = reason == "full"


class OTLPReceiver:
    """Receives OTLP traces over HTTP and/or gRPC and hands assembled traces to ``sink``.

    ``http``/``grpc`` are ``(host, port)``; ``limits`` bound each request, ``buffer_limits`` the traces being
    gathered and assembled; port 0 picks a free port (see :attr:`http_port`, :attr:`grpc_port`).
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
        )
        self._lock = threading.Lock()
        self.requests_ok = 0
        self.requests_rejected = 0
        self.requests_refused = 0
        """Valid requests refused for now (429/503, RESOURCE_EXHAUSTED/UNAVAILABLE); their senders retry."""
        self.spans_rejected = 0
        self._http_slots = threading.BoundedSemaphore(self.limits.max_concurrent_requests)
        self._inflight_bytes = 0
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
                maximum_concurrent_rpcs=self.limits.max_concurrent_requests,  # beyond: RESOURCE_EXHAUSTED
            )
            self._grpc_server.add_generic_rpc_handlers((_trace_service_handler(self),))
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

    def shutdown(self, timeout_millis: int = 30_000) -> None:
        """Stop admitting (requests still in flight get 503 / UNAVAILABLE), stop listening, then assemble and hand
        over everything admitted."""
        self._collector.stop_admitting()
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=min(5.0, timeout_millis / 1000)).wait()
        self._collector.shutdown(timeout_millis)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._collector.force_flush(timeout_millis)

    def stats(self) -> dict[str, int]:
        with self._lock:
            own = {
                "requests_ok": self.requests_ok,
                "requests_rejected": self.requests_rejected,
                "requests_refused": self.requests_refused,
                "spans_rejected": self.spans_rejected,
            }
        return own | self._collector.stats().as_dict()

    # -- shared by both transports ---------------------------------------------------------------------------
    def accept(self, batch: DecodedBatch) -> trace_service_pb2.ExportTraceServiceResponse:
        """Admit ``batch`` whole, or raise :class:`_Refused` (nothing of it kept) for the sender to retry."""
        admitted = self._collector.offer(batch.spans, [approx_bytes(s) for s in batch.spans])
        if admitted != "ok":
            with self._lock:
                self.requests_refused += 1
            raise _Refused(admitted)
        with self._lock:
            self.requests_ok += 1
            self.spans_rejected += batch.rejected
        response = trace_service_pb2.ExportTraceServiceResponse()
        if batch.rejected:
            response.partial_success.rejected_spans = batch.rejected
            response.partial_success.error_message = batch.error_message
        return response

    @contextlib.contextmanager
    def decoding(self) -> Iterator[Callable[[int], None]]:
        """Hold decompressed bytes in flight while a request is decompressed, decoded and admitted. Yields
        ``reserve(n)``, which grows (or shrinks) the request's hold to ``n`` bytes, raising :class:`_Refused`
        (``"full"``) when that would pass ``max_inflight_bytes`` while other requests hold bytes too (one request
        alone is always let through), or when the collector has no room for it."""
        held = 0

        def reserve(size: int) -> None:
            nonlocal held
            with self._lock:
                others = self._inflight_bytes - held
                if size > held and (
                    (others and others + size > self.limits.max_inflight_bytes) or not self._collector.has_room(size)
                ):
                    self.requests_refused += 1
                    raise _Refused("full")
                self._inflight_bytes += size - held
                held = size

        try:
            yield reserve
        finally:
            with self._lock:
                self._inflight_bytes -= held

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
        receiver = self.receiver
        retry = receiver.limits.retry_after_s
        if not receiver._http_slots.acquire(blocking=False):
            self.close_connection = True  # the body is left unread
            with receiver._lock:
                receiver.requests_refused += 1
            self._send_error(_HTTPError(503, "too many requests at once; retry", retry_after_s=retry), content_type)
            return
        try:
            response = self._export(content_type)
        except _HTTPError as error:
            receiver.count_rejected_request()
            self._send_error(error, content_type)
            return
        except _Refused as refused:
            if not refused.busy:
                self.close_connection = True
            status, text = (429, "the receiver is full") if refused.busy else (503, "the receiver is shutting down")
            self._send_error(_HTTPError(status, f"{text}; retry", retry_after_s=retry), content_type)
            return
        finally:
            receiver._http_slots.release()
        payload = _response_json(response) if content_type == _JSON else response.SerializeToString()
        self._send(200, content_type, payload)

    def _export(self, content_type: str) -> trace_service_pb2.ExportTraceServiceResponse:
        if self.path.split("?")[0] != _TRACES_PATH:
            raise _HTTPError(404, f"no such endpoint {self.path!r}; OTLP traces go to {_TRACES_PATH}")
        if content_type not in (_PROTOBUF, _JSON):
            raise _HTTPError(415, f"Content-Type {content_type!r} is not supported; use {_PROTOBUF} or {_JSON}")
        body = self._read_body()
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        limits = self.receiver.limits
        decode = decode_protobuf if content_type == _PROTOBUF else decode_json
        with self.receiver.decoding() as reserve:
            body = _decompress(body, encoding, limits.max_decompressed_bytes, reserve)
            try:
                batch = decode(body, max_spans=limits.max_spans_per_request)
            except BatchTooLargeError as error:
                raise _HTTPError(413, str(error)) from None
            except InputError as error:
                raise _HTTPError(400, str(error)) from None
            return self.receiver.accept(batch)

    def _read_body(self) -> bytes:
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) > 1:
            self.close_connection = True  # request smuggling looks like this: never guess which one is meant
            raise _HTTPError(400, "send exactly one Content-Length header")
        length_header = self.headers.get("Content-Length")
        transfer = (self.headers.get("Transfer-Encoding") or "").strip().lower()
        if transfer:
            self.close_connection = True  # a chunked body is read to its end only when it is well formed
            if transfer != "chunked" or length_header is not None:  # both: request smuggling looks like this
                raise _HTTPError(400, f"Transfer-Encoding {transfer!r} is not supported beside or instead of chunked")
            return self._read_chunked()
        if length_header is None:
            self.close_connection = True
            raise _HTTPError(411, "send a Content-Length header or a chunked body")
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

    def _read_chunked(self) -> bytes:
        """A ``Transfer-Encoding: chunked`` body (as Node's HTTP client sends the OTel JS SDK's exports), held to
        the same byte limit as a sized one; trailers are read and ignored."""
        limit = self.receiver.limits.max_body_bytes
        body = bytearray()
        while True:
            size = _chunk_size(self.rfile.readline(_MAX_CHUNK_LINE + 1))
            if size == 0:
                break
            if len(body) + size > limit:
                raise _HTTPError(413, f"chunked body is over the {limit}-byte limit")
            chunk = self.rfile.read(size)
            if len(chunk) != size or self.rfile.read(2) != b"\r\n":
                raise _HTTPError(400, f"chunked body ended inside a chunk, after {len(body) + len(chunk)} bytes")
            body += chunk
        for _ in range(_MAX_TRAILERS + 1):
            line = self.rfile.readline(_MAX_CHUNK_LINE + 1)
            if line in (b"\r\n", b"\n", b""):
                return bytes(body)
            if len(line) > _MAX_CHUNK_LINE:
                break
        raise _HTTPError(400, "chunked body's trailers are too long")

    def _send_error(self, error: _HTTPError, content_type: str) -> None:
        status = status_pb2.Status(code=_GRPC_CODE_FOR_HTTP.get(error.status, 3), message=error.message)
        retry = error.retry_after_s
        if content_type == _PROTOBUF:
            self._send(error.status, _PROTOBUF, status.SerializeToString(), retry_after_s=retry)
        else:
            body = json.dumps({"code": status.code, "message": error.message}).encode()
            self._send(error.status, _JSON, body, retry_after_s=retry)

    def _send(self, status: int, content_type: str, payload: bytes, *, retry_after_s: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if retry_after_s is not None:
            self.send_header("Retry-After", str(retry_after_s))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)


_MAX_CHUNK_LINE = 1024
_MAX_TRAILERS = 32
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")


def _chunk_size(line: bytes) -> int:
    """The size on a chunk's first line (``1a3f;ext=1``); a malformed line is a 400."""
    size = line.split(b";", 1)[0].strip()
    if len(line) > _MAX_CHUNK_LINE or not line.endswith(b"\n") or not _CHUNK_SIZE.fullmatch(size):
        raise _HTTPError(400, "chunked body has a malformed chunk-size line")
    return int(size, 16)


_GRPC_CODE_FOR_HTTP = {400: 3, 404: 5, 411: 3, 413: 8, 415: 3, 429: 8, 503: 14}


def _response_json(response: trace_service_pb2.ExportTraceServiceResponse) -> bytes:
    if not response.HasField("partial_success"):
        return b"{}"
    partial = response.partial_success
    return json.dumps(
        {"partialSuccess": {"rejectedSpans": str(partial.rejected_spans), "errorMessage": partial.error_message}}
    ).encode()


_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


def _trace_service_handler(receiver: OTLPReceiver) -> grpc.GenericRpcHandler:
    """``TraceService/Export`` taking the raw request bytes, so that a body that is not an
    ``ExportTraceServiceRequest`` is answered INVALID_ARGUMENT by us rather than INTERNAL by grpc's deserializer."""

    def export(body: bytes, context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        limits = receiver.limits
        try:
            with receiver.decoding() as reserve:
                reserve(len(body))
                try:
                    batch = decode_protobuf(body, max_spans=limits.max_spans_per_request)
                except InputError as error:
                    receiver.count_rejected_request()
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
                except Exception as error:  # a bug in decoding must reach the client as an error, not kill the server
                    _log.exception("decoding an OTLP/gRPC request failed")
                    receiver.count_rejected_request()
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"could not decode the request ({error})")
                return receiver.accept(batch)
        except _Refused as refused:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if refused.busy else grpc.StatusCode.UNAVAILABLE
            context.set_trailing_metadata((("retry-after", str(limits.retry_after_s)),))
            context.abort(code, "the receiver is full; retry" if refused.busy else "the receiver is shutting down")
            raise AssertionError("unreachable: grpc's abort() raises") from None

    return grpc.method_handlers_generic_handler(
        _SERVICE,
        {
            "Export": grpc.unary_unary_rpc_method_handler(
                export,
                request_deserializer=None,  # raw bytes
                response_serializer=trace_service_pb2.ExportTraceServiceResponse.SerializeToString,
            )
        },
    )
