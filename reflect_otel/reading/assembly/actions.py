"""The walk read as the agent's actions: each model call and each tool run, in the order they happened."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .messages import Conversation
from .model_calls import ModelCall, read_model_call
from .scrub import TextRules
from .tool_runs import ToolRun, read_tool_run
from .tree import LLM, TOOL, SpanTree

__all__ = ["Action", "Actions", "read_actions"]

Action = ModelCall | ToolRun


@dataclass(frozen=True, slots=True)
class Actions:
    actions: tuple[Action, ...]
    dropped_spans: int
    """Spans that lost attributes to the SDK's attribute limit."""
    dropped_attributes: int

    @property
    def model_calls(self) -> tuple[ModelCall, ...]:
        return tuple(a for a in self.actions if isinstance(a, ModelCall))

    @property
    def tool_runs(self) -> tuple[ToolRun, ...]:
        return tuple(a for a in self.actions if isinstance(a, ToolRun))

    @property
    def secrets(self) -> int:
        return sum(a.secrets for a in self.actions)

    @property
    def first_metadata(self) -> Mapping[str, Any]:
        """The first non-empty ``metadata`` of a span that acted."""
        return next((a.context.metadata for a in self.actions if a.context.metadata), {})


def read_actions(
    tree: SpanTree, conversations: Mapping[str, Conversation], second_records: frozenset[str], rules: TextRules
) -> Actions:
    """Every LLM span that made a model call, and every TOOL span, in walk order. LLM spans nested in another and
    ``second_records`` (see :mod:`.duplicates`) are part of another span's call."""
    actions: list[Action] = []
    dropped_spans = dropped_total = 0
    for placed in tree.order:
        span = placed.span
        if span.dropped_attributes:
            dropped_spans += 1
            dropped_total += span.dropped_attributes
        kind = placed.acting_kind
        if kind == LLM and span.span_id not in tree.nested_llm and span.span_id not in second_records:
            call = read_model_call(placed, conversations[span.span_id], tree, rules)
            if call is not None:
                actions.append(call)
        elif kind == TOOL:
            actions.append(read_tool_run(placed, rules))
    return Actions(actions=tuple(actions), dropped_spans=dropped_spans, dropped_attributes=dropped_total)
