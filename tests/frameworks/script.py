"""The run every framework test scripts: multiply(17, 23) -> add(391, 5) -> "The answer is 396."."""

from __future__ import annotations

from typing import Any

from reflect_otel.testing.openai_server import ScriptedToolCall, ScriptedTurn
from reflect_otel.trace import StepKind, StructuredTrace

QUESTION = "What is 17 times 23, plus 5?"
ANSWER = "The answer is 396."
MULTIPLY = ScriptedTurn("I multiply first.", [ScriptedToolCall("multiply", {"a": 17, "b": 23}, "call_1")])
ADD = ScriptedTurn("Now add 5.", [ScriptedToolCall("add", {"a": 391, "b": 5}, "call_2")])
SCRIPT = [MULTIPLY, ADD, ScriptedTurn(ANSWER)]
"""The model's turns when the answer is plain text (the framework ends on a reply without tool calls)."""


def assistant_turns(body: dict[str, Any]) -> int:
    """How many times the model has answered in this conversation: the index of its next turn."""
    return sum(1 for m in body["messages"] if m.get("role") == "assistant")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
    for name in ("multiply", "add")
]
"""The two tools in the OpenAI format, for loops written by hand."""
IMPLEMENTATIONS = {"multiply": lambda a, b: a * b, "add": lambda a, b: a + b}

STEPS = [
    (StepKind.TOOL_CALL, "multiply", {"a": 17, "b": 23}, "391", "call_1", "I multiply first."),
    (StepKind.TOOL_CALL, "add", {"a": 391, "b": 5}, "396", "call_2", "Now add 5."),
    (StepKind.FINAL_ANSWER, None, {}, None, None, ANSWER),
]
"""The scripted run as every set-up that records it all rebuilds it (see :func:`steps_of`)."""


def steps_of(trace: StructuredTrace) -> list[tuple[Any, ...]]:
    """(kind, tool, arguments, result, call id, reasoning) of each step."""
    return [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.tool_call_id, s.reasoning) for s in trace.steps]
