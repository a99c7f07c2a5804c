"""Stopping a replay before it repeats a side effect."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from reflect_otel.errors import ReplayError

__all__ = ["IrreversibleToolError", "ToolGuard"]


class IrreversibleToolError(ReplayError):
    """The continuation would call a tool marked irreversible; the replay was stopped before it ran."""


class ToolGuard:
    """Called before each tool of a continuation; raises :class:`IrreversibleToolError` for irreversible tools
    unless ``allow`` is set."""

    def __init__(self, irreversible: Collection[str], *, allow: bool) -> None:
        self.irreversible = frozenset(irreversible)
        self.allow = allow

    def __call__(self, tool_name: str, arguments: Any = None) -> None:
        if tool_name in self.irreversible and not self.allow:
            raise IrreversibleToolError(
                f"the replay stopped before calling {tool_name!r}, which is marked irreversible; pass "
                "allow_irreversible=True to the adapter if repeating it is safe"
            )
