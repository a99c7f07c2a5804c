"""The values of a controlled test (:mod:`reflect_otel.attribution.controlled_replay`): what to test (:class:`Trial`) and what
testing it established (:class:`TrialResult`, :class:`Decision`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from reflect_otel.record import (
    Correction,
    Effect,
    GateVerdict,
    InterventionKind,
    Obstacle,
    RepairPlan,
    ReplayArm,
    ReplayAttempt,
)
from reflect_otel.replay import ReplayResult
from reflect_otel.trace import Step

__all__ = ["Decision", "GateFn", "Trial", "TrialResult"]

GateFn = Callable[[RepairPlan, Step, Step], GateVerdict]
"""Judges whether ``proposed`` (a new step p) follows ``plan``, ``replaced`` being the original step p."""


class Decision(str, Enum):
    """What one trial established."""

    VERIFIED = "verified"
    NOT_ATTRIBUTABLE = "not_attributable"
    """An intervention flipped the outcome, but its control explains the flip (see the decision rule)."""
    NO_FLIP = "no_flip"
    NOT_TESTED = "not_tested"
    """Nothing ran: the budget could not pay for both arms, every candidate was refused, or the replay failed."""


@dataclass(frozen=True, slots=True)
class Trial:
    """One intervention to test at step ``correction.step_index``: an action (``correction.replacement``
    executed), or guidance (the agent decides the step with ``injection`` in context; ``plan`` is what its new step
    must follow, None for bare resampling, where any different step is the intervention)."""

    correction: Correction
    injection: str = ""
    plan: RepairPlan | None = None
    round: int = 1
    localized_step: int | None = None
    authored: tuple[str, ...] | None = None
    """The texts of ``injection`` the method wrote (a plan, a hypothesis, a memory), which the leak guard reads; the
    rest is the run's own record (the failed step and what it got back), data the agent saw. None: all of it."""
    arm: ReplayArm = ReplayArm.INTERVENTION
    """The arm its replays are recorded under: the intervention, or the localization test's."""

    @property
    def step(self) -> int:
        return self.correction.step_index

    @property
    def rollback_point(self) -> int:
        return self.correction.step_index - 1

    @property
    def is_action(self) -> bool:
        return self.correction.kind is InterventionKind.ACTION


@dataclass(frozen=True, slots=True)
class TrialResult:
    """What testing one trial produced, as a value: its decision and why, the intervention replays and the
    corrections behind them (a guidance trial's proposals each become an action), and the effect that decided."""

    trial: Trial
    decision: Decision
    reason: str
    attempts: tuple[ReplayAttempt, ...] = ()
    corrections: tuple[Correction, ...] = ()
    effect: Effect | None = None
    deciding: ReplayAttempt | None = None
    """The intervention replay behind a verified or not-attributable decision."""
    result: ReplayResult | None = None
    """That replay's result (its continuation explains the correction)."""
    obstacle: Obstacle | None = None
    """A not-attributable decision: why the flip was not credited to the step."""
