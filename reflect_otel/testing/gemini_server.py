"""A scripted Gemini API server on loopback (``generateContent`` and ``streamGenerateContent?alt=sse``), beside
:mod:`reflect_otel.testing.openai_server`: real Gemini clients (google-genai, Google ADK) get each turn back as a
candidate whose parts are the text, then one ``functionCall`` per tool call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reflect_otel.testing._http_double import EventStream, JSONReply, ScriptedServer, ScriptedTurn

__all__ = ["ScriptedGeminiServer", "gemini_turns"]


def gemini_turns(body: dict[str, Any]) -> int:
    """How many times the model has answered in this conversation: the index of its next turn."""
    return sum(1 for c in body.get("contents") or [] if c.get("role") == "model")


@dataclass
class ScriptedGeminiServer(ScriptedServer):
    """``with ScriptedGeminiServer(turn) as server:`` then point the client's ``base_url`` at ``server.base_url``.
    ``requests`` keeps every request body, in order."""

    model: str = "scripted-gemini"

    def answer(self, path: str, body: dict[str, Any]) -> JSONReply | EventStream | None:
        streamed = path.endswith(":streamGenerateContent")
        if not (streamed or path.endswith(":generateContent")):
            return None
        self.requests.append(body)
        response = self.response(self.turn(body))
        return EventStream([(None, response)]) if streamed else JSONReply(response)

    def response(self, turn: ScriptedTurn) -> dict[str, Any]:
        """The turn as a ``GenerateContentResponse``."""
        parts: list[dict[str, Any]] = [{"text": turn.text}] if turn.text else []
        parts += [{"functionCall": {"id": c.id, "name": c.name, "args": c.arguments}} for c in turn.tool_calls]
        return {
            "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 10, "totalTokenCount": 60},
            "modelVersion": self.model,
        }
