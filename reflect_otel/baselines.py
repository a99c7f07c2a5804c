"""The methods REFLECT is compared with, on the same LLM layer and returning the same record type.

| method | LLM calls per trace (T steps, D rounds) |
| --- | --- |
| ``aao`` all-at-once | 1 |
| ``sbs`` step-by-step | index of the first flagged step, T when none is flagged |
| ``bs`` binary search | ceil(log2 T) + 1 (bisections, then one call for the reason) |
| ``ics`` bare-prefix resampling | up to D localizations; replays need no hint and no plan |
| ``reflexion`` / ``reflexion-nogt`` | 2 (reflect, then name the step); with a replay adapter, one retry from the start |
| ``dover`` | 1 (hypotheses) + a replay per hypothesis + 1 (classify the supported one) |
| ``evidence`` (the earliest decisive evidence finding) | 0 |
| ``first-step`` / ``last-step`` | 0 |
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from reflect_otel import evidence, prompts, stages
from reflect_otel._run import AttributionRun, MethodBase, ReplayOutcome, replay_and_verify
from reflect_otel.errors import LLMError
from reflect_otel.record import (
    AttributionMode,
    AttributionRecord,
    AttributionStatus,
    Intervention,
    Localization,
    RepairPlan,
    ReplayAttempt,
)
from reflect_otel.replay import ReplayAdapter
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = ["BASELINES", "Baseline", "binary_search_calls"]

_log = logging.getLogger("reflect_otel.baselines")


def binary_search_calls(step_count: int) -> int:
    """The binary-search baseline's LLM calls for a trace of ``step_count`` steps."""
    return math.ceil(math.log2(step_count)) + 1 if step_count > 1 else 1


class Baseline(MethodBase):
    """A comparison method. ``attribute`` has the pipeline's signature and, like it, never raises."""

    method = "baseline"
    uses_expected = True
    needs_llm = True

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
        if not trace.steps:
            return run.record(
                status=AttributionStatus.SKIPPED,
                mode=AttributionMode.LOCALIZATION_ONLY,
                step_index=None,
                reason="the trace has no steps",
            )
        ctx = run.prompt_context(
            trace,
            expected,
            include_expected=self.config.include_expected_answer and self.uses_expected,
            domain_context=domain_context,
            config=self.config,
        )
        try:
            return self._attribute(run, trace, ctx, expected, replay)
        except LLMError as error:
            run.error(self.method, error)
            return run.record(
                status=AttributionStatus.UNVERIFIED,
                mode=AttributionMode.LOCALIZATION_ONLY,
                step_index=None,
                reason=f"{self.method} failed; see errors",
            )
        except Exception as error:
            _log.exception("%s on trace %s failed", self.method, trace.trace_id)
            run.error(self.method, error)
            return run.record(
                status=AttributionStatus.UNVERIFIED,
                mode=AttributionMode.LOCALIZATION_ONLY,
                step_index=None,
                reason=f"internal error: {error}",
            )

    def _attribute(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        expected: str | None,
        replay: ReplayAdapter | None,
    ) -> AttributionRecord:
        raise NotImplementedError

    def _replay(
        self,
        run: AttributionRun,
        replay: ReplayAdapter,
        trace: StructuredTrace,
        expected: str | None,
        *,
        rollback_point: int,
        injection: str,
        round_: int,
        localized_step: int,
    ) -> ReplayOutcome:
        """One replay and its verdict (no gate): the step REFLECT shares with every replaying baseline."""
        planned = ReplayAttempt(
            round=round_, rollback_point=rollback_point, localized_step=localized_step, injection=injection
        )
        return replay_and_verify(
            run,
            replay,
            trace,
            planned,
            expected=expected,
            injection_role=self.config.injection_role,
        )

    @staticmethod
    def _localized(
        run: AttributionRun, step: int, out: prompts.AAOOutput | prompts.ReasonOutput, reason: str = ""
    ) -> AttributionRecord:
        explanation = out.reason
        return run.record(
            status=AttributionStatus.UNVERIFIED,
            mode=AttributionMode.LOCALIZATION_ONLY,
            step_index=step,
            error_type=out.error_type,
            auditor_confidence=out.confidence,
            explanation=explanation,
            reason=reason or "a localization method: no replay evidence",
        )


def _in_range(count: int) -> Callable[[prompts.AAOOutput], str | None]:
    def check(out: prompts.AAOOutput) -> str | None:
        return None if 1 <= out.error_step <= count else f"error_step must be from 1 to {count}, got {out.error_step}"

    return check


class AllAtOnce(Baseline):
    method = "aao"

    def _attribute(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        expected: str | None,
        replay: ReplayAdapter | None,
    ) -> AttributionRecord:
        out = run.llm.complete(
            prompts.all_at_once(ctx, trace.steps), prompts.AAOOutput, stage="aao", check=_in_range(len(trace.steps))
        ).value
        return self._localized(run, out.error_step, out)


class StepByStep(Baseline):
    method = "sbs"

    def _attribute(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        expected: str | None,
        replay: ReplayAdapter | None,
    ) -> AttributionRecord:
        for step in trace.steps:
            out = run.llm.complete(
                prompts.step_check(ctx, trace.steps[: step.index]), prompts.StepCheckOutput, stage="sbs"
            ).value
            if out.is_error:
                return run.record(
                    status=AttributionStatus.UNVERIFIED,
                    mode=AttributionMode.LOCALIZATION_ONLY,
                    step_index=step.index,
                    explanation=out.reason,
                    reason="a localization method: no replay evidence",
                )
        return run.record(
            status=AttributionStatus.UNVERIFIED,
            mode=AttributionMode.LOCALIZATION_ONLY,
            step_index=len(trace.steps),
            reason="no step was flagged: the final step is the fallback",
        )


class BinarySearch(Baseline):
    method = "bs"

    def _attribute(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        expected: str | None,
        replay: ReplayAdapter | None,
    ) -> AttributionRecord:
        low, high = 1, len(trace.steps)
        while low < high:
            mid = (low + high) // 2
            out = run.llm.complete(
                prompts.bisect(ctx, trace.steps, range(low, mid + 1), range(mid + 1, high + 1)),
                prompts.BisectOutput,
                stage="bs",
            ).value
            low, high = (low, mid) if out.half == "first" else (mid + 1, high)
        reason = run.llm.complete(
            prompts.reason_for_step(ctx, trace.steps, low), prompts.ReasonOutput, stage="bs_reason"
        ).value
        return self._localized(run, low, reason)


class Reflexion(Baseline):
    """Reflect on the failed attempt, name the step the reflection blames, and, where the agent can be replayed,
    retry the task from the start with the reflection as memory (Reflexion's trial), the expected answer taken out
    of it as out of REFLECT's corrections (it would flip any retry and prove nothing). A retry that answers right
    corrects the run but verifies no step: its trajectory shares no prefix with the original, so the record stays
    unverified (correction is not attribution)."""

    method = "reflexion"

    def _attribute(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        expected: str | None,
        replay: ReplayAdapter | None,
    ) -> AttributionRecord:
        reflection = run.llm.complete(
            prompts.reflexion_reflect(ctx, trace.steps), prompts.ReflectionOutput, stage="reflect"
        ).value
        out = run.llm.complete(
            prompts.reflexion_extract(ctx, trace.steps, reflection.reflection),
            prompts.AAOOutput,
            stage="reflexion_extract",
            check=_in_range(len(trace.steps)),
        ).value
        if replay is None:
            return self._localized(run, out.error_step, out)
        outcome = self._replay(
            run,
            replay,
            trace,
            expected,
            rollback_point=0,
            injection=prompts.reflexion_memory(stages.answer_hidden(reflection.reflection, expected)),
            round_=1,
            localized_step=out.error_step,
        )
        corrected = outcome.result.final_answer if outcome.attempt.flipped and outcome.result else None
        return run.record(
            status=AttributionStatus.UNVERIFIED,
            mode=AttributionMode.REPLAY,
            step_index=out.error_step,
            error_type=out.error_type,
            auditor_confidence=out.confidence,
            explanation=out.reason,
            replays=(outcome.attempt,),
            corrected_answer=corrected,
            rounds=1,
            reason="the retry with the reflection answered right, but a retry from the start tests no step"
            if corrected is not None
            else "the retry with the reflection did not answer right",
        )


class ReflexionNoGT(Reflexion):
    method = "reflexion-nogt"
    uses_expected = False


class ICS(Baseline):
    """Untargeted resampling: localize without the expected answer, replay from the bare prefix before the
    localized step with no hint, verify; otherwise re-localize on the new trace, up to D iterations."""

    method = "ics"
    uses_expected = False

    def _attribute(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        expected: str | None,
        replay: ReplayAdapter | None,
    ) -> AttributionRecord:
        current: StructuredTrace = trace
        attempts: list[ReplayAttempt] = []
        localization: Localization | None = None
        for round_ in range(1, self.config.rounds + 1):
            ctx = run.prompt_context(  # built as for every method: evidence, layout and labels included
                current, expected, include_expected=False, domain_context=ctx.domain_context, config=self.config
            )
            localization = stages.localize(run.llm, ctx, current)
            if replay is None:
                break
            point = localization.step_index - 1  # resample the localized step itself
            outcome = self._replay(
                run,
                replay,
                current,
                expected,
                rollback_point=point,
                injection="",
                round_=round_,
                localized_step=localization.step_index,
            )
            attempts.append(outcome.attempt)
            result = outcome.result
            if result is None:
                break
            if outcome.attempt.flipped:
                return run.record(
                    status=AttributionStatus.VERIFIED,
                    mode=AttributionMode.REPLAY,
                    step_index=localization.step_index,
                    auditor_confidence=localization.confidence,
                    explanation=localization.reasoning,
                    replays=tuple(attempts),
                    corrected_answer=result.final_answer,
                    rounds=round_,
                    localizations=(localization,),
                )
            current = result.trace
        assert localization is not None
        return run.record(
            status=AttributionStatus.UNVERIFIED,
            mode=AttributionMode.REPLAY if replay else AttributionMode.LOCALIZATION_ONLY,
            step_index=min(localization.step_index, len(trace.steps)),
            auditor_confidence=localization.confidence,
            explanation=localization.reasoning,
            replays=tuple(attempts),
            rounds=len(attempts),
            reason="no resample flipped the outcome" if replay else "localization only: no replay adapter",
        )


class DoVer(Baseline):
    """Hypothesis -> intervention -> validate, without re-localization: each hypothesis's intervention is replayed
    at its step; the first that flips the outcome is the attribution, else the first hypothesis, unverified."""

    method = "dover"
    hypotheses = 3

    def _attribute(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        expected: str | None,
        replay: ReplayAdapter | None,
    ) -> AttributionRecord:
        count = len(trace.steps)

        def check(out: prompts.HypothesesOutput) -> str | None:
            bad = [h.step for h in out.hypotheses if not 1 <= h.step <= count]
            return f"every step must be from 1 to {count}; got {bad}" if bad else None

        found = run.llm.complete(
            prompts.dover_hypotheses(ctx, trace.steps, self.hypotheses),
            prompts.HypothesesOutput,
            stage="dover_hypotheses",
            check=check,
        ).value.hypotheses[: self.hypotheses]
        attempts: list[ReplayAttempt] = []
        chosen, flipped_result = found[0], None
        for hypothesis in found:
            if replay is None:
                break
            outcome = self._replay(
                run,
                replay,
                trace,
                expected,
                rollback_point=hypothesis.step - 1,
                injection=hypothesis.intervention,
                round_=1,
                localized_step=hypothesis.step,
            )
            attempts.append(outcome.attempt)
            if outcome.result is None:
                continue
            if outcome.attempt.flipped:
                chosen, flipped_result = hypothesis, outcome.result
                break
        classification = stages.classify(run.llm, ctx, trace, chosen.step)
        plan = RepairPlan(root_cause=chosen.hypothesis, correction_instruction=chosen.intervention)
        return run.record(
            status=AttributionStatus.VERIFIED if flipped_result else AttributionStatus.UNVERIFIED,
            mode=AttributionMode.REPLAY if replay else AttributionMode.LOCALIZATION_ONLY,
            step_index=chosen.step,
            error_type=classification.error_type,
            auditor_confidence=classification.confidence,
            explanation=chosen.hypothesis,
            root_cause=chosen.hypothesis,
            intervention=Intervention(plan=plan, injection=chosen.intervention, rollback_point=chosen.step - 1),
            replays=tuple(attempts),
            corrected_answer=flipped_result.final_answer if flipped_result else None,
            rounds=1,
            localizations=(
                Localization(step_index=chosen.step, confidence=classification.confidence, reasoning=chosen.hypothesis),
            ),
            reason=""
            if flipped_result
            else ("no hypothesis was supported by replay" if replay else "localization only: no replay adapter"),
        )


class _Pick(Baseline):
    """A method that picks a step without an LLM: :meth:`_pick` says which (or None) and why; one record shape."""

    needs_llm = False

    def _pick(self, trace: StructuredTrace) -> tuple[int | None, str, str]:
        """(step index or None, explanation, reason)."""
        raise NotImplementedError

    def _attribute(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        expected: str | None,
        replay: ReplayAdapter | None,
    ) -> AttributionRecord:
        step, explanation, reason = self._pick(trace)
        return run.record(
            status=AttributionStatus.UNVERIFIED,
            mode=AttributionMode.LOCALIZATION_ONLY,
            step_index=step,
            explanation=explanation,
            reason=reason,
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
    """The step of the earliest decisive evidence finding (:func:`reflect_otel.evidence.decisive`); no step when
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
