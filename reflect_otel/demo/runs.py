"""A demo agent's run on a bundled question, as attribution is given it: the answer, the trace and the replay adapter
that can replay it in this process (the wiring, which names the replay adapters, is the app's:
``reflect_otel.cli._demo_runs``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reflect_otel.demo.wtq import WTQQuestion
from reflect_otel.replay import ReplayAdapter
from reflect_otel.trace import StructuredTrace

__all__ = ["AgentRun", "RebuildRun", "RunAgent"]


@dataclass(frozen=True, slots=True)
class AgentRun:
    """One run of the agent on one question: its answer ("" when it gave none), its trace, and the adapter that
    can replay it (valid while the process lives)."""

    answer: str
    trace: StructuredTrace
    replay: ReplayAdapter
    context: str = ""
    """What the agent was given besides its question (its table), shown to every method's auditor."""


RunAgent = Callable[[WTQQuestion], AgentRun]
"""Runs the agent on a question (the app supplies it: it wires the framework's replay adapter). May raise when the
model endpoint fails."""

RebuildRun = Callable[[WTQQuestion, StructuredTrace], AgentRun]
"""An earlier run of the agent on a question, from its stored trace, with an adapter that replays it in this
process: how a method added to a results folder is given the failures the others were given."""
