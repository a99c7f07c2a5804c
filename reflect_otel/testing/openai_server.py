"""A scripted OpenAI-compatible server on loopback, for running real agent frameworks with their real HTTP clients
and instrumentation in tests. Each request is answered by ``turn(request_body)``, which returns the assistant's
text and tool calls; the server wraps them as the chat-completions API does (non-streaming, and streaming as
server-sent events when the request asks for ``stream``) or, at ``/responses``, as the Responses API does
(non-streaming)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from reflect_otel.testing._http_double import EventStream, JSONReply, ScriptedServer, ScriptedToolCall, ScriptedTurn

__all__ = ["EndpointFaults", "ScriptedOpenAIServer", "ScriptedToolCall", "ScriptedTurn"]

USAGE_TOKENS = 60
"""Tokens each answered completion reports (50 prompt, 10 completion)."""


@dataclass
class EndpointFaults:
    """What an endpoint under load does, switched on and off while it serves: :meth:`throttle` refuses every
    request (429 or 503, with ``Retry-After``) for a while, :meth:`stall` holds each request a while before
    answering, and ``max_concurrent`` refuses (429) a request beyond that many in flight, as a server with a fixed
    number of slots does. Counts what it refused and the most requests it held at once."""

    max_concurrent: int | None = None
    refused: int = 0
    answered: int = 0
    peak: int = 0
    over_limit: int = 0
    """Requests refused for ``max_concurrent``."""
    _status: int = 0
    _refuse_until: float = 0.0
    _retry_after_s: float = 1.0
    _stall_s: float = 0.0
    _stall_until: float = 0.0
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def throttle(self, seconds: float, *, status: int = 429, retry_after_s: float = 1.0) -> None:
        """Refuse every request with ``status`` and ``Retry-After: retry_after_s`` for the next ``seconds``."""
        with self._lock:
            self._status, self._retry_after_s = status, retry_after_s
            self._refuse_until = time.monotonic() + seconds

    def stall(self, seconds: float, *, hold_s: float) -> None:
        """For the next ``seconds``, hold each request ``hold_s`` before answering (a client with a shorter timeout
        gives up on it)."""
        with self._lock:
            self._stall_s, self._stall_until = hold_s, time.monotonic() + seconds

    def enter(self) -> JSONReply | None:
        """A request arrives: the refusal to send, or None (then :meth:`leave` once answered)."""
        with self._lock:
            now = time.monotonic()
            if now < self._refuse_until:
                self.refused += 1
                after = f"{self._retry_after_s:g}"
                error = {"error": {"message": "the endpoint is busy", "type": "rate_limit_error"}}
                return JSONReply(error, status=self._status, headers={"Retry-After": after})
            if self.max_concurrent is not None and self._in_flight >= self.max_concurrent:
                self.refused += 1
                self.over_limit += 1
                error = {"error": {"message": "too many requests at once", "type": "rate_limit_error"}}
                return JSONReply(error, status=429, headers={"Retry-After": "0.2"})
            self._in_flight += 1
            self.peak = max(self.peak, self._in_flight)
            hold = self._stall_s if now < self._stall_until else 0.0
        if hold:
            time.sleep(hold)
        return None

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self.answered += 1


@dataclass
class ScriptedOpenAIServer(ScriptedServer):
    """The OpenAI double; ``base_url`` ends in ``/v1``. With ``faults``, requests meet them first (a refused
    request is not in ``requests``)."""

    base_path = "/v1"
    faults: EndpointFaults | None = None

    def answer(self, path: str, body: dict[str, Any]) -> JSONReply | EventStream | None:
        responses = path.endswith("/responses")
        if not (responses or path.endswith("/chat/completions")):
            return None
        if self.faults is None:
            return self._answer(responses, body)
        refusal = self.faults.enter()
        if refusal is not None:
            return refusal
        try:
            return self._answer(responses, body)
        finally:
            self.faults.leave()

    def _answer(self, responses: bool, body: dict[str, Any]) -> JSONReply | EventStream:
        self.requests.append(body)
        turn = self.turn(body)
        if responses:
            return JSONReply(self.response(turn))
        if body.get("stream"):
            return EventStream([(None, chunk) for chunk in self.chunks(turn)], done="[DONE]")
        return JSONReply(self.completion(turn))

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
