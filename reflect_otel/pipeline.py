"""REFLECT (the paper's Algorithm 1) as a policy of the shared search (:mod:`reflect_otel.search`): diagnose, test by
targeted replay under control, verify and re-localize.

Each round localizes the earliest decisive error step i (the steps earlier rounds tested are shown and excluded),
classifies it, and writes a repair plan for it. Then it tests, cheapest first, each under the control rule of
:mod:`reflect_otel.controlled_replay` (one replay budget for everything, controls included):

- *actions* (up to M): the corrections the evidence rules read from the trace (:mod:`reflect_otel.corrections`) and
  the auditor's corrected step (a call of one of the agent's own tools, or a thought; with ``auditor_samples`` > 1
  more sampled diagnoses add theirs), each executed in place of the step it names;
- *guidance* (the paper's): at each rollback point p in {i, i-1, ...} (K points, the run's answer step skipped),
  the agent's own decisions at step p with the plan injected, sampled, screened by the faithfulness gate, each
  executed as an action. The plan is injected without its parts that carry the expected answer
  (:func:`reflect_otel.leaks.guard_plan`; each withheld part is a refused correction in the record); with its
  instruction withheld there is no guidance to give.

The first verified test makes its step the attribution (status ``verified``), and the intervention's continuation
explains the error. Otherwise the next round re-localizes. After D rounds, or when the budget is spent, the last
localization is returned, ``not_attributable`` when a flip was explained by its control, else ``unverified``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reflect_otel import corrections, leaks, prompts, stages
from reflect_otel._run import MethodBase
from reflect_otel.config import ReflectConfig
from reflect_otel.errors import LLMError
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.record import (
    AttributionMode,
    AttributionRecord,
    Classification,
    Correction,
    InterventionKind,
    Localization,
    RepairPlan,
)
from reflect_otel.replay import ReplayAdapter
from reflect_otel.search import (
    Diagnosis,
    Explanation,
    Round,
    SearchContext,
    faithfulness_gate,
    localized_steps,
    search,
    tested_steps,
)
from reflect_otel.tool_definitions import available_tools
from reflect_otel.trace import StepAction, StructuredTrace
from reflect_otel.trial import GateFn, Trial, TrialResult
from reflect_otel.verdict import Verdict
from reflect_otel.verifiers import Verifier

__all__ = ["ReflectPipeline", "ReflectPolicy", "guidance_window", "rollback_points"]


def rollback_points(step_index: int, count: int) -> list[int]:
    """{i, i-1, ..., max(i-K+1, 1)}: the steps to regenerate, the localized one and the K-1 before it, nearest
    first. Replaying at step p keeps steps 1..p-1 (the adapter's ``rollback_point`` is p-1)."""
    return list(range(step_index, max(step_index - count + 1, 1) - 1, -1))


def guidance_window(trace: StructuredTrace, localized: int, count: int) -> list[int]:
    """The K steps to regenerate with guidance: the localized step and the K-1 before it, nearest first. At the
    run's answer step the agent's new decision counts only when it is not an answer again (a new answer would flip
    the run from anywhere): a call it makes instead is tested."""
    return rollback_points(min(localized, len(trace.steps)), count)


_WITHHELD = "the plan's instruction carries the expected answer: no guidance to give (see the refused corrections)"

PlanSwap = Callable[[SearchContext, RepairPlan], RepairPlan]
"""A control's replacement for the round's plan (the placebo's plan written for another failure)."""
PointRule = Callable[[StructuredTrace, int, int, frozenset[int]], list[int]]
"""Where guidance is tried, from the trace, the localized step, K and the steps earlier rounds localized (the
wrong-step control moves it)."""
ActionStep = Callable[[StructuredTrace, int, frozenset[int]], int | None]
"""Where the round's corrected calls are executed, from the trace, the localized step and the steps earlier rounds
localized (None: nowhere); the wrong-step control moves them."""

NoPoints = Callable[[StructuredTrace, int, int, frozenset[int]], str]
"""Why ``points`` found no guidance point, from the same arguments."""


def _window(trace: StructuredTrace, localized: int, count: int, earlier: frozenset[int]) -> list[int]:
    return guidance_window(trace, localized, count)  # REFLECT's own points do not depend on earlier rounds


@dataclass(frozen=True)
class ReflectPolicy:
    """REFLECT's choices in the shared search (see the module). The faithfulness controls are this policy with one
    thing changed, for its actions as for its guidance: ``swap_plan`` and no evidence calls (the placebo: another
    failure's plan and corrected call), or ``points`` and ``action_step`` (the wrong step)."""

    llm_source: str = "llm"
    actions: bool = True
    evidence: bool = True
    """The evidence rules' corrected calls are tried as actions (with ``actions``)."""
    use_diagnostician: bool = True
    swap_plan: PlanSwap | None = None
    points: PointRule = _window
    action_step: ActionStep | None = None
    """Where the localized step's corrected calls are executed instead (the other steps' are then not tried: they
    are REFLECT's own tests of those steps); None: at the step each was written for."""
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
            run.error("classify", error, len(rounds) + 1)
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
        plans = self._plans(ctx, prompt, localization, classification, found, round_)
        plan = plans[0]
        if self.swap_plan is not None:
            plan = self.swap_plan(ctx, plan)
            plans = [plan]  # the drawn plan's corrected call is the only one tried
        return self._trials(
            ctx, localization, classification, plan, plans, found, set(tested), frozenset(localized), round_
        )

    def _plans(
        self,
        ctx: SearchContext,
        prompt: prompts.PromptContext,
        localization: Localization,
        classification: Classification | None,
        found: list[Correction],
        round_: int,
    ) -> list[RepairPlan]:
        """The round's repair plan (greedy), then ``auditor_samples - 1`` sampled second opinions; the localizer's
        own suggestion when the diagnosis fails or is switched off."""
        fallback = stages.null_plan(localization, classification)
        if not self.use_diagnostician:
            return [fallback]
        config, plans = ctx.config, []
        # the auditor is shown only candidates that could be tried: a refused one would invite its repeat
        shown = [c for c in found if corrections.refusal(c, ctx.trace, ctx.expected, pure=ctx.pure_tools) is None]
        for sample in range(config.auditor_samples if self.actions else 1):
            try:
                plans.append(
                    stages.diagnose(
                        ctx.run.llm,
                        prompt,
                        ctx.trace,
                        localization,
                        classification,
                        tools=available_tools(ctx.trace) if self.actions else (),
                        candidates=shown[: config.max_corrections],
                        corrected_step=self.actions,
                        temperature=None if sample == 0 else config.proposal_temperature,
                    )
                )
            except LLMError as error:
                ctx.run.error("diagnose", error, round_)
        return plans or [fallback]

    def _trials(
        self,
        ctx: SearchContext,
        localization: Localization,
        classification: Classification | None,
        plan: RepairPlan,
        plans: list[RepairPlan],
        found: list[Correction],
        tested: set[int],
        earlier: frozenset[int],
        round_: int,
    ) -> Diagnosis:
        """Actions first (nearest step first, at most M), then guidance at the rollback points; the ones that
        would prove nothing refused and kept in the record. ``earlier``: the steps earlier rounds localized. A
        round left with nothing to test records its guidance refused with the reason (``no_points``)."""
        trace, config, located = ctx.trace, ctx.config, localization.step_index
        steps = trace.steps
        original = StepAction.of_step(steps[located - 1]) if 1 <= located <= len(steps) else None
        auditor = [
            Correction(
                source=self.llm_source,
                kind=InterventionKind.ACTION,
                step_index=located,
                original=original,
                replacement=p.corrected_step,
                finding="the auditor's corrected step",
            )
            for p in plans
            if p.corrected_step is not None and self.actions
        ]
        proposed = sorted([*auditor, *found], key=lambda c: abs(c.step_index - located))
        unplaced: list[Correction] = []
        if self.action_step is not None:  # the corrections of the localized step, moved; the other steps' not tried
            target = self.action_step(trace, located, earlier)
            mine = [c for c in proposed if c.step_index == located]
            if target is None:
                why = self._no_points(trace, located, config.rollback_points, earlier)
                unplaced = [c.model_copy(update={"refused": why}) for c in mine]
            proposed = [
                c.model_copy(update={"step_index": target, "original": StepAction.of_step(steps[target - 1])})
                for c in mine
                if target is not None
            ]
        actions = corrections.ordered(proposed, trace, ctx.expected, config.max_corrections, pure=ctx.pure_tools)
        refused = (*unplaced, *(c for c in actions if c.refused is not None))
        trials = [
            Trial(c, round=round_, localized_step=located)
            for c in actions
            if c.refused is None and c.step_index not in tested
        ]
        window = self.points(trace, located, config.rollback_points, earlier)
        points = [p for p in window if p not in tested]
        source = self.llm_source if self.use_diagnostician else "localizer"
        given, withheld = leaks.guard_plan(plan, ctx.expected, trace.question) if points else (plan, ())
        refused += tuple(
            Correction(
                source=source,
                kind=InterventionKind.GUIDANCE,
                step_index=located,
                finding=f"the plan's {part.part}, withheld from the guidance: {part.text[:500]}",
                refused=part.reason,
            )
            for part in withheld
        )
        if any(part.part == leaks.INSTRUCTION for part in withheld):
            points = []  # no guidance left to give; the refusal says why
        for point in points:
            guidance = Correction(
                source=source,
                kind=InterventionKind.GUIDANCE,
                step_index=point,
                original=StepAction.of_step(steps[point - 1]),
                finding=given.correction_instruction,
            )
            failed = steps[located - 1] if 1 <= located <= len(steps) else None
            injection = prompts.repair_injection(given, located, failed, config.max_field_chars)
            trials.append(
                Trial(
                    guidance,
                    injection=injection,
                    plan=given,
                    round=round_,
                    localized_step=located,
                    authored=prompts.plan_texts(given),
                )
            )
        note = (
            ""
            if points
            else (_WITHHELD if withheld else self._no_points(trace, located, config.rollback_points, earlier))
        )
        if not trials and not withheld and 1 <= located <= len(steps):  # a withheld plan's refusals say why already
            if window:
                note = "the steps it would test were tested in earlier rounds"
            refused = (
                *refused,
                Correction(
                    source=source,
                    kind=InterventionKind.GUIDANCE,
                    step_index=located,
                    original=StepAction.of_step(steps[located - 1]),
                    finding=given.correction_instruction,
                    refused=f"this round tests nothing: {note}",
                ),
            )
        return Diagnosis(localization, classification, plan, tuple(trials), refused, note)

    def _no_points(self, trace: StructuredTrace, located: int, count: int, earlier: frozenset[int]) -> str:
        return self.no_points if isinstance(self.no_points, str) else self.no_points(trace, located, count, earlier)

    def gate(self, ctx: SearchContext) -> GateFn | None:
        return faithfulness_gate(ctx)

    def explain(self, ctx: SearchContext, round_: Round, verified: TrialResult) -> Explanation | None:
        if verified.result is None:
            return None
        step = verified.trial.step
        try:
            out = stages.explain_correction(
                ctx.run.llm,
                ctx.prompt_context(show_expected=True),
                ctx.trace,
                ctx.trace.steps[step - 1],
                verified.result.continuation,
                verified.result.final_answer or "",
                step,
            )
        except LLMError as error:
            ctx.run.error("explain", error, round_.number)
            return None
        return Explanation(out.error_type, f"{out.explanation}\n\n{out.reasoning}".strip())


class ReflectPipeline(MethodBase):
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

    def attribute(
        self,
        trace: StructuredTrace,
        *,
        expected: str | None = None,
        replay: ReplayAdapter | None = None,
        domain_context: str = "",
        verdict: Verdict | None = None,
    ) -> AttributionRecord:
        run = self.start(trace, verdict)
        mode = AttributionMode.REPLAY if replay is not None else AttributionMode.LOCALIZATION_ONLY
        return self.guarded(
            run,
            mode,
            lambda: search(
                run, self.policy, expected=expected, replay=replay, domain_context=domain_context, config=self.config
            ),
        )
