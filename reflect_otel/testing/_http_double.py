"""The loopback HTTP server under every scripted provider double: reads a bounded JSON body, hands it to the
double's ``answer(path, body)``, and writes back JSON or server-sent events."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_REQUEST_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class JSONReply:
    payload: dict[str, Any]
    status: int = 200


@dataclass(frozen=True, slots=True)
class EventStream:
    """Server-sent events: ``(event name or None, data)`` pairs, then ``done`` as a last bare data line if set."""

    events: Iterable[tuple[str | None, dict[str, Any]]]
    done: str | None = None


Answer = Callable[[str, dict[str, Any]], JSONReply | EventStream | None]
"""``answer(path, body)``: the reply, or None for 404."""


def serve(answer: Answer) -> ThreadingHTTPServer:
    """Start a server on a free loopback port, serving POSTs with ``answer`` on a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
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

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server: ThreadingHTTPServer | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()
