"""The run every framework test scripts: multiply(17, 23) -> add(391, 5) -> "The answer is 396."."""

from __future__ import annotations

from typing import Any

from reflect_otel.testing.openai_server import ScriptedToolCall, ScriptedTurn

QUESTION = "What is 17 times 23, plus 5?"
ANSWER = "The answer is 396."
MULTIPLY = ScriptedTurn("I multiply first.", [ScriptedToolCall("multiply", {"a": 17, "b": 23}, "call_1")])
ADD = ScriptedTurn("Now add 5.", [ScriptedToolCall("add", {"a": 391, "b": 5}, "call_2")])
SCRIPT = [MULTIPLY, ADD, ScriptedTurn(ANSWER)]
"""The model's turns when the answer is plain text (the framework ends on a reply without tool calls)."""


def assistant_turns(body: dict[str, Any]) -> int:
    """How many times the model has answered in this conversation: the index of its next turn."""
    return sum(1 for m in body["messages"] if m.get("role") == "assistant")
