"""A scripted OpenAI-compatible server on loopback, for running real agent frameworks with their real HTTP clients
and instrumentation in tests. Each request is answered by ``turn(request_body)``, which returns the assistant's
text and tool calls; the server wraps them as the chat-completions API does (non-streaming, and streaming as
server-sent events when the request asks for ``stream``) or, at ``/responses``, as the Responses API does
(non-streaming)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ScriptedOpenAIServer", "ScriptedToolCall", "ScriptedTurn"]

MAX_REQUEST_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ScriptedToolCall:
    name: str
    arguments: dict[str, Any]
    id: str


@dataclass(frozen=True, slots=True)
class ScriptedTurn:
    text: str = ""
    tool_calls: Sequence[ScriptedToolCall] = ()


@dataclass
class ScriptedOpenAIServer:
    """``with ScriptedOpenAIServer(turn) as server:`` then point the client at ``server.base_url`` (``.../v1``).
    ``requests`` keeps every request body, in order."""

    turn: Callable[[dict[str, Any]], ScriptedTurn]
    model: str = "scripted-model"
    requests: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedOpenAIServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                path = self.path.rstrip("/")
                responses = path.endswith("/responses")
                if not (responses or path.endswith("/chat/completions")) or length > MAX_REQUEST_BYTES:
                    self.send_error(404 if length <= MAX_REQUEST_BYTES else 413)
                    return
                body = json.loads(self.rfile.read(length))
                owner.requests.append(body)
                turn = owner.turn(body)
                if responses:
                    self._reply(200, owner.response(turn))
                elif body.get("stream"):
                    self._stream(turn)
                else:
                    self._reply(200, owner.completion(turn))

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, turn: ScriptedTurn) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in owner.chunks(turn):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _message(self, turn: ScriptedTurn) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
        if turn.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for c in turn.tool_calls
            ]
        return message

    def completion(self, turn: ScriptedTurn) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": self._message(turn),
                    "finish_reason": "tool_calls" if turn.tool_calls else "stop",
                }
            ],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
        }

    def chunks(self, turn: ScriptedTurn) -> list[dict[str, Any]]:
        message = self._message(turn)
        delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
        if turn.tool_calls:
            delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(message["tool_calls"])]
        base = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion.chunk", "model": self.model}
        return [
            base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            base
            | {
                "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if turn.tool_calls else "stop"}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
            },
        ]

    def response(self, turn: ScriptedTurn) -> dict[str, Any]:
        """The turn as a Responses API ``response`` object: a message item for the text, a ``function_call`` item
        per tool call."""
        number = len(self.requests)
        output: list[dict[str, Any]] = []
        if turn.text:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{number}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
                }
            )
        output += [
            {
                "type": "function_call",
                "id": f"fc_{number}_{i}",
                "call_id": call.id,
                "name": call.name,
                "arguments": json.dumps(call.arguments),
                "status": "completed",
            }
            for i, call in enumerate(turn.tool_calls)
        ]
        return {
            "id": f"resp_{number}",
            "object": "response",
            "created_at": int(time.time()),
            "model": self.model,
            "status": "completed",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 50,
                "output_tokens": 10,
                "total_tokens": 60,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
