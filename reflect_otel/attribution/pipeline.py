"""REFLECT (the paper's Algorithm 1) as a policy of the shared search (:mod:`reflect_otel.attribution.search`): diagnose, test by
targeted replay under control, verify and re-localize.

Each round localizes the earliest decisive error step i (the steps earlier rounds tested are shown and excluded;
the localizer may see the expected answer, the paper's oracle regime), classifies it, and writes a repair plan for
it **without the expected answer in view** (nothing a replay executes is written by a prompt that shows the answer,
nor from the localizer's or the classifier's words, which saw it). Then it tests, cheapest first, each under the
control rule of :mod:`reflect_otel.attribution.controlled_replay` (one replay budget for everything, controls and sensitivity
arms included):

1. *evidence actions* (up to M with the auditor's): the corrections the evidence rules read from a tool's own error
   or empty result (:mod:`reflect_otel.attribution.corrections`), nearest to step i first;
2. at each rollback point p in {i, i-1, ...} (K points, the run's answer turn never among them), nearest first: the
   agent's *own resampled decisions* at p, with no hint (each distinct one executed; one that changes nothing of
   the step's effect verifies nothing), then the auditor's *blind corrected step* (a call of one of the agent's
   own tools, or a thought; with ``auditor_samples`` > 1 more sampled diagnoses add theirs) where it names p;
3. *guidance* (the paper's): the agent's own decisions at each point with the plan injected, sampled, screened by
   the faithfulness gate, each executed as an action. The plan is injected without its parts that carry the
   expected answer (:func:`reflect_otel.attribution.leaks.guard_plan`; each withheld part is a refused correction in the
   record); with its instruction withheld there is no guidance to give.

The first verified test makes its step the attribution (status ``verified``: decisive), and the search then asks
whether the same correction source, applied at another step, flips the run too (:meth:`ReflectPolicy.elsewhere`;
the record's claim is ``localized`` only when it does not). Otherwise the next round re-localizes. After D rounds,
or when the budget is spent, the last localization is returned, ``not_attributable`` when a flip was explained by
its control or its sensitivity arm, else ``unverified``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, Unpack

from reflect_otel import prompts
from reflect_otel.attribution import corrections, leaks, stages
from reflect_otel.attribution._run import AttributeOptions, MethodBase
from reflect_otel.attribution.effects import screened_change
from reflect_otel.attribution.search import (
    Diagnosis,
    Round,
    SearchContext,
    SearchPolicy,
    faithfulness_gate,
    localized_steps,
    search,
    tested_steps,
)
from reflect_otel.attribution.trial import GateFn, Trial, TrialResult
from reflect_otel.config import ReflectConfig
from reflect_otel.errors import LLMError
from reflect_otel.flagging.verifiers import Verifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.reading.tool_definitions import available_tools
from reflect_otel.record import (
    AttributionMode,
    AttributionRecord,
    Classification,
    Correction,
    InterventionKind,
    Localization,
    RepairPlan,
    ReplayArm,
    Stage,
)
from reflect_otel.trace import StepAction, StructuredTrace

__all__ = [
    "MOVED_EARLIER",
    "ReflectPipeline",
    "ReflectPolicy",
    "blind",
    "guidance_window",
    "last_replaceable",
    "resampling",
    "rollback_points",
]


def rollback_points(step_index: int, count: int) -> list[int]:
    """{i, i-1, ..., max(i-K+1, 1)}: the steps to regenerate, the localized one and the K-1 before it, nearest
    first. Replaying at step p keeps steps 1..p-1 (the adapter's ``rollback_point`` is p-1)."""
    return list(range(step_index, max(step_index - count + 1, 1) - 1, -1))


def last_replaceable(trace: StructuredTrace) -> int:
    """The last step that is not the run's answer turn (0 when there is none): a replacement of the answer turn
    only gives the agent more turns (:data:`~reflect_otel.record.StepChange.ANSWER_TURN`)."""
    return max((s.index for s in trace.steps if not s.is_final_answer), default=0)


def guidance_window(trace: StructuredTrace, localized: int, count: int) -> list[int]:
    """The K steps to regenerate: the localized step and the K-1 before it, nearest first, the run's answer turn
    never among them (a localized answer turn tests the K steps before it)."""
    last = last_replaceable(trace)
    if last == 0:
        return []
    steps = trace.steps
    return [p for p in rollback_points(min(localized, last), count) if not steps[p - 1].is_final_answer]


_WITHHELD = "the plan's instruction carries the expected answer: no guidance to give (see the refused corrections)"

PlanSwap = Callable[[SearchContext, RepairPlan], RepairPlan]
"""A control's replacement for the round's plan (the placebo's plan written for another failure)."""
PointRule = Callable[[StructuredTrace, int, int, frozenset[int]], list[int]]
"""Where guidance and resampling are tried, from the trace, the localized step, K and the steps earlier rounds
localized (the wrong-step control moves it)."""
ActionStep = Callable[[StructuredTrace, int, frozenset[int]], int | None]
"""Where the round's corrected calls are executed, from the trace, the localized step and the steps earlier rounds
localized (None: nowhere); the wrong-step control moves them."""

NoPoints = Callable[[StructuredTrace, int, int, frozenset[int]], str]
"""Why ``points`` found no guidance point, from the same arguments."""

MOVED_EARLIER = (
    "a correction of a later step executed at an earlier one: the run's later work, done sooner, flips a run "
    "wherever it is executed"
)


def _window(trace: StructuredTrace, localized: int, count: int, earlier: frozenset[int]) -> list[int]:
    return guidance_window(trace, localized, count)  # REFLECT's own points do not depend on earlier rounds


def resampling(step: int, trace: StructuredTrace, *, round_: int, localized: int, finding: str = "") -> Trial:
    """The agent's own decision at ``step``, resampled with no hint: each distinct proposal executed as an action
    (a guidance trial with no text and no plan, so any change of effect is the intervention)."""
    return Trial(
        Correction(
            source="resample",
            kind=InterventionKind.GUIDANCE,
            step_index=step,
            original=StepAction.of_step(trace.steps[step - 1]),
            finding=finding or "the agent's own step, resampled with no hint",
        ),
        round=round_,
        localized_step=localized,
    )


def resampled_elsewhere(ctx: SearchContext, verified: TrialResult, step: int) -> tuple[Trial, str]:
    """The localization test's trial when the agent's own resampled decision verified: the same source at
    ``step``."""
    trial = resampling(
        step,
        ctx.trace,
        round_=verified.trial.round,
        localized=verified.trial.step,
        finding="the localization test: the agent's own step, resampled",
    )
    return replace(trial, arm=ReplayArm.LOCALIZATION), ""


def blind(
    localization: Localization, classification: Classification | None
) -> tuple[Localization, Classification | None]:
    """What of a localization and a classification made with the expected answer in view may reach a prompt that
    writes what a replay executes: the step and the error type, not their words (which may carry the answer)."""
    bare = Localization(step_index=localization.step_index, confidence=localization.confidence)
    if classification is None:
        return bare, None
    return bare, Classification(error_type=classification.error_type, confidence=classification.confidence)


@dataclass(frozen=True)
class ReflectPolicy:
    """REFLECT's choices in the shared search (see the module). The faithfulness controls are this policy with one
    thing changed, for its actions as for its guidance: ``swap_plan``, no evidence calls and no resampling (the
    placebo: another failure's plan and corrected call), or ``points`` and ``action_step`` (the wrong step)."""

    llm_source: str = "llm"
    actions: bool = True
    evidence: bool = True
    """The evidence rules' corrected calls are tried as actions (with ``actions``)."""
    resample: bool = True
    """The agent's own resampled decisions at each point are tried (with ``actions``)."""
    use_diagnostician: bool = True
    swap_plan: PlanSwap | None = None
    points: PointRule = _window
    action_step: ActionStep | None = None
    """Where the localized step's corrected calls are executed instead (the other steps' are then not tried: they
    are REFLECT's own tests of those steps); None: at the step each was written for. A target before the localized
    step is refused (:data:`MOVED_EARLIER`)."""
    no_points: str | NoPoints = "no step before the run's answer to redo"
    """Why there are no guidance points, when ``points`` finds none (and why a round with nothing to test tests
    nothing: recorded as its guidance, refused); a function of ``points``'s arguments where the reason varies."""

    def diagnose(self, ctx: SearchContext, rounds: Sequence[Round]) -> Diagnosis | None:
        run, trace, config = ctx.run, ctx.trace, ctx.config
        tested, localized = tested_steps(rounds), localized_steps(rounds)
        if len(localized) >= len(trace.steps) or (rounds and not config.relocalize):
            return None  # every step localized; or the ablation that keeps the first localization has tested it
        prompt = ctx.prompt_context(show_expected=True)
        localization = stages.localize(run.llm, prompt, trace, tested=tested, excluded=localized)
        try:
            classification: Classification | None = stages.classify(run.llm, prompt, trace, localization.step_index)
        except LLMError as error:
            run.error(Stage.CLASSIFY, error, len(rounds) + 1)
            classification = None
        if not ctx.replayable:
            return Diagnosis(localization, classification)
        round_ = len(rounds) + 1
        found = (
            corrections.evidence_corrections(
                trace, near=localization.step_index, context=ctx.domain_context, agent_rules=ctx.correction_rules
            )
            if self.actions and self.evidence
            else []
        )
        heard = _Heard(localization, classification, tuple(found), round_)

        def whole() -> Diagnosis:
            plans = self._plans(ctx, heard)
            plan = plans[0]
            if self.swap_plan is not None:
                plan = self.swap_plan(ctx, plan)
                plans = [plan]  # the drawn plan's corrected call is the only one tried
            round_plan = _RoundPlan(localization, classification, plan, tuple(plans), tuple(found), round_)
            return self._trials(ctx, round_plan, set(tested), frozenset(localized))

        first = self._evidence_first(ctx, heard, set(tested))
        if first is None or self.swap_plan is not None or self.action_step is not None:
            return whole()  # the controls change what the evidence calls are: their rounds are diagnosed at once
        return replace(first, rest=whole)  # the diagnosis is written only if the evidence calls prove nothing

    def _evidence_first(self, ctx: SearchContext, heard: _Heard, tested: set[int]) -> Diagnosis | None:
        """The round's evidence calls, which come first in its order and need no diagnosis; None when there is
        none to test (the round is diagnosed at once)."""
        localization, classification, found, round_ = heard
        located = localization.step_index
        proposed = sorted((_screened(c, ctx.trace) for c in found), key=lambda c: abs(c.step_index - located))
        usable = [c for c in proposed if c.refused is None]
        actions = corrections.ordered(usable, ctx.trace, ctx.expected, ctx.config.max_corrections, pure=ctx.pure_tools)
        trials = tuple(
            Trial(c, round=round_, localized_step=located)
            for c in actions
            if c.refused is None and c.step_index not in tested
        )
        if not trials:
            return None
        return Diagnosis(localization, classification, None, trials)

    def _plans(self, ctx: SearchContext, heard: _Heard) -> list[RepairPlan]:
        """The round's repair plan (greedy), then ``auditor_samples - 1`` sampled second opinions, each written
        without the expected answer in view (:func:`blind`); the localizer's own suggestion when the diagnosis
        fails or is switched off."""
        localization, classification, found, round_ = heard
        fallback = stages.null_plan(localization, classification)
        if not self.use_diagnostician:
            return [fallback]
        config, plans = ctx.config, []
        prompt = ctx.prompt_context(show_expected=False)
        seen, told = blind(localization, classification)
        # the auditor is shown only candidates that could be tried: a refused one would invite its repeat
        shown = [c for c in found if corrections.refusal(c, ctx.trace, ctx.expected, pure=ctx.pure_tools) is None]
        for sample in range(config.auditor_samples if self.actions else 1):
            try:
                plans.append(
                    stages.diagnose(
                        ctx.run.llm,
                        prompt,
                        ctx.trace,
                        seen,
                        told,
                        stages.PlanAsk(
                            tools=available_tools(ctx.trace) if self.actions else (),
                            candidates=shown[: config.max_corrections],
                            corrected_step=self.actions,
                            temperature=None if sample == 0 else config.proposal_temperature,
                        ),
                    )
                )
            except LLMError as error:
                ctx.run.error(Stage.DIAGNOSE, error, round_)
        return plans or [fallback]

    def _trials(
        self, ctx: SearchContext, round_plan: _RoundPlan, tested: set[int], earlier: frozenset[int]
    ) -> Diagnosis:
        """The round's trials in the order of the module (evidence; per point, resampling then the auditor's
        call; guidance), the ones that would prove nothing refused and kept in the record. ``earlier``: the steps
        earlier rounds localized. A round left with nothing to test records its guidance refused with the reason
        (``no_points``)."""
        trace, config, located = ctx.trace, ctx.config, round_plan.localization.step_index
        window = self.points(trace, located, config.rollback_points, earlier)
        points = [p for p in window if p not in tested]
        actions, refused = self._actions(ctx, round_plan, earlier)
        evidence = [c for c in actions if c.source.startswith("evidence:")]
        auditor = [c for c in actions if not c.source.startswith("evidence:")]
        trials = [
            Trial(c, round=round_plan.round, localized_step=located) for c in evidence if c.step_index not in tested
        ]
        placed: set[int] = set()
        for point in points:
            if self.actions and self.resample:
                trials.append(resampling(point, trace, round_=round_plan.round, localized=located))
            mine = [c for c in auditor if c.step_index == point and c.step_index not in tested]
            trials += [Trial(c, round=round_plan.round, localized_step=located) for c in mine]
            placed |= {id(c) for c in mine}
        trials += [
            Trial(c, round=round_plan.round, localized_step=located)
            for c in auditor
            if id(c) not in placed and c.step_index not in tested
        ]
        guidance, withheld, refused_guidance = self._guidance(ctx, round_plan, points)
        trials += guidance
        refused += refused_guidance
        instruction_withheld = any(part.part == leaks.INSTRUCTION for part in withheld)
        note = (
            ""
            if points and not instruction_withheld
            else (_WITHHELD if withheld else self._no_points(trace, located, config.rollback_points, earlier))
        )
        if not trials and not withheld and 1 <= located <= len(trace.steps):  # a withheld plan's refusals say why
            if window:
                note = "the steps it would test were tested in earlier rounds"
            refused.append(
                Correction(
                    source=self._source,
                    kind=InterventionKind.GUIDANCE,
                    step_index=located,
                    original=StepAction.of_step(trace.steps[located - 1]),
                    finding=round_plan.plan.correction_instruction,
                    refused=f"this round tests nothing: {note}",
                )
            )
        return Diagnosis(
            round_plan.localization,
            round_plan.classification,
            round_plan.plan,
            tuple(trials),
            tuple(refused),
            note,
        )

    @property
    def _source(self) -> str:
        return self.llm_source if self.use_diagnostician else "localizer"

    def _actions(
        self, ctx: SearchContext, round_plan: _RoundPlan, earlier: frozenset[int]
    ) -> tuple[list[Correction], list[Correction]]:
        """The round's corrected calls to try (the evidence rules' and the auditor's, nearest to the localized step
        first, at most M), and those refused with why."""
        trace, located = ctx.trace, round_plan.localization.step_index
        steps = trace.steps
        original = StepAction.of_step(steps[located - 1]) if 1 <= located <= len(steps) else None
        auditor = [
            Correction(
                source=self.llm_source,
                kind=InterventionKind.ACTION,
                step_index=located,
                original=original,
                replacement=p.corrected_step,
                finding="the auditor's corrected step (written without the expected answer)",
            )
            for p in round_plan.plans
            if p.corrected_step is not None and self.actions
        ]
        # evidence first at equal distance: of the same call proposed by both, the evidence rule's is kept
        proposed = sorted([*round_plan.found, *auditor], key=lambda c: abs(c.step_index - located))
        unplaced: list[Correction] = []
        if self.action_step is not None:  # the corrections of the localized step, moved; the other steps' not tried
            target = self.action_step(trace, located, earlier)
            mine = [c for c in proposed if c.step_index == located]
            if target is None:
                why = self._no_points(trace, located, ctx.config.rollback_points, earlier)
                unplaced = [c.model_copy(update={"refused": why}) for c in mine]
            elif target < located:
                unplaced = [c.model_copy(update={"refused": MOVED_EARLIER}) for c in mine]
            proposed = [
                c.model_copy(update={"step_index": target, "original": StepAction.of_step(steps[target - 1])})
                for c in mine
                if target is not None and target > located
            ]
        screened = [_screened(c, trace) for c in proposed]
        unplaced += [c for c in screened if c.refused is not None]
        proposed = [c for c in screened if c.refused is None]
        actions = corrections.ordered(proposed, trace, ctx.expected, ctx.config.max_corrections, pure=ctx.pure_tools)
        refused = [*unplaced, *(c for c in actions if c.refused is not None)]
        return [c for c in actions if c.refused is None], refused

    def _guidance(
        self, ctx: SearchContext, round_plan: _RoundPlan, points: list[int]
    ) -> tuple[list[Trial], tuple[leaks.Withheld, ...], list[Correction]]:
        """The plan injected at each point (the paper's guidance), the parts of it withheld, and their refusals."""
        trace, config, located, plan = ctx.trace, ctx.config, round_plan.localization.step_index, round_plan.plan
        steps = trace.steps
        given, withheld = leaks.guard_plan(plan, ctx.expected, trace.question) if points else (plan, ())
        refused = [
            Correction(
                source=self._source,
                kind=InterventionKind.GUIDANCE,
                step_index=located,
                finding=f"the plan's {part.part}, withheld from the guidance: {part.text[:500]}",
                refused=part.reason,
            )
            for part in withheld
        ]
        if any(part.part == leaks.INSTRUCTION for part in withheld):
            return [], withheld, refused  # no guidance left to give; the refusal says why
        failed = steps[located - 1] if 1 <= located <= len(steps) else None
        trials = []
        for point in points:
            guidance = Correction(
                source=self._source,
                kind=InterventionKind.GUIDANCE,
                step_index=point,
                original=StepAction.of_step(steps[point - 1]),
                finding=given.correction_instruction,
            )
            injection = prompts.repair_injection(given, located, failed, config.max_field_chars)
            trials.append(
                Trial(
                    guidance,
                    injection=injection,
                    plan=given,
                    round=round_plan.round,
                    localized_step=located,
                    authored=prompts.plan_texts(given),
                )
            )
        return trials, withheld, refused

    def _no_points(self, trace: StructuredTrace, located: int, count: int, earlier: frozenset[int]) -> str:
        return self.no_points if isinstance(self.no_points, str) else self.no_points(trace, located, count, earlier)

    def gate(self, ctx: SearchContext) -> GateFn | None:
        return faithfulness_gate(ctx)

    def elsewhere(self, ctx: SearchContext, verified: TrialResult, step: int) -> tuple[Trial | None, str]:
        """The localization test's trial: the correction source that verified (an evidence rule, the agent's
        resampled decision, the auditor's blind corrected step; the placebo's drawn call) applied at ``step``."""
        deciding = verified.deciding.correction if verified.deciding is not None else None
        source = deciding.source if deciding is not None else verified.trial.correction.source
        trace, round_, localized = ctx.trace, verified.trial.round, verified.trial.step
        if source.startswith("evidence:"):
            found = corrections.evidence_corrections(
                trace, near=step, context=ctx.domain_context, agent_rules=ctx.correction_rules
            )
            mine = [
                c
                for c in found
                if c.step_index == step and corrections.refusal(c, trace, ctx.expected, pure=ctx.pure_tools) is None
            ]
            if not mine:
                return None, f"the evidence rules find nothing to correct at step {step}"
            return Trial(mine[0], round=round_, localized_step=localized, arm=ReplayArm.LOCALIZATION), ""
        if source == "resample" or source.startswith("proposal:"):
            trial = resampling(
                step,
                trace,
                round_=round_,
                localized=localized,
                finding="the localization test: the agent's own step, resampled",
            )
            return replace(trial, arm=ReplayArm.LOCALIZATION), ""
        return self._auditor_elsewhere(ctx, verified, step, deciding)

    def _auditor_elsewhere(
        self, ctx: SearchContext, verified: TrialResult, step: int, deciding: Correction | None
    ) -> tuple[Trial | None, str]:
        trace = ctx.trace
        original = StepAction.of_step(trace.steps[step - 1])
        if self.swap_plan is not None:  # the placebo's call is no one's correction of any step: the same call there
            if deciding is None or deciding.replacement is None:
                return None, "the placebo verified with no call to apply elsewhere"
            replacement = deciding.replacement
        else:
            try:
                plan = stages.diagnose(
                    ctx.run.llm,
                    ctx.prompt_context(show_expected=False),
                    trace,
                    Localization(step_index=step, confidence=0.0),
                    None,
                    stages.PlanAsk(tools=available_tools(trace)),
                )
            except LLMError as error:
                ctx.run.error(Stage.DIAGNOSE, error, verified.trial.round)
                return None, f"the auditor's corrected step for step {step} failed ({error})"
            if plan.corrected_step is None:
                return None, f"the auditor wrote no corrected step for step {step}"
            replacement = plan.corrected_step
        correction = Correction(
            source=deciding.source if deciding is not None else self.llm_source,
            kind=InterventionKind.ACTION,
            step_index=step,
            original=original,
            replacement=replacement,
            finding=f"the localization test: the same source's corrected step {step}",
        )
        refused = corrections.refusal(correction, trace, ctx.expected, pure=ctx.pure_tools)
        if refused is not None:
            return None, f"the corrected step {step} is refused ({refused})"
        trial = Trial(
            correction, round=verified.trial.round, localized_step=verified.trial.step, arm=ReplayArm.LOCALIZATION
        )
        return trial, ""


def _screened(correction: Correction, trace: StructuredTrace) -> Correction:
    """``correction`` refused where what it replaces tells already that it cannot change its step: the run's answer
    turn, or a call the run made at a later step (:func:`reflect_otel.attribution.effects.screened_change`)."""
    if correction.replacement is None:
        return correction
    change = screened_change(correction.replacement, trace, correction.step_index)
    return correction if change is None else correction.model_copy(update={"refused": change.text})


class _Heard(NamedTuple):
    """What a round's localization, classification and evidence rules said, before any plan is written."""

    localization: Localization
    classification: Classification | None
    found: tuple[Correction, ...]
    round: int


@dataclass(frozen=True, slots=True)
class _RoundPlan:
    """What one round of REFLECT's diagnosis produced, before it becomes trials."""

    localization: Localization
    classification: Classification | None
    plan: RepairPlan
    plans: tuple[RepairPlan, ...]
    found: tuple[Correction, ...]
    round: int


class SearchingMethod(MethodBase):
    """A method that attributes by the shared search (:func:`~reflect_otel.attribution.search.search`) with its
    policy: REFLECT, and the baselines that replay (ICS, DoVer). What differs is :meth:`search_policy`."""

    def search_policy(self) -> SearchPolicy:
        raise NotImplementedError

    def attribute(self, trace: StructuredTrace, **options: Unpack[AttributeOptions]) -> AttributionRecord:
        expected, replay = options.get("expected"), options.get("replay")
        domain_context, verdict = options.get("domain_context", ""), options.get("verdict")
        run = self.start(trace, verdict)
        mode = AttributionMode.REPLAY if replay is not None else AttributionMode.LOCALIZATION_ONLY
        policy = self.search_policy()
        return self.guarded(
            run,
            mode,
            lambda: search(
                run, policy, expected=expected, replay=replay, domain_context=domain_context, config=self.config
            ),
        )


class ReflectPipeline(SearchingMethod):
    """REFLECT on one LLM layer. ``verifier`` decides correctness: an oracle with an expected answer, or a proxy.
    ``policy`` is REFLECT's by default; the faithfulness controls and variants pass theirs."""

    method = "reflect"

    def __init__(
        self,
        llm: StructuredLLM,
        *,
        verifier: Verifier,
        config: ReflectConfig | None = None,
        policy: ReflectPolicy | None = None,
    ) -> None:
        super().__init__(llm, verifier=verifier, config=config)
        self.policy = policy or ReflectPolicy(
            actions=self.config.actions, use_diagnostician=self.config.use_diagnostician
        )

    def search_policy(self) -> SearchPolicy:
        return self.policy
