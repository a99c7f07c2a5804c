"""REFLECT (the paper's Algorithm 1): diagnose, test by targeted replay, verify and re-localize.

Given a failed trace: localize the earliest decisive error step i, classify it, then for up to D rounds build a
repair plan and test its corrections, cheapest first, stopping at the first that verifies:

- *actions* (up to M): the auditor's corrected step (a call of one of the agent's own tools) and the corrections
  the evidence rules read from the trace (:mod:`reflect_otel.corrections`), each executed by the replay adapter in
  place of the step it names, p, with steps 1..p-1 kept; faithful by construction (checked);
- *guidance* (the paper's): for each candidate step p in {i, i-1, ..., max(i-K+1, 1)}, replay with the prefix
  before p kept (steps 1..p-1, the paper's tau_<p) and the plan injected where step p was, gate the regenerated
  step p against the plan.

The first replay that verifies as correct makes its step p the attributed step (status ``verified``): the kept
prefix was not at fault, and redoing step p as corrected fixed the run. The two continuations then sharpen the
explanation.
Otherwise the best candidate replay is re-localized and the next round starts. After D rounds the last
localization is returned, marked ``unverified``. A stage error is recorded and the best record reached is
returned: :meth:`ReflectPipeline.attribute` never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from reflect_otel import corrections, prompts, stages
from reflect_otel._run import AttributionRun, MethodBase, ReplayOutcome, is_correct, replay_and_verify
from reflect_otel.config import GateMode
from reflect_otel.errors import LLMError
from reflect_otel.record import (
    AttributionMode,
    AttributionRecord,
    AttributionStatus,
    Classification,
    Correction,
    FlipRate,
    GateDecider,
    GateVerdict,
    Intervention,
    InterventionKind,
    Localization,
    RepairPlan,
    ReplayAttempt,
)
from reflect_otel.replay import ReplayAdapter, ReplayResult
from reflect_otel.tool_definitions import available_tools
from reflect_otel.trace import Step, StepAction, StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = ["ReflectPipeline", "RoundState", "rollback_points"]

_log = logging.getLogger("reflect_otel.pipeline")


def rollback_points(step_index: int, count: int) -> list[int]:
    """{i, i-1, ..., max(i-K+1, 1)}: the steps to regenerate, the localized one and the K-1 before it, nearest
    first. Replaying at step p keeps steps 1..p-1 (the adapter's ``rollback_point`` is p-1)."""
    return list(range(step_index, max(step_index - count + 1, 1) - 1, -1))


_T = TypeVar("_T")
_R = TypeVar("_R")


def _in_order(work: Callable[[_T], _R], items: Sequence[_T], concurrency: int) -> Iterator[_R]:
    """``work`` over ``items``, results in the order of ``items``; up to ``concurrency`` at once. A consumer that
    stops early leaves the ones started to finish (their results are dropped), and the rest unstarted."""
    if concurrency <= 1 or len(items) <= 1:
        yield from (work(item) for item in items)
        return
    with ThreadPoolExecutor(max_workers=min(concurrency, len(items)), thread_name_prefix="reflect-replay") as pool:
        futures = [pool.submit(work, item) for item in items]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()


@dataclass(slots=True)
class _Candidate:
    """A replay that ran: how it was recorded, and what it produced."""

    attempt: ReplayAttempt
    result: ReplayResult


@dataclass(slots=True)
class _Tried:
    """What replaying one rollback point produced: the candidate it offers (the first flip, else the last replay
    that ran), every attempt in order, and the flip rate when it took several samples. Built apart from the round's
    state, so that points can run concurrently; the round merges them in window order."""

    candidate: _Candidate | None
    attempts: list[ReplayAttempt]
    flip_rate: FlipRate | None = None


@dataclass
class RoundState:
    """What travels through REFLECT's rounds for one trace: the run, the trace being worked on (the original, then
    the replay chosen for re-localization), the current localization and plan, and everything tried so far."""

    run: AttributionRun
    expected: str | None
    replay: ReplayAdapter | None
    domain_context: str
    original_verdict: Verdict | None = None
    current: StructuredTrace = field(init=False)
    round: int = 0
    localization: Localization | None = None
    classification: Classification | None = None
    plan: RepairPlan | None = None
    localizations: list[Localization] = field(default_factory=list)
    attempts: list[ReplayAttempt] = field(default_factory=list)
    flip_rates: list[FlipRate] = field(default_factory=list)
    candidates: list[Correction] = field(default_factory=list)
    """The evidence rules' corrections for the current trace (shown to the diagnosis, then tried)."""
    corrections: list[Correction] = field(default_factory=list)
    """Every correction considered so far, with its replays and whether it flipped."""

    def __post_init__(self) -> None:
        self.current = self.run.trace

    @property
    def mode(self) -> AttributionMode:
        return AttributionMode.REPLAY if self.replay is not None else AttributionMode.LOCALIZATION_ONLY

    @property
    def located(self) -> Localization:
        assert self.localization is not None, "localize first"
        return self.localization


class ReflectPipeline(MethodBase):
    """REFLECT on one LLM layer. ``verifier`` decides correctness: an oracle with an expected answer, or a proxy.

    Two steps of a round are hooks for variants that change one thing (the faithfulness controls in
    :mod:`reflect_otel.controls`): ``_plan(state)`` writes the round's repair plan, and
    ``_round_corrections(state)`` turns it into the corrections to replay, in order."""

    method = "reflect"

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
        state = RoundState(run, expected, replay, domain_context)
        try:
            return self._attribute(state)
        except Exception as error:  # the boundary: a bug or an adapter's surprise becomes a recorded outcome
            _log.exception("attribution of trace %s failed", trace.trace_id)
            run.error("pipeline", error)
            return run.record(
                status=AttributionStatus.UNVERIFIED,
                mode=state.mode,
                step_index=None,
                reason=f"internal error: {error}",
            )

    # -- the algorithm -----------------------------------------------------------------------------------------
    def _attribute(self, state: RoundState) -> AttributionRecord:
        cfg, run, trace = self.config, state.run, state.run.trace
        state.original_verdict = run.original_verdict or run.verifier.verify(trace, expected=state.expected)
        if is_correct(state.original_verdict):
            return run.record(
                status=AttributionStatus.SKIPPED,
                mode=state.mode,
                step_index=None,
                original_verdict=state.original_verdict,
                reason="the answer already verifies as correct; nothing to attribute",
            )
        if not trace.steps:
            return run.record(
                status=AttributionStatus.SKIPPED, mode=state.mode, step_index=None, reason="the trace has no steps"
            )
        if not self._localize_and_classify(state):
            return run.record(
                status=AttributionStatus.UNVERIFIED,
                mode=state.mode,
                step_index=None,
                original_verdict=state.original_verdict,
                reason="localization failed; see errors",
            )
        if state.replay is None:
            return self._fallback(state, reason="localization only: no replay adapter for this trace")
        for round_ in range(1, cfg.rounds + 1):
            state.round = round_
            state.plan = self._plan(state)
            candidates: list[_Candidate] = []
            for correction in self._round_corrections(state):
                found = self._test(state, correction, candidates)
                if found is not None:
                    return self._verified(state, found)
            if not cfg.relocalize or round_ == cfg.rounds:
                continue  # after the last round a new localization would name a step of a replay, not of the run
            best = _select_best(candidates)
            if best is None:
                break  # no replay ran at all; another round would fail the same way
            state.current = best.result.trace
            if not self._localize_and_classify(state):
                break
        return self._fallback(state, reason=f"no replay flipped the outcome in {state.round} round(s)")

    def _context(self, state: RoundState) -> prompts.PromptContext:
        return state.run.prompt_context(
            state.current,
            state.expected,
            include_expected=self.config.include_expected_answer,
            domain_context=state.domain_context,
            config=self.config,
        )

    def _localize_and_classify(self, state: RoundState) -> bool:
        """Localize (and classify) the current trace; False when localization failed (recorded)."""
        run, ctx, round_ = state.run, self._context(state), state.round + 1
        try:
            localization = stages.localize(run.llm, ctx, state.current)
        except LLMError as error:
            run.error("localize", error, round_)
            return False
        try:
            classification: Classification | None = stages.classify(
                run.llm, ctx, state.current, localization.step_index
            )
        except LLMError as error:
            run.error("classify", error, round_)
            classification = None
        state.localization, state.classification = localization, classification
        state.localizations.append(localization)
        kind = f" ({classification.error_type.value})" if classification else ""
        _progress(state, "round %d: step %d localized%s", round_, localization.step_index, kind)
        return True

    def _plan(self, state: RoundState) -> RepairPlan:
        cfg = self.config
        state.candidates = (
            corrections.evidence_corrections(state.current, near=state.located.step_index, context=state.domain_context)
            if cfg.actions
            else []
        )
        plan = stages.null_plan(state.located, state.classification)
        if cfg.use_diagnostician:
            try:
                plan = stages.diagnose(
                    state.run.llm,
                    self._context(state),
                    state.current,
                    state.located,
                    state.classification,
                    tools=available_tools(state.current) if cfg.actions else (),
                    candidates=state.candidates[: cfg.max_corrections],
                    corrected_step=cfg.actions,
                )
            except LLMError as error:
                state.run.error("diagnose", error, state.round)
        hidden = stages.without_answer(plan, state.expected)
        if hidden != plan:
            _progress(state, "round %d: the plan stated the expected answer; the replay is not shown it", state.round)
        return hidden

    def _round_corrections(self, state: RoundState) -> list[Correction]:
        """This round's corrections in the order to try them: the auditor's action, the evidence rules' actions
        (at most M actions in all), then the plan as guidance; deduplicated, and those that would prove nothing
        refused (kept in the record with the reason, never tried)."""
        plan, located = state.plan, state.located.step_index
        assert plan is not None, "plan first"
        steps = state.current.steps
        original = StepAction.of_step(steps[located - 1]) if 1 <= located <= len(steps) else None
        proposed: list[Correction] = []
        if plan.corrected_step is not None and self.config.actions:
            proposed.append(
                Correction(
                    source="llm",
                    kind=InterventionKind.ACTION,
                    step_index=located,
                    original=original,
                    replacement=plan.corrected_step,
                    finding="the auditor's corrected step",
                )
            )
        proposed += state.candidates
        proposed.append(
            Correction(
                source="llm" if self.config.use_diagnostician else "localizer",
                kind=InterventionKind.GUIDANCE,
                step_index=located,
                original=original,
                finding=plan.correction_instruction,
            )
        )
        ordered = corrections.ordered(proposed, state.current, state.expected, self.config.max_corrections)
        for correction in ordered:
            if correction.refused:
                _progress(state, "round %d: not trying %s: %s", state.round, _describe(correction), correction.refused)
        state.corrections += ordered
        return [c for c in ordered if c.refused is None]

    def _test(self, state: RoundState, correction: Correction, candidates: list[_Candidate]) -> _Candidate | None:
        """Replay ``correction`` (an action at its step; guidance at the K rollback points) until one replay counts
        as a flip, which it returns; every replay that ran joins ``candidates``, every attempt the state."""
        cfg = self.config
        _progress(state, "round %d: trying %s", state.round, _describe(correction))
        is_action = correction.kind is InterventionKind.ACTION
        points = [correction.step_index] if is_action else rollback_points(correction.step_index, cfg.rollback_points)
        position = next(i for i, c in enumerate(state.corrections) if c is correction)
        flipped: _Candidate | None = None
        replays = 0
        for tried in _in_order(lambda p: self._try_point(state, p, correction), points, cfg.replay_concurrency):
            state.attempts += tried.attempts
            replays += len(tried.attempts)
            if tried.flip_rate is not None:
                state.flip_rates.append(tried.flip_rate)
            if tried.candidate is None:
                continue
            candidates.append(tried.candidate)
            if self._counts(tried.candidate):
                flipped = tried.candidate
                break
        state.corrections[position] = correction.model_copy(update={"replays": replays, "flipped": flipped is not None})
        if flipped is None:
            return None
        tested = flipped.attempt.correction or correction
        attempt = flipped.attempt.model_copy(
            update={"correction": tested.model_copy(update={"replays": replays, "flipped": True})}
        )
        return _Candidate(attempt, flipped.result)

    def _try_point(self, state: RoundState, step: int, correction: Correction) -> _Tried:
        """``replay_samples`` replays that regenerate ``step`` with ``correction``: the first that counts as a flip,
        else the last that ran. With several samples, all run (concurrently up to ``replay_concurrency``), and the
        flip rate is kept. Reads the round's state, never writes it."""
        samples = self.config.replay_samples
        outcomes = list(
            _in_order(
                lambda s: self._try_sample(state, step, s, correction), range(samples), self.config.replay_concurrency
            )
        )
        attempts = [attempt for _, tried in outcomes for attempt in tried]
        ran = [candidate for candidate, _ in outcomes if candidate is not None]
        flips = [c for c in ran if self._counts(c)]
        rate = (
            FlipRate(round=state.round, rollback_point=step - 1, samples=samples, flips=len(flips))
            if samples > 1
            else None
        )
        return _Tried(flips[0] if flips else (ran[-1] if ran else None), attempts, rate)

    def _counts(self, candidate: _Candidate) -> bool:
        """A flip is evidence only when the gate let it through (hard mode) or only logs (soft, off)."""
        return is_correct(candidate.attempt.verdict) and (
            self.config.gate is not GateMode.HARD or _faithful(candidate.attempt.gate)
        )

    def _try_sample(
        self, state: RoundState, step: int, sample: int, correction: Correction
    ) -> tuple[_Candidate | None, list[ReplayAttempt]]:
        """Replay regenerating ``step`` with ``correction`` (guidance under a hard gate: up to R retries with
        feedback): the last attempt that ran (or None), and every attempt made."""
        cfg, plan, current = self.config, state.plan, state.current
        assert plan is not None, "plan first"
        located = state.located.step_index
        action = correction.replacement if correction.kind is InterventionKind.ACTION else None
        failed = current.steps[located - 1] if 1 <= located <= len(current.steps) else None
        base_injection = (
            "" if action is not None else prompts.repair_injection(plan, located, failed, cfg.max_field_chars)
        )
        injection = base_injection
        retries = cfg.gate_retries if cfg.gate is GateMode.HARD and action is None else 0
        point = step - 1  # the kept prefix
        replaced = current.steps[point]  # the original step the replay regenerates
        last: _Candidate | None = None
        attempts: list[ReplayAttempt] = []
        for retry in range(retries + 1):
            planned = ReplayAttempt(
                round=state.round,
                rollback_point=point,
                gate_retry=retry,
                sample=sample,
                localized_step=state.located.step_index,
                injection=injection,
                correction=correction
                if action is not None  # guidance regenerates ``step``, not always the localized one
                else correction.model_copy(update={"step_index": step, "original": StepAction.of_step(replaced)}),
            )
            outcome: ReplayOutcome = replay_and_verify(
                state.run,
                state.replay,  # type: ignore[arg-type]  # only called with a replay adapter
                current,
                planned,
                expected=state.expected,
                injection_role=cfg.injection_role,
                action=action,
                gate=(
                    (lambda result: _gate_action(result, action))
                    if action is not None
                    else (lambda result: self._gate(state, result, replaced))
                ),
            )
            attempts.append(outcome.attempt)
            _progress(state, "replay regenerating step %d: %s", step, _outcome(outcome.attempt))
            if outcome.result is None:
                return last, attempts
            last = _Candidate(outcome.attempt, outcome.result)
            gate = outcome.attempt.gate
            if cfg.gate is not GateMode.HARD or _faithful(gate) or retry == retries:
                return last, attempts
            feedback = prompts.gate_feedback(
                retry + 1,
                gate.violation_type if gate else None,
                gate.violation_reason if gate else None,
                outcome.result.continuation[0],
                plan,
            )
            injection = f"{base_injection}\n\n{feedback}"
        return last, attempts

    def _gate(self, state: RoundState, result: ReplayResult, replaced: Step | None) -> GateVerdict:
        continuation = result.continuation
        if self.config.gate is GateMode.OFF or not continuation:
            return GateVerdict(is_faithful=True, decided_by=GateDecider.SKIPPED)
        assert state.plan is not None
        ruled = stages.gate_by_rules(state.plan, continuation[0], replaced)
        if ruled is not None:
            return ruled
        try:
            return stages.gate_with_llm(state.run.llm, self._context(state), state.current, state.plan, continuation[0])
        except LLMError as error:
            state.run.error("gate", error, state.round)
            return GateVerdict(
                is_faithful=True, violation_reason=f"gate failed: {error}", decided_by=GateDecider.SKIPPED
            )

    def _verified(self, state: RoundState, found: _Candidate) -> AttributionRecord:
        run, trace, plan, localization = state.run, state.current, state.plan, state.located
        assert plan is not None
        kept = found.attempt.rollback_point
        point = kept + 1  # the regenerated step: the attributed one
        original = trace.steps[point - 1]
        error_type = state.classification.error_type if state.classification else None
        explanation = state.classification.explanation if state.classification else localization.reasoning
        try:
            refined = stages.explain_correction(
                run.llm,
                self._context(state),
                trace,
                original,
                found.result.continuation,
                found.result.final_answer or "",
                point,
            )
            error_type, explanation = refined.error_type, f"{refined.explanation}\n\n{refined.reasoning}".strip()
        except LLMError as error:
            run.error("explain", error, state.round)
        in_original = trace is run.trace or point <= _shared_prefix(run.trace, trace)
        return run.record(
            status=AttributionStatus.VERIFIED,
            mode=AttributionMode.REPLAY,
            step_index=point,
            span_id=original.span_id,
            reason=""
            if in_original
            else "the flipping rollback point lies in a replayed continuation of round "
            f"{state.round - 1}; step_index counts steps of that replay",
            error_type=error_type,
            auditor_confidence=localization.confidence,
            explanation=explanation,
            root_cause=plan.root_cause,
            intervention=Intervention(
                plan=plan, injection=found.attempt.injection, rollback_point=kept, correction=found.attempt.correction
            ),
            replays=state.attempts,
            corrections=state.corrections,
            flip_rates=state.flip_rates,
            corrected_answer=found.result.final_answer,
            original_verdict=state.original_verdict,
            rounds=state.round,
            localizations=state.localizations,
        )

    def _fallback(self, state: RoundState, *, reason: str) -> AttributionRecord:
        localization, classification = state.located, state.classification
        return state.run.record(
            status=AttributionStatus.UNVERIFIED,
            mode=state.mode,
            step_index=min(localization.step_index, len(state.run.trace.steps)),
            reason=reason,
            error_type=classification.error_type if classification else None,
            auditor_confidence=localization.confidence,
            explanation=classification.explanation if classification else localization.reasoning,
            root_cause=state.plan.root_cause if state.plan else "",
            replays=state.attempts,
            corrections=state.corrections,
            flip_rates=state.flip_rates,
            original_verdict=state.original_verdict,
            rounds=state.round,
            localizations=state.localizations,
        )


def _progress(state: RoundState, message: str, *args: object) -> None:
    """A progress line for whoever shows it (``reflect-otel demo`` prints them): attributions take minutes on a
    CPU. The trace id rides along as ``record.reflect_trace_id``."""
    _log.info(message, *args, extra={"reflect_trace_id": state.run.trace.trace_id})


def _describe(correction: Correction) -> str:
    if correction.kind is InterventionKind.GUIDANCE:
        return f"guidance ({correction.source}) around step {correction.step_index}"
    replacement = correction.replacement.render() if correction.replacement else ""
    return f"action ({correction.source}) at step {correction.step_index}: {replacement[:160]}"


def _gate_action(result: ReplayResult, action: StepAction) -> GateVerdict:
    """An action replay is faithful by construction when the adapter did execute the action as the first
    regenerated step; checked, since an adapter is someone else's code."""
    first = result.continuation[0] if result.continuation else None
    done = first is not None and (
        (first.tool_name, first.tool_args) == (action.tool_name, action.arguments)
        if action.tool_name is not None
        else first.reasoning.strip() == action.text.strip()
    )
    if done:
        return GateVerdict(is_faithful=True, decided_by=GateDecider.ACTION)
    return GateVerdict(
        is_faithful=False,
        violation_type="ignores_instruction",
        violation_reason="the replay's first regenerated step is not the action the adapter was given",
        decided_by=GateDecider.ACTION,
    )


def _outcome(attempt: ReplayAttempt) -> str:
    if attempt.error:
        return f"failed ({attempt.error})"
    verdict = "right" if attempt.verdict is not None and is_correct(attempt.verdict) else "still wrong"
    gate = "" if attempt.gate is None or attempt.gate.is_faithful else f", gate: {attempt.gate.violation_type}"
    return f"answered {(attempt.final_answer or '')[:120]!r}, {verdict}{gate}"


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
