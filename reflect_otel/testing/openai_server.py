"""A scripted OpenAI-compatible server on loopback, for running real agent frameworks with their real HTTP clients
and instrumentation in tests. Each request is answered by ``turn(request_body)``, which returns the assistant's
text and tool calls; the server wraps them as the chat-completions API does (non-streaming, and streaming as
server-sent events when the request asks for ``stream``) or, at ``/responses``, as the Responses API does
(non-streaming)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from reflect_otel.testing._http_double import EventStream, JSONReply, ScriptedServer, ScriptedToolCall, ScriptedTurn

__all__ = ["ScriptedOpenAIServer", "ScriptedToolCall", "ScriptedTurn"]


@dataclass
class ScriptedOpenAIServer(ScriptedServer):
    """The OpenAI double; ``base_url`` ends in ``/v1``."""

    base_path = "/v1"

    def answer(self, path: str, body: dict[str, Any]) -> JSONReply | EventStream | None:
        responses = path.endswith("/responses")
        if not (responses or path.endswith("/chat/completions")):
            return None
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
