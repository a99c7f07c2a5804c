"""REFLECT (the paper's Algorithm 1): diagnose, test by targeted replay, verify and re-localize.

Given a failed trace: localize the earliest decisive error step, classify it, then for up to D rounds build a
repair plan, replay from rollback points {i, i-1, ..., max(i-K+1, 1)} (keeping steps 1..p) with the plan
injected, gate the first regenerated step, and verify. The first replay that verifies as correct makes its
rollback point the attributed step (status ``verified``) and the two continuations sharpen the explanation.
Otherwise the best candidate replay is re-localized and the next round starts. After D rounds the last
localization is returned, marked ``unverified``. A stage error is recorded and the best record reached is
returned: :meth:`ReflectPipeline.attribute` never raises.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from reflect_otel import prompts, stages
from reflect_otel._run import AttributionRun, is_correct, prompt_context
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.errors import LLMError
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.record import (
    AttributionRecord,
    AttributionStatus,
    Classification,
    FlipRate,
    GateVerdict,
    Intervention,
    Localization,
    RepairPlan,
    ReplayAttempt,
)
from reflect_otel.replay import ReplayAdapter, ReplayResult
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict
from reflect_otel.verifiers import Verifier

__all__ = ["ReflectPipeline", "rollback_points"]

_log = logging.getLogger("reflect_otel.pipeline")


def rollback_points(step_index: int, count: int) -> list[int]:
    """{i, i-1, ..., max(i-K+1, 1)}: the localized step and the K-1 before it, nearest first."""
    return list(range(step_index, max(step_index - count + 1, 1) - 1, -1))


@dataclass(slots=True)
class _Candidate:
    attempt: ReplayAttempt
    result: ReplayResult


class ReflectPipeline:
    """REFLECT on one LLM layer. ``verifier`` decides correctness: an oracle with an expected answer, or a proxy."""

    method = "reflect"

    def __init__(self, llm: StructuredLLM, *, verifier: Verifier, config: ReflectConfig | None = None) -> None:
        self.llm = llm
        self.verifier = verifier
        self.config = config or ReflectConfig()

    def attribute(
        self,
        trace: StructuredTrace,
        *,
        expected: str | None = None,
        replay: ReplayAdapter | None = None,
        domain_context: str = "",
    ) -> AttributionRecord:
        run = AttributionRun(
            self.method, self.llm, trace, self.config.model_dump(mode="json") | {"verifier": self.verifier.name}
        )
        try:
            return self._attribute(run, trace, expected, replay, domain_context)
        except Exception as error:  # the boundary: a bug or an adapter's surprise becomes a recorded outcome
            _log.exception("attribution of trace %s failed", trace.trace_id)
            run.error("pipeline", error)
            return run.record(
                status=AttributionStatus.UNVERIFIED,
                mode="replay" if replay is not None else "localization_only",
                step_index=None,
                reason=f"internal error: {error}",
            )

    # -- the algorithm -----------------------------------------------------------------------------------------
    def _attribute(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        expected: str | None,
        replay: ReplayAdapter | None,
        domain_context: str,
    ) -> AttributionRecord:
        cfg = self.config
        mode = "replay" if replay is not None else "localization_only"
        original_verdict = self.verifier.verify(trace, expected=expected)
        if is_correct(original_verdict):
            return run.record(
                status=AttributionStatus.SKIPPED,
                mode=mode,
                step_index=None,
                original_verdict=original_verdict,
                reason="the answer already verifies as correct; nothing to attribute",
            )
        if not trace.steps:
            return run.record(
                status=AttributionStatus.SKIPPED, mode=mode, step_index=None, reason="the trace has no steps"
            )

        def context(of: StructuredTrace) -> prompts.PromptContext:
            return prompt_context(
                of,
                expected,
                include_expected=cfg.include_expected_answer,
                domain_context=domain_context,
                domain_context_label=cfg.domain_context_label,
                max_chars=cfg.max_field_chars,
            )

        localizations: list[Localization] = []
        located = self._localize_and_classify(run, trace, context(trace), round_=1)
        if located is None:
            return run.record(
                status=AttributionStatus.UNVERIFIED,
                mode=mode,
                step_index=None,
                original_verdict=original_verdict,
                reason="localization failed; see errors",
            )
        localization, classification = located
        localizations.append(localization)
        base: dict[str, Any] = {"original_verdict": original_verdict}  # what every record from here carries
        if replay is None:
            return self._fallback(
                run,
                mode,
                localization,
                classification,
                localizations,
                [],
                0,
                None,
                base,
                reason="localization only: no replay adapter for this trace",
            )

        attempts: list[ReplayAttempt] = []
        flip_rates: list[FlipRate] = []
        base["flip_rates"] = flip_rates  # filled in as points are tried
        current = trace
        plan: RepairPlan | None = None
        rounds_run = 0
        for round_ in range(1, cfg.rounds + 1):
            rounds_run = round_
            plan = self._plan(run, current, context(current), localization, classification, round_)
            candidates: list[_Candidate] = []
            for point in rollback_points(localization.step_index, cfg.rollback_points):
                found = self._try_point(
                    run, current, expected, replay, plan, localization, point, round_, attempts, flip_rates
                )
                if found is None:
                    continue
                candidates.append(found)
                if self._counts(found):
                    return self._verified(
                        run,
                        current,
                        context(current),
                        found,
                        plan,
                        localization,
                        classification,
                        localizations,
                        attempts,
                        round_,
                        base,
                    )
            if not cfg.relocalize:
                continue
            best = _select_best(candidates)
            if best is None:
                break  # no replay ran at all; another round would fail the same way
            current = best.result.trace
            located = self._localize_and_classify(run, current, context(current), round_=round_ + 1)
            if located is None:
                break
            localization, classification = located
            localizations.append(localization)
        return self._fallback(
            run,
            mode,
            localization,
            classification,
            localizations,
            attempts,
            rounds_run,
            plan,
            base,
            reason=f"no replay flipped the outcome in {rounds_run} round(s)",
        )

    def _localize_and_classify(
        self, run: AttributionRun, trace: StructuredTrace, ctx: prompts.PromptContext, round_: int
    ) -> tuple[Localization, Classification | None] | None:
        try:
            localization = stages.localize(run.llm, ctx, trace)
        except LLMError as error:
            run.error("localize", error, round_)
            return None
        try:
            classification: Classification | None = stages.classify(
                run.llm, ctx, trace.steps[localization.step_index - 1]
            )
        except LLMError as error:
            run.error("classify", error, round_)
            classification = None
        return localization, classification

    def _plan(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        localization: Localization,
        classification: Classification | None,
        round_: int,
    ) -> RepairPlan:
        if not self.config.use_diagnostician:
            return stages.null_plan(localization, classification)
        try:
            return stages.diagnose(run.llm, ctx, trace, localization, classification)
        except LLMError as error:
            run.error("diagnose", error, round_)
            return stages.null_plan(localization, classification)

    def _try_point(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        expected: str | None,
        replay: ReplayAdapter,
        plan: RepairPlan,
        localization: Localization,
        point: int,
        round_: int,
        attempts: list[ReplayAttempt],
        flip_rates: list[FlipRate],
    ) -> _Candidate | None:
        """``replay_samples`` continuations from ``point``: the first that counts as a flip, else the last that ran.
        With several samples, all run, and the flip rate is recorded."""
        samples = self.config.replay_samples
        ran = [
            c
            for sample in range(samples)
            if (
                c := self._try_sample(run, trace, expected, replay, plan, localization, point, round_, attempts, sample)
            )
        ]
        flips = [c for c in ran if self._counts(c)]
        if samples > 1:
            flip_rates.append(FlipRate(round=round_, rollback_point=point, samples=samples, flips=len(flips)))
        return flips[0] if flips else (ran[-1] if ran else None)

    def _counts(self, candidate: _Candidate) -> bool:
        """A flip is evidence only when the gate let it through (hard mode) or only logs (soft, off)."""
        return is_correct(candidate.attempt.verdict) and (
            self.config.gate is not GateMode.HARD or _faithful(candidate.attempt.gate)
        )

    def _try_sample(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        expected: str | None,
        replay: ReplayAdapter,
        plan: RepairPlan,
        localization: Localization,
        point: int,
        round_: int,
        attempts: list[ReplayAttempt],
        sample: int,
    ) -> _Candidate | None:
        """Replay from ``point`` (hard gate: up to R retries with feedback). The last attempt that ran, or None."""
        cfg = self.config
        base_injection = prompts.repair_injection(plan, localization.step_index)
        injection = base_injection
        retries = cfg.gate_retries if cfg.gate is GateMode.HARD else 0
        replaced = trace.steps[point] if point < len(trace.steps) else None
        last: _Candidate | None = None
        for retry in range(retries + 1):
            try:
                result = replay.replay(
                    trace, rollback_point=point, injection=injection, injection_role=cfg.injection_role
                )
            except Exception as error:  # an adapter or the agent it runs may fail in any way
                run.error("replay", error, round_)
                attempts.append(
                    ReplayAttempt(
                        round=round_,
                        rollback_point=point,
                        gate_retry=retry,
                        injection=injection,
                        error=str(error)[:2000],
                    )
                )
                return last
            continuation = result.continuation
            gate = self._gate(run, plan, continuation[0] if continuation else None, replaced, round_)
            verdict: Verdict = self.verifier.verify(result.trace, expected=expected)
            attempt = ReplayAttempt(
                round=round_,
                rollback_point=point,
                gate_retry=retry,
                sample=sample,
                localized_step=localization.step_index,
                injection=injection,
                gate=gate,
                verdict=verdict,
                flipped=is_correct(verdict),
                final_answer=result.final_answer,
                prefix_verified=result.prefix_verified,
                continuation=continuation,
                adapter_info=result.adapter_info,
            )
            attempts.append(attempt)
            last = _Candidate(attempt, result)
            if cfg.gate is not GateMode.HARD or _faithful(gate) or retry == retries:
                return last
            first = continuation[0]
            injection = (
                base_injection
                + "\n\n"
                + prompts.gate_feedback(
                    retry + 1,
                    gate.violation_type if gate else None,
                    gate.violation_reason if gate else None,
                    first,
                    plan,
                )
            )
        return last

    def _gate(
        self,
        run: AttributionRun,
        plan: RepairPlan,
        proposed: object,
        replaced: object,
        round_: int,
    ) -> GateVerdict:
        from reflect_otel.trace import Step

        if self.config.gate is GateMode.OFF or not isinstance(proposed, Step):
            return GateVerdict(is_faithful=True, decided_by="skipped")
        ruled = stages.gate_by_rules(plan, proposed, replaced if isinstance(replaced, Step) else None)
        if ruled is not None:
            return ruled
        try:
            return stages.gate_with_llm(run.llm, plan, proposed, self.config.max_field_chars)
        except LLMError as error:
            run.error("gate", error, round_)
            return GateVerdict(is_faithful=True, violation_reason=f"gate failed: {error}", decided_by="skipped")

    def _verified(
        self,
        run: AttributionRun,
        trace: StructuredTrace,
        ctx: prompts.PromptContext,
        found: _Candidate,
        plan: RepairPlan,
        localization: Localization,
        classification: Classification | None,
        localizations: list[Localization],
        attempts: list[ReplayAttempt],
        round_: int,
        base: dict[str, Any],
    ) -> AttributionRecord:
        point = found.attempt.rollback_point
        original = trace.steps[point - 1]
        error_type = classification.error_type if classification else None
        explanation = classification.explanation if classification else localization.reasoning
        try:
            refined = stages.explain_correction(
                run.llm, ctx, original, found.result.continuation, found.result.final_answer or "", point
            )
            error_type, explanation = refined.error_type, f"{refined.explanation}\n\n{refined.reasoning}".strip()
        except LLMError as error:
            run.error("explain", error, round_)
        in_original = trace is run.trace or point <= _shared_prefix(run.trace, trace)
        return run.record(
            status=AttributionStatus.VERIFIED,
            mode="replay",
            step_index=point,
            span_id=original.span_id,
            reason=""
            if in_original
            else "the flipping rollback point lies in a replayed continuation of round "
            f"{round_ - 1}; step_index counts steps of that replay",
            error_type=error_type,
            confidence=localization.confidence,
            explanation=explanation,
            root_cause=plan.root_cause,
            intervention=Intervention(plan=plan, injection=found.attempt.injection, rollback_point=point),
            replays=tuple(attempts),
            corrected_answer=found.result.final_answer,
            rounds=round_,
            localizations=tuple(localizations),
            **base,
        )

    def _fallback(
        self,
        run: AttributionRun,
        mode: str,
        localization: Localization,
        classification: Classification | None,
        localizations: list[Localization],
        attempts: list[ReplayAttempt],
        rounds: int,
        plan: RepairPlan | None,
        base: dict[str, Any],
        *,
        reason: str,
    ) -> AttributionRecord:
        step = min(localization.step_index, len(run.trace.steps))
        return run.record(
            status=AttributionStatus.UNVERIFIED,
            mode=mode,
            step_index=step,
            reason=reason,
            error_type=classification.error_type if classification else None,
            confidence=localization.confidence,
            explanation=classification.explanation if classification else localization.reasoning,
            root_cause=plan.root_cause if plan else "",
            replays=tuple(attempts),
            rounds=rounds,
            localizations=tuple(localizations),
            **base,
        )


def _faithful(gate: GateVerdict | None) -> bool:
    return gate is None or gate.is_faithful


def _select_best(candidates: list[_Candidate]) -> _Candidate | None:
    """The candidate to re-localize on: faithful first, then the proxy's best score, then the longest kept prefix."""
    if not candidates:
        return None
    return max(
        candidates,
        key=lambda c: (
            _faithful(c.attempt.gate),
            c.attempt.verdict.score or 0.0 if c.attempt.verdict else 0.0,
            c.attempt.rollback_point,
        ),
    )


def _shared_prefix(original: StructuredTrace, replayed: StructuredTrace) -> int:
    count = 0
    for a, b in zip(original.steps, replayed.steps, strict=False):
        if a != b:
            break
        count += 1
    return count
