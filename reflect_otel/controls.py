"""The paper's faithfulness controls (RQ3), as methods measured beside REFLECT on the same failures.

Each is REFLECT's guidance policy (localize, diagnose, inject the plan, let the agent redo the step, replay under
control; no concrete actions) with one thing changed, so that what it verifies is what the changed thing did not
need:

* ``control-placebo``: the plan injected is one the same auditor wrote for *another* failure (another question),
  in the same message at the same rollback points: a correction of the right form and length, whose content does
  not fit. What a correct hint gains over it is what its content does.
* ``control-wrong-step``: this run's own plan, injected at a step at distance 2 from the localized one (after it
  where the run has such a step before its answer, else before it); a run with no such step is not replayed. What
  the localized step gains over it is what the localization does.

Both go through the same search, budget and control rule as REFLECT (:mod:`reflect_otel.search`).
"""

from __future__ import annotations

import hashlib

from reflect_otel.config import ReflectConfig
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.pipeline import ReflectPipeline, ReflectPolicy
from reflect_otel.record import RepairPlan
from reflect_otel.search import SearchContext
from reflect_otel.trace import StructuredTrace
from reflect_otel.verifiers import Verifier

__all__ = ["PLACEBO_PLANS", "PlaceboControl", "WrongStepControl", "placebo_plan", "wrong_step"]

WRONG_STEP_DISTANCE = 2

PLACEBO_PLANS: tuple[tuple[str, RepairPlan], ...] = (
    (
        "how many academy awards have been won posthumously?",
        RepairPlan(
            root_cause="The agent used the count_rows function without specifying the column to count.",
            correction_instruction="Add 'Winner' as a column name in the arguments of the count_rows function.",
        ),
    ),
    (
        "which candidate finished on top in eddy county?",
        RepairPlan(
            root_cause="The agent used the 'lookup' tool with the column name 'Votes'; the column that holds the "
            "total number of votes cast in that county is 'Total'.",
            correction_instruction="Use the 'Total' column instead of the 'Votes' column when looking up the votes "
            "for Eddy County.",
        ),
    ),
    (
        "how many friendly matches were in the table?",
        RepairPlan(
            root_cause="The filter on the 'Result' column for 'Friendly match' returned no rows.",
            correction_instruction="Check whether the table has any rows before applying the filter operation.",
        ),
    ),
    (
        "how many events were at the 1980 winter olympics?",
        RepairPlan(
            root_cause="The agent looked up the number of events without identifying the 1980 row of the table.",
            correction_instruction="Use the 'lookup' tool to find the number of events at the 1980 Winter Olympics, "
            "specifying the correct year in the query.",
        ),
    ),
    (
        "what is the name of the last ship that was scrapped?",
        RepairPlan(
            root_cause="The agent identified Wave Laird as the last scrapped ship, which the table does not support.",
            correction_instruction="Look for the last row with 'Fate' as 'Scrapped'.",
        ),
    ),
    (
        "which year had the most titles released?",
        RepairPlan(
            root_cause="The agent picked a year without counting the titles of each release year.",
            correction_instruction="Count the number of rows for each release year in the table, then select the "
            "year with the most titles released.",
        ),
    ),
    (
        "what was the first playstation 3 release date?",
        RepairPlan(
            root_cause="The agent answered that no PlayStation 3 release date was found without reading the "
            "'PlayStation 3 release date' column.",
            correction_instruction="Use the filter_rows tool to find rows where the 'Multiplayer Map(s)' column is "
            "empty, then read the first non-empty value in the 'PlayStation 3 release date' column.",
        ),
    ),
)
"""Plans Qwen2.5-Coder-1.5B wrote as REFLECT's auditor for seven failed WikiTableQuestions runs of the demo agent
(benchmarks/results/wtq-live-actions-seed24, condensed to one sentence each): corrections of the right form, each
for one question."""


def placebo_plan(trace: StructuredTrace) -> RepairPlan:
    """A plan written for another question than ``trace``'s, picked by a hash of its trace id (the same trace gets
    the same placebo in every run)."""
    others = [plan for question, plan in PLACEBO_PLANS if question.strip().casefold() != trace.question.casefold()]
    pick = int(hashlib.sha256(trace.trace_id.encode()).hexdigest(), 16) % len(others)
    return others[pick]


def wrong_step(trace: StructuredTrace, localized: int) -> int | None:
    """The step at distance :data:`WRONG_STEP_DISTANCE` from ``localized``: after it when that step comes before
    the run's answer, else before it; None when the run has neither."""
    last = max((s.index for s in trace.steps if not s.is_final_answer), default=0)
    for candidate in (localized + WRONG_STEP_DISTANCE, localized - WRONG_STEP_DISTANCE):
        if 1 <= candidate <= last:
            return candidate
    return None


def _swap_for_placebo(ctx: SearchContext, own: RepairPlan) -> RepairPlan:
    """The auditor's call is made and paid for, as REFLECT's is; its plan is replaced by a placebo."""
    return placebo_plan(ctx.trace).model_copy(update={"confidence": own.confidence})


def _wrong_step_points(trace: StructuredTrace, localized: int, count: int) -> list[int]:
    target = wrong_step(trace, localized)
    return [target] if target is not None else []


def _guidance_only(config: ReflectConfig) -> ReflectConfig:
    return config.model_copy(update={"actions": False})


class PlaceboControl(ReflectPipeline):
    """REFLECT's guidance with a plan written for another failure (see the module)."""

    method = "control-placebo"

    def __init__(self, llm: StructuredLLM, *, verifier: Verifier, config: ReflectConfig | None = None) -> None:
        guidance = _guidance_only(config or ReflectConfig())
        policy = ReflectPolicy(
            llm_source="control:placebo",
            actions=False,
            use_diagnostician=guidance.use_diagnostician,
            swap_plan=_swap_for_placebo,
        )
        super().__init__(llm, verifier=verifier, config=guidance, policy=policy)


class WrongStepControl(ReflectPipeline):
    """REFLECT's guidance, this run's own plan, at a step at distance 2 from the localized one (see the module)."""

    method = "control-wrong-step"

    def __init__(self, llm: StructuredLLM, *, verifier: Verifier, config: ReflectConfig | None = None) -> None:
        guidance = _guidance_only(config or ReflectConfig())
        policy = ReflectPolicy(
            llm_source="control:wrong-step",
            actions=False,
            use_diagnostician=guidance.use_diagnostician,
            points=_wrong_step_points,
            no_points=f"the run has no step at distance {WRONG_STEP_DISTANCE} from the localized one before its answer",
        )
        super().__init__(llm, verifier=verifier, config=guidance, policy=policy)
