"""A scripted Anthropic Messages API server on loopback, beside :mod:`reflect_otel.testing.openai_server`: real
Anthropic clients (the SDK, LiteLLM, frameworks) send real requests to ``/v1/messages`` and get each turn back as
content blocks (``text``, then one ``tool_use`` per call), non-streaming or, when the request asks for ``stream``,
as the API's server-sent events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from reflect_otel.testing._http_double import EventStream, JSONReply, ScriptedServer, ScriptedTurn

__all__ = ["ScriptedAnthropicServer", "anthropic_turns"]


def anthropic_turns(body: dict[str, Any]) -> int:
    """How many times the model has answered in this conversation: the index of its next turn."""
    return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")


@dataclass
class ScriptedAnthropicServer(ScriptedServer):
    """``with ScriptedAnthropicServer(turn) as server:`` then ``anthropic.Anthropic(base_url=server.base_url,
    api_key=...)``. ``requests`` keeps every request body, in order."""

    model: str = "scripted-claude"

    def answer(self, path: str, body: dict[str, Any]) -> JSONReply | EventStream | None:
        if not path.endswith("/v1/messages"):
            return None
        self.requests.append(body)
        message = self.message(self.turn(body))
        return EventStream(self.events(message)) if body.get("stream") else JSONReply(message)

    def message(self, turn: ScriptedTurn) -> dict[str, Any]:
        """The turn as a Messages API ``message``."""
        content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
        content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in turn.tool_calls]
        return {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 50, "output_tokens": 10},
        }

    @staticmethod
    def events(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """``message`` streamed as the API streams it: start, each block (its text or its input as JSON deltas),
        the stop reason, stop."""
        head = dict(message, content=[], stop_reason=None, usage={"input_tokens": 50, "output_tokens": 0})
        yield "message_start", {"type": "message_start", "message": head}
        for index, block in enumerate(message["content"]):
            start: dict[str, Any]
            if block["type"] == "text":
                start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
            else:
                start = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 10},
            },
        )
        yield "message_stop", {"type": "message_stop"}
