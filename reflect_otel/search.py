"""The localize-replay-verify loop every replaying method shares; what differs between methods is a policy.

For up to D rounds, the policy diagnoses the run (localizes the decisive step, and whatever else it needs) and names
the trials to test, cheapest first; :class:`~reflect_otel.controlled_replay.ControlledReplay` tests each under the
control rule, all out of one replay budget; the first verified trial ends the search. A later round is told which
steps were tested and what came of it, and names another. Each round is an immutable :class:`Round`; the record is
built once, from the rounds, by :func:`record_of`.

REFLECT (:mod:`reflect_otel.pipeline`), its faithfulness controls (:mod:`reflect_otel.controls`), bare resampling
(ICS) and DoVer (:mod:`reflect_otel.baselines`) are policies of this one loop, so they get the same inputs, the same
budget and the same control rule.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from reflect_otel import prompts, stages
from reflect_otel._run import AttributionRun, is_correct
from reflect_otel.config import ReflectConfig
from reflect_otel.controlled_replay import ControlledReplay
from reflect_otel.corrections import Rule
from reflect_otel.errors import LLMError
from reflect_otel.record import (
    AttributionMode,
    AttributionRecord,
    AttributionStatus,
    Classification,
    Correction,
    ErrorType,
    GateDecider,
    GateVerdict,
    Intervention,
    Localization,
    RepairPlan,
)
from reflect_otel.replay import ReplayAdapter, agent_rules, pure_tools, resampler
from reflect_otel.trace import Step, StructuredTrace
from reflect_otel.trial import Decision, GateFn, Trial, TrialResult
from reflect_otel.verdict import Verdict
from reflect_otel.verifiers import bound_to_original, bound_to_runs, unprovable_by

__all__ = [
    "Diagnosis",
    "Explanation",
    "Round",
    "SearchContext",
    "SearchPolicy",
    "faithfulness_gate",
    "localized_steps",
    "record_of",
    "search",
    "tested_steps",
]

_log = logging.getLogger("reflect_otel.search")


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What a policy concluded in one round: the step it localized (with its classification and repair plan, when
    it makes them), the trials to test in order, and corrections it considered and refused."""

    localization: Localization
    classification: Classification | None = None
    plan: RepairPlan | None = None
    trials: tuple[Trial, ...] = ()
    refused: tuple[Correction, ...] = ()
    note: str = ""
    """Why there is nothing to test, when there is not."""


@dataclass(frozen=True, slots=True)
class Round:
    """One round: the diagnosis and what testing its trials established."""

    number: int
    diagnosis: Diagnosis
    results: tuple[TrialResult, ...] = ()

    @property
    def verified(self) -> TrialResult | None:
        return next((r for r in self.results if r.decision is Decision.VERIFIED), None)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why the verified step was wrong, as the policy explains it from the correction's continuation."""

    error_type: ErrorType | None
    text: str


@dataclass(frozen=True)
class SearchContext:
    """What a policy may read for one failed run: the run (its LLM, verifier and log), what the agent was given,
    the expected answer (None in the proxy regime), the settings, and the run's verdict."""

    run: AttributionRun
    expected: str | None
    domain_context: str
    config: ReflectConfig
    verdict: Verdict
    replayable: bool
    correction_rules: tuple[Rule, ...] = ()
    """The agent's own evidence rules, from its replay adapter (:func:`reflect_otel.replay.agent_rules`)."""
    pure_tools: frozenset[str] = frozenset()
    """The agent's tools its adapter declares pure (:func:`reflect_otel.replay.pure_tools`)."""

    @property
    def trace(self) -> StructuredTrace:
        return self.run.trace

    def prompt_context(self, *, show_expected: bool) -> prompts.PromptContext:
        return self.run.prompt_context(
            self.trace,
            self.expected,
            include_expected=show_expected and self.config.include_expected_answer,
            domain_context=self.domain_context,
            config=self.config,
        )


class SearchPolicy(Protocol):
    """A method's choices in the shared loop.

    ``diagnose(ctx, rounds)`` returns this round's :class:`Diagnosis` (None when there is nothing more to try); it
    may call the LLM through ``ctx.run.llm`` and raises :class:`~reflect_otel.errors.LLMError` when a stage it
    cannot do without fails (the loop records it and stops). ``gate(ctx)`` is the faithfulness gate for guidance
    trials (None: no gate, so a guidance flip never verifies). ``explain`` says why a verified step was wrong (None:
    the diagnosis's own words)."""

    def diagnose(self, ctx: SearchContext, rounds: Sequence[Round]) -> Diagnosis | None: ...

    def gate(self, ctx: SearchContext) -> GateFn | None: ...

    def explain(self, ctx: SearchContext, round_: Round, verified: TrialResult) -> Explanation | None: ...


def search(
    run: AttributionRun,
    policy: SearchPolicy,
    *,
    expected: str | None,
    replay: ReplayAdapter | None,
    domain_context: str,
    config: ReflectConfig,
) -> AttributionRecord:
    """The loop (see the module). Raises only for bugs; the method's boundary turns them into a record."""
    mode = AttributionMode.REPLAY if replay is not None else AttributionMode.LOCALIZATION_ONLY
    if replay is not None and run.original_verdict is None:  # a consistency check of the run resamples its agent
        run.verifier = bound_to_runs(run.verifier, resampler(replay))
    verdict = run.original_verdict or run.verifier.verify(run.trace, expected=expected)
    run.original_verdict = verdict  # its consistency check, if any, is localization evidence (see AttributionRun)
    run.verifier = bound_to_original(run.verifier, run.trace, verdict)  # the proxy regime judges replays by it
    unprovable = unprovable_by(run.verifier)
    if replay is not None and unprovable is not None:  # no replay could verify: none is spent
        replay, mode = None, AttributionMode.LOCALIZATION_ONLY
    if is_correct(verdict):
        return run.record(
            status=AttributionStatus.SKIPPED,
            mode=mode,
            step_index=None,
            original_verdict=verdict,
            reason="the answer already verifies as correct; nothing to attribute",
        )
    if not run.trace.steps:
        return run.record(status=AttributionStatus.SKIPPED, mode=mode, step_index=None, reason="the trace has no steps")
    ctx = SearchContext(
        run, expected, domain_context, config, verdict, replay is not None, agent_rules(replay), pure_tools(replay)
    )
    engine = ControlledReplay(run, replay, expected=expected, config=config, gate=policy.gate(ctx)) if replay else None
    rounds: list[Round] = []
    for number in range(1, config.rounds + 1):
        try:
            diagnosis = policy.diagnose(ctx, rounds)
        except LLMError as error:
            run.error("localize" if not rounds else "relocalize", error, number)
            break
        if diagnosis is None:
            break
        kind = f" ({diagnosis.classification.error_type.value})" if diagnosis.classification else ""
        _progress(run, "round %d: step %d localized%s", number, diagnosis.localization.step_index, kind)
        if engine is None:
            rounds.append(Round(number, diagnosis))
            break
        results = _test(engine, diagnosis, run)
        rounds.append(Round(number, diagnosis, results))
        if rounds[-1].verified is not None or (engine.remaining is not None and engine.remaining <= 0):
            break
    return record_of(ctx, policy, rounds, engine, mode, no_replay=unprovable)


def _test(engine: ControlledReplay, diagnosis: Diagnosis, run: AttributionRun) -> tuple[TrialResult, ...]:
    results = []
    for trial in diagnosis.trials:
        _progress(run, "testing %s", _describe(trial))
        result = engine.test(trial)
        _progress(
            run, "%s: %s%s", _describe(trial), result.decision.value, f" ({result.reason})" if result.reason else ""
        )
        results.append(result)
        if result.decision is Decision.VERIFIED:
            break
    return tuple(results)


def record_of(
    ctx: SearchContext,
    policy: SearchPolicy,
    rounds: Sequence[Round],
    engine: ControlledReplay | None,
    mode: AttributionMode,
    *,
    no_replay: str | None = None,
) -> AttributionRecord:
    """The record of a search, built once from its rounds: verified (the first verified trial), not attributable
    (the first flip its control explained), or unverified (the last localization, a hypothesis). ``no_replay``: why
    a run with a replay adapter was not replayed."""
    run = ctx.run
    replays = engine.replays if engine else ()
    fidelity = engine.fidelity if engine else None
    if not rounds:
        return run.record(
            status=AttributionStatus.UNVERIFIED,
            mode=mode,
            step_index=None,
            original_verdict=ctx.verdict,
            reason="localization failed; see errors",
            replays=replays,
            fidelity=fidelity,
        )
    last = rounds[-1]
    diagnosis = last.diagnosis
    results = [r for round_ in rounds for r in round_.results]
    verified = last.verified
    explained = policy.explain(ctx, last, verified) if verified is not None else None
    flip = next((r for r in results if r.decision is Decision.NOT_ATTRIBUTABLE), None)
    if verified is not None:
        status, decided, step, reason = AttributionStatus.VERIFIED, verified, verified.trial.step, ""
    elif flip is not None:
        status, decided = AttributionStatus.NOT_ATTRIBUTABLE, flip
        step, reason = (
            min(diagnosis.localization.step_index, len(run.trace.steps)),
            f"step {flip.trial.step}: {flip.reason}",
        )
    else:
        status, decided = AttributionStatus.UNVERIFIED, None
        step = min(diagnosis.localization.step_index, len(run.trace.steps))
        reason = _unverified_reason(rounds, results, engine, diagnosis.note, no_replay)
    classification = diagnosis.classification
    return run.record(
        status=status,
        mode=mode,
        step_index=step,
        reason=reason,
        error_type=explained.error_type if explained else (classification.error_type if classification else None),
        auditor_confidence=diagnosis.localization.confidence,
        explanation=explained.text
        if explained
        else (classification.explanation if classification else diagnosis.localization.reasoning),
        root_cause=diagnosis.plan.root_cause if diagnosis.plan else "",
        intervention=_intervention(verified, diagnosis),
        replays=replays,
        corrections=[c for round_ in rounds for c in (*round_.diagnosis.refused, *_corrections(round_))],
        effect=decided.effect if decided is not None else None,
        fidelity=fidelity,
        corrected_answer=verified.deciding.final_answer if verified is not None and verified.deciding else None,
        original_verdict=ctx.verdict,
        rounds=len(rounds),
        localizations=[round_.diagnosis.localization for round_ in rounds],
    )


def _intervention(verified: TrialResult | None, diagnosis: Diagnosis) -> Intervention | None:
    """What verified the record: the plan, the text given, the rollback point and the correction replayed."""
    if verified is None or verified.deciding is None:
        return None
    return Intervention(
        plan=verified.trial.plan or diagnosis.plan or RepairPlan(),
        injection=verified.trial.injection,
        rollback_point=verified.trial.step - 1,
        correction=verified.deciding.correction,
    )


def _corrections(round_: Round) -> list[Correction]:
    out = []
    for result in round_.results:
        out += list(result.corrections) or [result.trial.correction]
    return out


def _unverified_reason(
    rounds: Sequence[Round],
    results: Sequence[TrialResult],
    engine: ControlledReplay | None,
    note: str,
    no_replay: str | None,
) -> str:
    if engine is None:
        return f"localization only: {no_replay or 'no replay adapter for this trace'}"
    if not results:
        return f"nothing could be tested: {note or 'no correction survived the checks'}"
    idle = "".join(
        f"; round {r.number} tested nothing ({r.diagnosis.note})" for r in rounds if not r.results and r.diagnosis.note
    )
    decisions = {r.decision for r in results}
    if decisions <= {Decision.NOT_TESTED}:
        notes = "; ".join(dict.fromkeys(r.reason for r in results if r.reason))
        return f"nothing was proved: {notes}{idle}"
    return f"no intervention flipped the outcome under control in {len(rounds)} round(s){idle}"


def tested_steps(rounds: Sequence[Round]) -> dict[int, str]:
    """Steps earlier rounds tested, with what came of it (shown to the next localization; not tested again)."""
    out: dict[int, str] = {}
    for round_ in rounds:
        for result in round_.results:
            out.setdefault(result.trial.step, f"{result.decision.value.replace('_', ' ')}: {result.reason}"[:200])
    return out


def localized_steps(rounds: Sequence[Round]) -> set[int]:
    """Steps earlier rounds localized: a later round must name another."""
    return {round_.diagnosis.localization.step_index for round_ in rounds}


def faithfulness_gate(ctx: SearchContext) -> GateFn:
    """The paper's gate on a new step made under a plan: the cheap rules first (expected tool, forbidden action,
    the original step repeated), else the LLM gate. A gate that fails judges nothing, and an unjudged step cannot
    verify."""
    prompt = ctx.prompt_context(show_expected=True)

    def judge(plan: RepairPlan, proposed: Step, replaced: Step) -> GateVerdict:
        ruled = stages.gate_by_rules(plan, proposed, replaced)
        if ruled is not None:
            return ruled
        try:
            return stages.gate_with_llm(ctx.run.llm, prompt, ctx.trace, plan, proposed)
        except LLMError as error:
            ctx.run.error("gate", error)
            return GateVerdict(
                is_faithful=False, violation_reason=f"gate failed: {error}", decided_by=GateDecider.SKIPPED
            )

    return judge


def _describe(trial: Trial) -> str:
    correction = trial.correction
    if correction.replacement is not None and trial.is_action:
        return f"action ({correction.source}) at step {trial.step}: {correction.replacement.render()[:160]}"
    what = "guidance" if trial.injection else "resampling"
    return f"{what} ({correction.source}) at step {trial.step}"


def _progress(run: AttributionRun, message: str, *args: object) -> None:
    """A progress line for whoever shows it (``reflect-otel demo`` prints them): attributions take minutes on a
    CPU. The trace id rides along as ``record.reflect_trace_id``."""
    _log.info(message, *args, extra={"reflect_trace_id": run.trace.trace_id})
