"""The methods REFLECT is compared with, on the same LLM layer and returning the same record type.

| method | LLM calls per trace (T steps, D rounds) |
| --- | --- |
| ``aao`` all-at-once | 1 |
| ``sbs`` step-by-step | index of the first flagged step, T when none is flagged |
| ``bs`` binary search | ceil(log2 T) + 1 (bisections, then one call for the reason) |
| ``ics`` bare-prefix resampling | up to D localizations; the agent's own resampled steps, replayed under control |
| ``reflexion`` / ``reflexion-nogt`` | 2 (reflect, then name the step); with a replay adapter, one retry from the start |
| ``dover`` | 1 (hypotheses) + 1 (classify) + the gate's calls; each hypothesis's intervention replayed under control |

ICS and DoVer replay through the same search as REFLECT (:mod:`reflect_otel.attribution.search`): the same budget and the same
control rule. Every method shares one error boundary (:meth:`~reflect_otel.attribution._run.MethodBase.guarded`).
| ``evidence`` (the earliest decisive evidence finding) | 0 |
| ``first-step`` / ``last-step`` | 0 |
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Unpack

from reflect_otel import prompts
from reflect_otel.attribution import stages
from reflect_otel.attribution._replayer import Replayer
from reflect_otel.attribution._run import AttributeOptions, AttributionRun, Conclusion, MethodBase, Tested
from reflect_otel.attribution.leaks import leak
from reflect_otel.attribution.pipeline import SearchingMethod, guidance_window, resampled_elsewhere, resampling
from reflect_otel.attribution.search import (
    Diagnosis,
    Round,
    SearchContext,
    SearchPolicy,
    faithfulness_gate,
    localized_steps,
    tested_steps,
)
from reflect_otel.attribution.trial import GateFn, Trial, TrialResult
from reflect_otel.flagging import evidence
from reflect_otel.record import (
    REFUSED_TEXT_CHARS,
    AttributionMode,
    AttributionRecord,
    AttributionStatus,
    Correction,
    InterventionKind,
    Localization,
    RepairPlan,
    ReplayAttempt,
    Stage,
)
from reflect_otel.replay import ReplayAdapter
from reflect_otel.trace import StepAction, StructuredTrace

__all__ = ["BASELINES", "Baseline", "HypothesesPolicy", "ResamplePolicy", "binary_search_calls"]


def binary_search_calls(step_count: int) -> int:
    """The binary-search baseline's LLM calls for a trace of ``step_count`` steps."""
    return math.ceil(math.log2(step_count)) + 1 if step_count > 1 else 1


class Baseline(MethodBase):
    """A comparison method. ``attribute`` has the pipeline's signature and, like it, never raises."""

    method = "baseline"
    uses_expected = True
    needs_llm = True

    def attribute(self, trace: StructuredTrace, **options: Unpack[AttributeOptions]) -> AttributionRecord:
        expected, replay = options.get("expected"), options.get("replay")
        domain_context, verdict = options.get("domain_context", ""), options.get("verdict")
        run = self.start(trace, verdict)
        if not trace.steps:
            return run.record(
                Conclusion(
                    AttributionStatus.SKIPPED,
                    AttributionMode.LOCALIZATION_ONLY,
                    step_index=None,
                    reason="the trace has no steps",
                )
            )
        ctx = run.prompt_context(
            trace,
            expected,
            include_expected=self.config.include_expected_answer and self.uses_expected,
            domain_context=domain_context,
            config=self.config,
        )
        return self.guarded(
            run, AttributionMode.LOCALIZATION_ONLY, lambda: self._attribute(_Task(run, ctx, expected, replay))
        )

    def _attribute(self, task: _Task) -> AttributionRecord:
        raise NotImplementedError

    @staticmethod
    def _localized(
        run: AttributionRun, step: int, out: prompts.AAOOutput | prompts.ReasonOutput, reason: str = ""
    ) -> AttributionRecord:
        explanation = out.reason
        return run.record(
            Conclusion(
                AttributionStatus.UNVERIFIED,
                AttributionMode.LOCALIZATION_ONLY,
                step_index=step,
                error_type=out.error_type,
                auditor_confidence=out.confidence,
                explanation=explanation,
                reason=reason or "a localization method: no replay evidence",
            )
        )


@dataclass(frozen=True, slots=True)
class _Task:
    """What a baseline's attribution of one run works from: the run (its trace, model and log), the prompt context,
    the expected answer, and the replay adapter (None: localization only)."""

    run: AttributionRun
    ctx: prompts.PromptContext
    expected: str | None
    replay: ReplayAdapter | None


def _in_range(count: int) -> Callable[[prompts.AAOOutput], str | None]:
    def check(out: prompts.AAOOutput) -> str | None:
        return None if 1 <= out.error_step <= count else f"error_step must be from 1 to {count}, got {out.error_step}"

    return check


class AllAtOnce(Baseline):
    method = "aao"

    def _attribute(self, task: _Task) -> AttributionRecord:
        run, trace, ctx = task.run, task.run.trace, task.ctx
        out = run.llm.complete(
            prompts.all_at_once(ctx, trace.steps), prompts.AAOOutput, stage=Stage.AAO, check=_in_range(len(trace.steps))
        ).value
        return self._localized(run, out.error_step, out)


class StepByStep(Baseline):
    method = "sbs"

    def _attribute(self, task: _Task) -> AttributionRecord:
        run, trace, ctx = task.run, task.run.trace, task.ctx
        for step in trace.steps:
            out = run.llm.complete(
                prompts.step_check(ctx, trace.steps[: step.index]), prompts.StepCheckOutput, stage=Stage.SBS
            ).value
            if out.is_error:
                return run.record(
                    Conclusion(
                        AttributionStatus.UNVERIFIED,
                        AttributionMode.LOCALIZATION_ONLY,
                        step_index=step.index,
                        explanation=out.reason,
                        reason="a localization method: no replay evidence",
                    )
                )
        return run.record(
            Conclusion(
                AttributionStatus.UNVERIFIED,
                AttributionMode.LOCALIZATION_ONLY,
                step_index=len(trace.steps),
                reason="no step was flagged: the final step is the fallback",
            )
        )


class BinarySearch(Baseline):
    method = "bs"

    def _attribute(self, task: _Task) -> AttributionRecord:
        run, trace, ctx = task.run, task.run.trace, task.ctx
        low, high = 1, len(trace.steps)
        while low < high:
            mid = (low + high) // 2
            out = run.llm.complete(
                prompts.bisect(ctx, trace.steps, range(low, mid + 1), range(mid + 1, high + 1)),
                prompts.BisectOutput,
                stage=Stage.BS,
            ).value
            low, high = (low, mid) if out.half == "first" else (mid + 1, high)
        reason = run.llm.complete(
            prompts.reason_for_step(ctx, trace.steps, low), prompts.ReasonOutput, stage=Stage.BS_REASON
        ).value
        return self._localized(run, low, reason)


class Reflexion(Baseline):
    """Reflect on the failed attempt, name the step the reflection blames, and, where the agent can be replayed,
    retry the task from the start with the reflection as memory (Reflexion's trial). A memory that carries the
    expected answer, or states one, is refused (:mod:`reflect_otel.attribution.leaks`): it would flip any retry and prove
    nothing. A retry that answers right corrects the run but verifies no step: its trajectory shares no prefix
    with the original, so the record stays unverified (correction is not attribution)."""

    method = "reflexion"

    def _attribute(self, task: _Task) -> AttributionRecord:
        run, trace, ctx, expected, replay = task.run, task.run.trace, task.ctx, task.expected, task.replay
        # the reflection becomes the retry's memory: written without the expected answer in view when it is replayed
        written = ctx.model_copy(update={"include_expected": False}) if replay is not None else ctx
        reflection = run.llm.complete(
            prompts.reflexion_reflect(written, trace.steps), prompts.ReflectionOutput, stage=Stage.REFLECT
        ).value
        out = run.llm.complete(
            prompts.reflexion_extract(ctx, trace.steps, reflection.reflection),
            prompts.AAOOutput,
            stage=Stage.REFLEXION_EXTRACT,
            check=_in_range(len(trace.steps)),
        ).value
        if replay is None:
            return self._localized(run, out.error_step, out)
        memory = prompts.reflexion_memory(reflection.reflection)
        retry = Correction(
            source="reflexion", kind=InterventionKind.GUIDANCE, step_index=1, finding=reflection.reflection[:500]
        )
        leaked = leak(memory, expected, trace.question)
        if leaked is not None:
            refused = retry.model_copy(update={"refused": leaked, "refused_text": memory[:REFUSED_TEXT_CHARS]})
            tested = Tested(corrections=(refused,))
            return run.record(
                _blaming(out, AttributionMode.LOCALIZATION_ONLY, f"the retry was not run: its memory {leaked}", tested)
            )
        attempt, result = Replayer(run, replay, expected=expected, injection_role=self.config.injection_role).replay(
            ReplayAttempt(round=1, rollback_point=0, localized_step=out.error_step, injection=memory, correction=retry),
            action=None,
        )
        corrected = result.final_answer if attempt.flipped and result else None
        reason = (
            "the retry with the reflection answered right, but a retry from the start tests no step"
            if corrected is not None
            else "the retry with the reflection did not answer right"
        )
        tried = retry.model_copy(update={"replays": 1, "flipped": attempt.flipped})
        tested = Tested(replays=(attempt,), corrections=(tried,), rounds=1)
        return run.record(_blaming(out, AttributionMode.REPLAY, reason, tested, corrected_answer=corrected))


def _blaming(
    out: prompts.AAOOutput, mode: AttributionMode, reason: str, tested: Tested, *, corrected_answer: str | None = None
) -> Conclusion:
    """Reflexion's unverified conclusion: the step its reflection blames, and what its retry showed."""
    return Conclusion(
        AttributionStatus.UNVERIFIED,
        mode,
        step_index=out.error_step,
        error_type=out.error_type,
        auditor_confidence=out.confidence,
        explanation=out.reason,
        corrected_answer=corrected_answer,
        reason=reason,
        tested=tested,
    )


class ReflexionNoGT(Reflexion):
    method = "reflexion-nogt"
    uses_expected = False


class _Searching(SearchingMethod, Baseline):
    """A baseline that replays: the shared search (:mod:`reflect_otel.attribution.search`) with this method's policy,
    as REFLECT's (:class:`~reflect_otel.attribution.pipeline.SearchingMethod`)."""


@dataclass(frozen=True)
class ResamplePolicy:
    """ICS: localize without the expected answer, then let the agent redo the localized step (and the K-1 before
    it) with no hint at all; each resampled step that differs from the original is replayed under control."""

    def diagnose(self, ctx: SearchContext, rounds: Sequence[Round]) -> Diagnosis | None:
        trace = ctx.trace
        tested, localized = tested_steps(rounds), localized_steps(rounds)
        if len(localized) >= len(trace.steps):
            return None
        localization = stages.localize(
            ctx.run.llm, ctx.prompt_context(show_expected=False), trace, tested=tested, excluded=localized
        )
        if not ctx.replayable:
            return Diagnosis(localization)
        located = localization.step_index
        trials = tuple(
            resampling(point, trace, round_=len(rounds) + 1, localized=located)
            for point in guidance_window(trace, located, ctx.config.rollback_points)
            if point not in tested
        )
        return Diagnosis(localization, trials=trials)

    def gate(self, ctx: SearchContext) -> GateFn | None:
        return None  # no plan to follow: a step that differs is the intervention

    def elsewhere(self, ctx: SearchContext, verified: TrialResult, step: int) -> tuple[Trial | None, str]:
        """The agent's own decision at ``step``, resampled: the source that verified, elsewhere."""
        return resampled_elsewhere(ctx, verified, step)


class ICS(_Searching):
    """Untargeted resampling (the paper's no-hint control): see :class:`ResamplePolicy`."""

    method = "ics"
    uses_expected = False

    def search_policy(self) -> SearchPolicy:
        return ResamplePolicy()


@dataclass(frozen=True)
class HypothesesPolicy:
    """DoVer: hypothesis -> intervention -> validate, without re-localization: each hypothesis's intervention is
    the agent's guidance at its step, tested under control; the first verified one is the attribution, else the
    first hypothesis, unverified."""

    hypotheses: int = 3

    def diagnose(self, ctx: SearchContext, rounds: Sequence[Round]) -> Diagnosis | None:
        if rounds:
            return None
        run, trace = ctx.run, ctx.trace
        prompt = ctx.prompt_context(show_expected=False)  # its interventions are injected into replays
        count = len(trace.steps)

        def check(out: prompts.HypothesesOutput) -> str | None:
            bad = [h.step for h in out.hypotheses if not 1 <= h.step <= count]
            return f"every step must be from 1 to {count}; got {bad}" if bad else None

        found = run.llm.complete(
            prompts.dover_hypotheses(prompt, trace.steps, self.hypotheses),
            prompts.HypothesesOutput,
            stage=Stage.DOVER_HYPOTHESES,
            check=check,
        ).value.hypotheses[: self.hypotheses]
        first = found[0]
        classification = stages.classify(run.llm, prompt, trace, first.step)
        localization = Localization(
            step_index=first.step, confidence=classification.confidence, reasoning=first.hypothesis
        )
        trials = tuple(
            Trial(
                Correction(
                    source="dover",
                    kind=InterventionKind.GUIDANCE,
                    step_index=h.step,
                    original=StepAction.of_step(trace.steps[h.step - 1]),
                    finding=h.intervention,
                ),
                injection=h.intervention,
                plan=RepairPlan(root_cause=h.hypothesis, correction_instruction=h.intervention),
                localized_step=h.step,
            )
            for h in found
            if ctx.replayable
        )
        plan = RepairPlan(root_cause=first.hypothesis, correction_instruction=first.intervention)
        return Diagnosis(localization, classification, plan, trials)

    def gate(self, ctx: SearchContext) -> GateFn | None:
        return faithfulness_gate(ctx)

    def elsewhere(self, ctx: SearchContext, verified: TrialResult, step: int) -> tuple[Trial | None, str]:
        return None, "DoVer's hypotheses each name their own step: it has no correction source for another step"


class DoVer(_Searching):
    """See :class:`HypothesesPolicy`."""

    method = "dover"

    def search_policy(self) -> SearchPolicy:
        return HypothesesPolicy()


class _Pick(Baseline):
    """A method that picks a step without an LLM: :meth:`_pick` says which (or None) and why; one record shape."""

    needs_llm = False

    def _pick(self, trace: StructuredTrace) -> tuple[int | None, str, str]:
        """(step index or None, explanation, reason)."""
        raise NotImplementedError

    def _attribute(self, task: _Task) -> AttributionRecord:
        run, trace = task.run, task.run.trace
        step, explanation, reason = self._pick(trace)
        return run.record(
            Conclusion(
                AttributionStatus.UNVERIFIED,
                AttributionMode.LOCALIZATION_ONLY,
                step_index=step,
                explanation=explanation,
                reason=reason,
            )
        )


class FirstStep(_Pick):
    """A floor: always the first step."""

    method = "first-step"

    def _pick(self, trace: StructuredTrace) -> tuple[int | None, str, str]:
        return 1, "", "position baseline"


class LastStep(_Pick):
    """A floor: always the last step."""

    method = "last-step"

    def _pick(self, trace: StructuredTrace) -> tuple[int | None, str, str]:
        return len(trace.steps), "", "position baseline"


class EvidenceFirst(_Pick):
    """The step of the earliest decisive evidence finding (:func:`reflect_otel.flagging.evidence.decisive`); no step when
    the checks find nothing, which scores as a miss."""

    method = "evidence"

    def _pick(self, trace: StructuredTrace) -> tuple[int | None, str, str]:
        finding = evidence.decisive(evidence.find_evidence(trace))
        if finding is None:
            return None, "", "no evidence check found anything in this trace"
        explanation = f"{finding.kind.value}: {finding.evidence}"
        return finding.step_index, explanation, f"evidence check ({finding.severity.value}); no replay evidence"


BASELINES: dict[str, type[Baseline]] = {
    cls.method: cls
    for cls in (
        AllAtOnce,
        StepByStep,
        BinarySearch,
        ICS,
        Reflexion,
        ReflexionNoGT,
        DoVer,
        EvidenceFirst,
        FirstStep,
        LastStep,
    )
}
