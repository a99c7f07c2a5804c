"""The paper's faithfulness controls (RQ3), as methods measured beside REFLECT on the same failures.

Each is REFLECT's policy (localize, diagnose, execute corrected calls as actions, inject the plan as guidance,
replay under control) with one thing changed, for its actions as for its guidance, so that what it verifies is what
the changed thing did not need. REFLECT's verifications are mostly actions; a control that could only inject
guidance (which the hard gate refuses when the regenerated step ignores it) would test nothing against them.

* ``control-placebo``: the plan is one the same auditor wrote for *another* failure, drawn at run time from a
  :class:`PlanPool` (the plans of the other failures the same service, or evaluation, attributed: REFLECT's, the
  wrong-step control's, which is the run's own plan, and the placebo's own auditor's, which it pays for as REFLECT
  does and keeps for the failures after it; and, for a placebo service on a store, the plans of the latest records
  stored before it started, see :data:`STORED_RECORDS`; its own auditor's plans are not stored). Its corrected call, if it has one, is executed at the localized step,
  and its text injected at the same rollback points; the evidence rules' calls (this run's content) and the agent's
  own resampled decisions (REFLECT's, not the plan's) are not tried.
  A correction of the right form, whose content does not fit: what a correct one gains over it is what its content
  does. With no plan for another failure yet (the first failure a placebo-only run sees), the record is ``skipped``
  and nothing is replayed.
* ``control-wrong-step``: this run's own plan and corrected calls (the auditor's and the evidence rules'), executed
  and injected at another step, and the agent's own decisions resampled there: the nearest one at distance 2 from
  the localized one, else at distance 1 (after it where the run has such a step before its answer, else before it),
  never a step an earlier round of the same attribution localized (that step is a localizer's answer, not a wrong
  one: testing it would test the right step). A corrected call is never moved to an earlier step: a later step's
  call repaired at an earlier one flips a run wherever it is executed
  (:data:`~reflect_otel.attribution.pipeline.MOVED_EARLIER`).
  A round with no such step left tests nothing and says so in the record (its corrections refused with
  :data:`NO_WRONG_STEP`); a run with no other step is not replayed. Its guidance is not tried where REFLECT's is
  (the K steps ending at the localized one). What the localized step gains over it is what the localization does.

Both go through the same search, budget and control rule as REFLECT (:mod:`reflect_otel.attribution.search`).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import Unpack

from reflect_otel.attribution._run import AttributeOptions
from reflect_otel.attribution.pipeline import ReflectPipeline, ReflectPolicy, guidance_window
from reflect_otel.attribution.search import SearchContext
from reflect_otel.config import ReflectConfig
from reflect_otel.flagging.verifiers import Verifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.record import (
    AGENT_REPLAY_STAGE,
    AttributionRecord,
    AttributionStatus,
    InterventionKind,
    RepairPlan,
)
from reflect_otel.trace import StructuredTrace

__all__ = [
    "MAX_PLANS",
    "NO_PLACEBO",
    "NO_WRONG_STEP",
    "PlaceboControl",
    "PlanPool",
    "WrongStepControl",
    "auditor_model",
    "plan_of",
    "wrong_step",
]

WRONG_STEP_DISTANCES = (2, 1)
"""The wrong step's distances from the localized one, in order of preference."""
MAX_PLANS = 1000
"""Plans a :class:`PlanPool` keeps by default (the most recent ones; one per failure and auditor model)."""
PLACEBO_METHOD = "control-placebo"
RESAMPLE = "resample"
"""The source of the agent's own resampled decisions (no plan: never a plan's instruction)."""
AUDITOR_SOURCES = frozenset({"llm", "control:wrong-step"})
"""The sources of the corrected calls an auditor wrote (REFLECT's, the wrong-step control's): a plan's call."""
NO_WRONG_STEP = (
    "no wrong step left: the run has no step before its answer at distance 2 or 1 from the localized one that no "
    "earlier round localized"
)
NO_PLACEBO = (
    "no plan written for another failure yet: the placebo injects the auditor's plan for another failure (the plans "
    "written for earlier failures of the same run, or stored before it), so it has nothing to inject; not replayed"
)
STORED_RECORDS = 200
"""How many of a store's latest records a placebo service reads at its start for their plans (each record is read
whole, tens of kilobytes with its replays: a bound on the start's time and memory, not on the pool)."""


def plan_of(record: AttributionRecord) -> RepairPlan | None:
    """The repair plan the auditor wrote for ``record``'s failure, when the record holds it: the verified
    intervention's plan, else the record's root cause with the instruction its guidance carried. None for a
    placebo's record (its plan was written for another failure), for methods that write no plan, and for a record
    whose guidance was tested only as proposals (an unverified REFLECT record under controlled verification): the
    placebo keeps its own auditor's plans for those (:class:`PlaceboControl`). The plan carries the auditor's
    corrected call when the record tried one."""
    if record.method == PLACEBO_METHOD:
        return None
    if record.intervention is not None and record.intervention.plan.correction_instruction:
        return record.intervention.plan
    instruction = next(  # a refused one (a part of the plan withheld, or guidance refused) was never given
        (
            c.finding
            for c in record.corrections
            if c.kind is InterventionKind.GUIDANCE and c.source != RESAMPLE and c.refused is None and c.finding.strip()
        ),
        "",
    )
    corrected = next(
        (
            c.replacement
            for c in record.corrections
            if c.kind is InterventionKind.ACTION and c.source in AUDITOR_SOURCES and c.replacement is not None
        ),
        None,
    )
    if not record.root_cause.strip() or not (instruction or corrected):
        return None
    return RepairPlan(root_cause=record.root_cause, correction_instruction=instruction, corrected_step=corrected)


def auditor_model(record: AttributionRecord) -> str:
    """The model of ``record``'s first auditor call (not the agent's replays), "" when it recorded none."""
    return next((call.model for call in record.llm_calls if call.stage != AGENT_REPLAY_STAGE), "")


class PlanPool:
    """The plans auditors wrote, by failure (trace id and question) and auditor model, for the placebo to draw
    from: the same service, or evaluation, feeds it every record it makes (:meth:`add`). It keeps the last
    ``max_plans`` plans (:data:`MAX_PLANS` by default; the oldest is dropped first), so a long-running service holds
    a bounded pool. Thread-safe."""

    def __init__(self, *, max_plans: int = MAX_PLANS) -> None:
        if max_plans < 1:
            raise ValueError("max_plans must be at least 1")
        self.max_plans = max_plans
        # (trace id, auditor model) -> (question, plan): a store written by two models keeps each one's plan
        self._plans: OrderedDict[tuple[str, str], tuple[str, RepairPlan]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, trace: StructuredTrace, record: AttributionRecord) -> None:
        """Keep the plan ``record`` holds for ``trace`` (the first one written for it), if it holds one."""
        self.add_plan(trace.trace_id, trace.question, record)

    def add_plan(self, trace_id: str, question: str, record: AttributionRecord) -> None:
        """:meth:`add`, from a stored failure's trace id and question; the plan is kept as written by the model of
        the record's auditor calls (none recorded: any auditor's)."""
        plan = plan_of(record)
        if plan is not None:
            self.keep(trace_id, question, plan, model=auditor_model(record))

    def add_stored(self, records: Iterable[tuple[str, AttributionRecord]]) -> None:
        """Keep the plans of stored records given newest first (:meth:`ReadsRecords.recent_records
        <reflect_otel.store.ReadsRecords.recent_records>`), added oldest first so the newest are kept longest."""
        for question, record in reversed(list(records)):
            self.add_plan(record.trace_id, question, record)

    def keep(self, trace_id: str, question: str, plan: RepairPlan, *, model: str = "") -> None:
        """Keep ``plan`` as the one written for the failure ``trace_id`` by the auditor ``model`` ("" when not
        known; the first kept for a failure and model stays); past ``max_plans`` plans, the oldest is dropped."""
        if not plan.correction_instruction.strip() and plan.corrected_step is None:
            return
        with self._lock:
            if (trace_id, model) in self._plans:
                return
            self._plans[(trace_id, model)] = (question.strip().casefold(), plan)
            while len(self._plans) > self.max_plans:
                self._plans.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._plans)

    def other_than(self, trace: StructuredTrace, *, model: str = "") -> RepairPlan | None:
        """A plan written for another failure than ``trace`` (another trace and another question) by the auditor
        ``model`` (a plan of another model is not the same auditor's; "" takes any), or None when there is none yet. The pick depends only on ``trace``'s id and the failures in the pool, not on the order
        they came in (the one whose trace id hashes lowest with ``trace``'s, one pass, no sort): the same trace gets
        the same placebo from the same pool, and a plan added later changes the draw only when it is the new pick."""
        question = trace.question.strip().casefold()
        with self._lock:
            plans = list(self._plans.items())
        best: tuple[tuple[bytes, bool, str], RepairPlan] | None = None
        for (trace_id, written_by), (asked, plan) in plans:
            if trace_id == trace.trace_id or asked == question or (model and written_by and written_by != model):
                continue
            # two plans of one failure tie on the hash: the one known to be this model's wins, then the name
            digest = hashlib.sha256(f"{trace.trace_id}:{trace_id}".encode()).digest()
            rank = (digest, written_by != model, written_by)
            if best is None or rank < best[0]:
                best = (rank, plan)
        return best[1] if best is not None else None


def wrong_step(trace: StructuredTrace, localized: int, excluded: Collection[int] = ()) -> int | None:
    """The step at the first of :data:`WRONG_STEP_DISTANCES` from ``localized`` the run has before its answer and
    that is not in ``excluded`` (the steps earlier rounds localized): after the localized step where it can be, else
    before it; None when no such step is left."""
    last = max((s.index for s in trace.steps if not s.is_final_answer), default=0)
    for distance in WRONG_STEP_DISTANCES:
        for candidate in (localized + distance, localized - distance):
            if 1 <= candidate <= last and candidate not in excluded:
                return candidate
    return None


class _PlaceboDraw:
    """The placebo's two changes to REFLECT's policy: each failure's own plan goes into the pool and is swapped for
    another failure's; with none to draw, there is no point to try guidance at. What was drawn for a trace is kept
    until :meth:`take` (the attribution reads it when it ends)."""

    def __init__(self, pool: PlanPool) -> None:
        self.pool = pool
        self._drawn: dict[str, RepairPlan | None] = {}
        self._lock = threading.Lock()

    def swap(self, ctx: SearchContext, own: RepairPlan) -> RepairPlan:
        """The auditor's call is made and paid for, as REFLECT's is; its plan is kept for later failures and
        replaced by a placebo."""
        model = ctx.run.llm.model_name
        self.pool.keep(ctx.trace.trace_id, ctx.trace.question, own, model=model)
        placebo = self.pool.other_than(ctx.trace, model=model)
        with self._lock:
            self._drawn[ctx.trace.trace_id] = placebo
        return (placebo or RepairPlan()).model_copy(update={"confidence": own.confidence})

    def points(self, trace: StructuredTrace, localized: int, count: int, earlier: frozenset[int]) -> list[int]:
        with self._lock:
            drawn = self._drawn.get(trace.trace_id)
        has_text = drawn is not None and bool(drawn.correction_instruction.strip())
        return guidance_window(trace, localized, count) if has_text else []  # a call alone is tried as an action

    def no_points(self, trace: StructuredTrace, localized: int, count: int, earlier: frozenset[int]) -> str:
        with self._lock:
            drawn = self._drawn.get(trace.trace_id)
        if drawn is None:
            return NO_PLACEBO
        if drawn.corrected_step is None:
            return "the plan drawn for the placebo has no instruction to inject and no corrected call"
        return (
            "the plan drawn for the placebo has no instruction to inject, only a corrected call (tried as an action "
            "unless refused: see the corrections)"
        )

    def take(self, trace: StructuredTrace) -> tuple[bool, RepairPlan | None]:
        """Whether a plan was drawn for ``trace`` in its attribution, and which (None: the pool had none)."""
        with self._lock:
            if trace.trace_id not in self._drawn:
                return False, None
            return True, self._drawn.pop(trace.trace_id)


def _wrong_step_points(trace: StructuredTrace, localized: int, count: int, earlier: frozenset[int]) -> list[int]:
    """The wrong step, for guidance, unless REFLECT's own guidance is tried there (its window of K steps ending at
    the localized one): the same plan at the same point would be REFLECT's trial, not a control's."""
    target = wrong_step(trace, localized, earlier)
    return [target] if target is not None and target not in guidance_window(trace, localized, count) else []


def _no_wrong_step_points(trace: StructuredTrace, localized: int, count: int, earlier: frozenset[int]) -> str:
    target = wrong_step(trace, localized, earlier)
    if target is None:
        return NO_WRONG_STEP
    return (
        f"the wrong step, {target}, is where REFLECT's own guidance is tried (the {count} steps ending at the "
        "localized one): the control injects no plan there, only corrected calls"
    )


class PlaceboControl(ReflectPipeline):
    """REFLECT with a plan (and its corrected call) written for another failure, drawn from ``plans`` (see the
    module); with none there, the record is skipped with :data:`NO_PLACEBO` after the auditor's calls (its plan is
    kept in ``plans`` for the failures after it), and nothing is replayed."""

    method = PLACEBO_METHOD

    def __init__(
        self,
        llm: StructuredLLM,
        *,
        verifier: Verifier,
        config: ReflectConfig | None = None,
        plans: PlanPool | None = None,
    ) -> None:
        config = config or ReflectConfig()
        self.plans = plans if plans is not None else PlanPool()
        self._draw = _PlaceboDraw(self.plans)
        policy = ReflectPolicy(
            llm_source="control:placebo",
            actions=config.actions,
            evidence=False,
            resample=False,
            use_diagnostician=config.use_diagnostician,
            swap_plan=self._draw.swap,
            points=self._draw.points,
            no_points=self._draw.no_points,
        )
        super().__init__(llm, verifier=verifier, config=config, policy=policy)

    def attribute(self, trace: StructuredTrace, **options: Unpack[AttributeOptions]) -> AttributionRecord:
        try:
            record = super().attribute(trace, **options)
        finally:
            drew, placebo = self._draw.take(trace)
        if drew and placebo is None and not record.replays:
            return record.model_copy(update={"status": AttributionStatus.SKIPPED, "reason": NO_PLACEBO})
        return record


class WrongStepControl(ReflectPipeline):
    """REFLECT, this run's own plan and corrected calls, at another step than the localized one (see the module)."""

    method = "control-wrong-step"

    def __init__(self, llm: StructuredLLM, *, verifier: Verifier, config: ReflectConfig | None = None) -> None:
        config = config or ReflectConfig()
        policy = ReflectPolicy(
            llm_source="control:wrong-step",
            actions=config.actions,
            use_diagnostician=config.use_diagnostician,
            points=_wrong_step_points,
            action_step=wrong_step,
            no_points=_no_wrong_step_points,
        )
        super().__init__(llm, verifier=verifier, config=config, policy=policy)
