"""What every scripted provider double shares: the model's turn (:class:`ScriptedTurn`), the loopback HTTP server
that reads a bounded JSON body, hands it to the double's ``answer(path, body)`` and writes back JSON or server-sent
events, and :class:`ScriptedServer`, the double's lifetime and request log."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

MAX_REQUEST_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ScriptedToolCall:
    name: str
    arguments: dict[str, Any]
    id: str


@dataclass(frozen=True, slots=True)
class ScriptedTurn:
    """One reply of the model: its text, then its tool calls."""

    text: str = ""
    tool_calls: Sequence[ScriptedToolCall] = ()


@dataclass(frozen=True, slots=True)
class JSONReply:
    payload: dict[str, Any]
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EventStream:
    """Server-sent events: ``(event name or None, data)`` pairs, then ``done`` as a last bare data line if set."""

    events: Iterable[tuple[str | None, dict[str, Any]]]
    done: str | None = None


@dataclass(frozen=True, slots=True)
class Received:
    """What reached the server besides the body: the path with its query string, the headers (names in lower
    case) and the client's address."""

    path: str
    headers: dict[str, str]
    client: str = ""
    """The address the request came from."""


Answer = Callable[[str, dict[str, Any]], JSONReply | EventStream | None]
"""``answer(path, body)``: the reply, or None for 404."""


def serve(
    answer: Answer, received: Callable[[Received], None] | None = None, *, host: str = "127.0.0.1"
) -> ThreadingHTTPServer:
    """Start a server on a free port of ``host`` (loopback), serving POSTs with ``answer`` on a daemon thread;
    ``received`` is told each request's path and headers first."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if received is not None:
                received(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, self.client_address[0]))
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_REQUEST_BYTES:
                self.send_error(413)
                return
            reply = answer(self.path.split("?")[0].rstrip("/"), json.loads(self.rfile.read(length) or b"{}"))
            if reply is None:
                self.send_error(404)
            elif isinstance(reply, JSONReply):
                data = json.dumps(reply.payload).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            else:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for event, payload in reply.events:
                    head = f"event: {event}\n" if event else ""
                    self.wfile.write(f"{head}data: {json.dumps(payload)}\n\n".encode())
                if reply.done is not None:
                    self.wfile.write(f"data: {reply.done}\n\n".encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server: ThreadingHTTPServer | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()


@dataclass
class ScriptedServer:
    """A provider double: ``with Double(turn) as server:``, then point the client at ``server.base_url``. Each
    request the provider's API would answer is logged in ``requests`` and answered with ``turn(request_body)`` in the
    API's shape (:meth:`answer`; anything else is a 404)."""

    turn: Callable[[dict[str, Any]], ScriptedTurn]
    model: str = "scripted-model"
    requests: list[dict[str, Any]] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    """Every request's path (query string included) and headers, in order, whether answered or not."""
    host: str = "127.0.0.1"
    """The address it listens on (another than loopback: a host of a test network, see ``testing.netns``)."""
    _server: ThreadingHTTPServer | None = None
    base_path = ""
    """Appended to the server's address in :attr:`base_url` (``/v1`` for OpenAI clients)."""

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start the server first"
        return f"http://{self.host}:{self._server.server_address[1]}{self.base_path}"

    @property
    def port(self) -> int:
        assert self._server is not None, "start the server first"
        return int(self._server.server_address[1])

    def __enter__(self) -> Self:
        self._server = serve(self.answer, self.received.append, host=self.host)
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self._server)

    def answer(self, path: str, body: dict[str, Any]) -> JSONReply | EventStream | None:
        raise NotImplementedError
