"""The tools the agent had, as its model calls recorded them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reflect_otel.reading.tool_definitions import MAX_TOOLS
from reflect_otel.trace import ToolDefinition

from .model_calls import ModelCall
from .scrub import TextRules

__all__ = ["AgentTools", "agent_tools"]


@dataclass(frozen=True, slots=True)
class AgentTools:
    tools: tuple[ToolDefinition, ...]
    output_tools: frozenset[str]
    """The tools any model call's definitions mark as output tools (their call ends the run with its answer)."""
    secrets: int


def agent_tools(calls: Sequence[ModelCall], rules: TextRules) -> AgentTools:
    """Each tool by name, its first definition kept (at most ``MAX_TOOLS``), its description cleaned."""
    scrubber = rules.scrubber()
    tools: dict[str, ToolDefinition] = {}
    for call in calls:
        for definition in call.tools:
            if definition.name not in tools and len(tools) < MAX_TOOLS:
                cleaned = definition.model_copy(update={"description": scrubber.clean(definition.description)})
                tools[definition.name] = cleaned
    output_tools = frozenset(name for call in calls for name in call.output_tools)
    return AgentTools(tuple(tools.values()), output_tools, scrubber.secrets)
