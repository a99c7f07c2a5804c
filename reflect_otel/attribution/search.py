"""The localize-replay-verify loop every replaying method shares; what differs between methods is a policy.

For up to D rounds, the policy diagnoses the run (localizes the decisive step, and whatever else it needs) and names
the trials to test, cheapest first; :class:`~reflect_otel.attribution.controlled_replay.ControlledReplay` tests each under the
control rule, all out of one replay budget; the first verified trial ends the search. A later round is told which
steps were tested and what came of it, and names another. Each round is an immutable :class:`Round`; the record is
built once, from the rounds, by :func:`record_of`.

REFLECT (:mod:`reflect_otel.attribution.pipeline`), its faithfulness controls (:mod:`reflect_otel.attribution.controls`), bare resampling
(ICS) and DoVer (:mod:`reflect_otel.attribution.baselines`) are policies of this one loop, so they get the same inputs, the same
budget and the same control rule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from reflect_otel import prompts
from reflect_otel.attribution import stages
from reflect_otel.attribution._replayer import effect_arm
from reflect_otel.attribution._run import AttributionRun, Conclusion, Tested, is_correct
from reflect_otel.attribution.controlled_replay import ControlledReplay
from reflect_otel.attribution.corrections import Rule
from reflect_otel.attribution.trial import Decision, GateFn, Trial, TrialResult
from reflect_otel.config import ReflectConfig
from reflect_otel.errors import LLMError
from reflect_otel.flagging.verifiers import bound_to_original, bound_to_runs, is_undecided, unprovable_by
from reflect_otel.record import (
    AttributionMode,
    AttributionRecord,
    AttributionStatus,
    Classification,
    Correction,
    GateDecider,
    GateVerdict,
    Intervention,
    Localization,
    LocalizationOutcome,
    LocalizationTest,
    RepairPlan,
    ReplayAttempt,
    Stage,
    StepChange,
)
from reflect_otel.replay import ReplayAdapter, agent_rules, pure_tools, resampler
from reflect_otel.trace import Step, StepAction, StructuredTrace
from reflect_otel.verdict import Verdict, shown_answer

__all__ = [
    "Diagnosis",
    "Round",
    "SearchContext",
    "SearchPolicy",
    "faithfulness_gate",
    "localization_test",
    "localized_steps",
    "proof_text",
    "record_of",
    "search",
    "tested_steps",
]

_log = logging.getLogger("reflect_otel.attribution.search")


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
    rest: Callable[[], Diagnosis] | None = None
    """The round's whole diagnosis, made only when ``trials`` (the cheapest, which need no more model calls) proved
    nothing: its trials are the rest of the round's, in the round's order, after these."""


@dataclass(frozen=True, slots=True)
class Round:
    """One round: the diagnosis and what testing its trials established."""

    number: int
    diagnosis: Diagnosis
    results: tuple[TrialResult, ...] = ()

    @property
    def verified(self) -> TrialResult | None:
        return next((r for r in self.results if r.decision is Decision.VERIFIED), None)


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
    trials (None: no gate, so a guidance flip never verifies). ``elsewhere(ctx, verified, step)`` is the localization
    test's trial: the correction source that verified, applied at another ``step`` (``(None, why)`` where the source
    has nothing there); it is replayed under control like any trial, with no sensitivity arm."""

    def diagnose(self, ctx: SearchContext, rounds: Sequence[Round]) -> Diagnosis | None: ...

    def gate(self, ctx: SearchContext) -> GateFn | None: ...

    def elsewhere(self, ctx: SearchContext, verified: TrialResult, step: int) -> tuple[Trial | None, str]: ...


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
    run, verdict = _judged(run, expected, replay)
    unprovable = unprovable_by(run.verifier)
    if unprovable is not None:  # no replay could verify: none is spent
        replay = None
    mode = AttributionMode.REPLAY if replay is not None else AttributionMode.LOCALIZATION_ONLY
    skipped = _nothing_to_attribute(run, verdict)
    if skipped:
        return run.record(Conclusion(AttributionStatus.SKIPPED, mode, reason=skipped))
    ctx = SearchContext(
        run, expected, domain_context, config, verdict, replay is not None, agent_rules(replay), pure_tools(replay)
    )
    engine = ControlledReplay(run, replay, expected=expected, config=config, gate=policy.gate(ctx)) if replay else None
    refused = engine.budget_refusal() if engine is not None else None
    if refused is not None:  # refused before any model call: no test could be paid for
        return run.record(Conclusion(AttributionStatus.SKIPPED, AttributionMode.NONE, reason=refused))
    rounds = _search_rounds(ctx, policy, engine)
    verified = rounds[-1].verified if rounds else None
    test = localization_test(ctx, policy, engine, rounds, verified) if engine and verified else None
    return record_of(ctx, rounds, engine, mode, no_replay=unprovable, localization=test)


def _judged(run: AttributionRun, expected: str | None, replay: ReplayAdapter | None) -> tuple[AttributionRun, Verdict]:
    """``run`` with its verdict (the caller's, else judged now) and the verifier that judges its replays: bound to
    that verdict (the proxy regime judges replays by it), and able to resample the agent when the run is judged
    here with a replay adapter (its consistency check, if any, is localization evidence: see AttributionRun)."""
    verifier = run.verifier
    if replay is not None and run.original_verdict is None:
        verifier = bound_to_runs(verifier, resampler(replay))
    verdict = run.original_verdict or verifier.verify(run.trace, expected=expected)
    return run.judged(bound_to_original(verifier, run.trace, verdict), verdict), verdict


def _nothing_to_attribute(run: AttributionRun, verdict: Verdict) -> str:
    """Why the run has nothing to attribute, or ``""``."""
    if is_correct(verdict):
        return "the answer already verifies as correct; nothing to attribute"
    if is_undecided(verdict):  # it names the right value among others: no failure to attribute, nor a flip to find
        return f"the answer is undecided, not wrong: {verdict.reasoning[:300]}"
    return "" if run.trace.steps else "the trace has no steps"


def _search_rounds(ctx: SearchContext, policy: SearchPolicy, engine: ControlledReplay | None) -> list[Round]:
    """The rounds, until a trial verifies, the budget is spent, the policy has nothing more, or a stage it cannot do
    without fails (recorded as the run's error)."""
    run, rounds = ctx.run, list[Round]()
    for number in range(1, ctx.config.rounds + 1):
        try:
            diagnosis = policy.diagnose(ctx, rounds)
        except LLMError as error:
            run.error(Stage.LOCALIZE if not rounds else Stage.RELOCALIZE, error, number)
            break
        if diagnosis is None:
            break
        kind = f" ({diagnosis.classification.error_type.value})" if diagnosis.classification else ""
        _progress(run, "round %d: step %d localized%s", number, diagnosis.localization.step_index, kind)
        if engine is None:
            rounds.append(Round(number, diagnosis))
            break
        results = _test(engine, diagnosis, run)
        if diagnosis.rest is not None and not _settled(results, engine):
            diagnosis, results = _rest_of_round(engine, diagnosis, diagnosis.rest, results, run)
        rounds.append(Round(number, diagnosis, results))
        if rounds[-1].verified is not None or (engine.remaining is not None and engine.remaining <= 0):
            break
    return rounds


def _settled(results: Sequence[TrialResult], engine: ControlledReplay) -> bool:
    """Whether a round's search is over: a trial verified, or the budget is spent."""
    spent = engine.remaining is not None and engine.remaining <= 0
    return spent or any(r.decision is Decision.VERIFIED for r in results)


def _rest_of_round(
    engine: ControlledReplay,
    first: Diagnosis,
    rest: Callable[[], Diagnosis],
    results: tuple[TrialResult, ...],
    run: AttributionRun,
) -> tuple[Diagnosis, tuple[TrialResult, ...]]:
    """The round's whole diagnosis (made now), with the trials ``first`` tested already left out, and all results."""
    whole = rest()
    tested = {_trial_key(t) for t in first.trials}
    remaining = tuple(t for t in whole.trials if _trial_key(t) not in tested)
    more = _test(engine, replace(whole, trials=remaining), run)
    known = {(c.key, c.refused) for c in first.refused}
    refused = (*first.refused, *(c for c in whole.refused if (c.key, c.refused) not in known))
    return replace(whole, trials=(*first.trials, *remaining), refused=refused), (*results, *more)


def _trial_key(trial: Trial) -> tuple[object, ...]:
    return (*trial.correction.key, trial.step, trial.injection)


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


def localization_test(
    ctx: SearchContext,
    policy: SearchPolicy,
    engine: ControlledReplay,
    rounds: Sequence[Round],
    verified: TrialResult,
) -> LocalizationTest:
    """Whether the correction source that proved step p decisive flips the run at another replaceable step too: the
    nearest step to p (before or after it) that no round of this attribution localized or replayed, where the source has a
    correction (:meth:`SearchPolicy.elsewhere`), replayed under control without a sensitivity arm. *Localized* when
    a replacement there changed its step's effect and the run did not flip; *not localized* when it flipped and its
    control did not; untested otherwise, saying why."""
    trace, step = ctx.trace, verified.trial.step
    replayed = {r.trial.step for round_ in rounds for r in round_.results if r.decision is not Decision.NOT_TESTED}
    named = localized_steps(rounds) | replayed
    others = sorted(
        (s.index for s in trace.steps if not s.is_final_answer and s.index not in named),
        key=lambda q: (abs(q - step), q),
    )
    if not others:
        return LocalizationTest(
            outcome=LocalizationOutcome.UNTESTED,
            reason="the run has no other replaceable step (none before its answer turn that no round named)",
        )
    notes = []
    for other in others[:_ELSEWHERE_STEPS]:
        trial, why = policy.elsewhere(ctx, verified, other)
        if trial is None:
            notes.append(why)
            continue
        _progress(ctx.run, "localization test: %s", _describe(trial))
        return _localization_outcome(engine, trial, engine.test(trial, sensitivity=False))
    return LocalizationTest(outcome=LocalizationOutcome.UNTESTED, reason="; ".join(dict.fromkeys(notes))[:1000])


_ELSEWHERE_STEPS = 2
"""How many of the steps nearest to the verified one the localization test asks its source for a correction of
(an auditor's costs a model call each)."""


def _localization_outcome(engine: ControlledReplay, trial: Trial, result: TrialResult) -> LocalizationTest:
    control = engine.controls.get(trial.rollback_point)
    intervention = effect_arm([a for a in result.attempts if a.error is None], 0) if result.attempts else None
    control_arm = control.arm() if control is not None and control.answered else None
    if result.effect is not None:
        intervention, control_arm = result.effect.intervention, result.effect.control
    changed = [a for a in result.attempts if a.error is None and a.change is StepChange.CHANGED]
    tried = _tried(trial, result, changed)
    if result.decision is Decision.VERIFIED:
        outcome = LocalizationOutcome.NOT_LOCALIZED
        reason = f"the same source's correction of step {trial.step} flipped the run too; its control did not"
    elif result.decision is Decision.NO_FLIP and changed:
        outcome = LocalizationOutcome.LOCALIZED
        reason = (
            f"the same source's correction of step {trial.step} changed that step's effect and did not flip the run"
        )
    else:
        outcome = LocalizationOutcome.UNTESTED
        why = result.reason or "no replacement there changed its step's effect"
        if result.decision is Decision.NO_FLIP:
            why = f"no replacement at step {trial.step} changed its effect"
        reason = f"step {trial.step}: {why}"[:1000]
    return LocalizationTest(
        outcome=outcome,
        step_index=trial.step,
        source=trial.correction.source,
        reason=reason,
        correction=tried,
        intervention=intervention,
        control=control_arm,
    )


def _tried(trial: Trial, result: TrialResult, changed: Sequence[ReplayAttempt]) -> Correction:
    """What the localization test executed, for its record: the flipping replacement, else one that changed the
    step, else the first executed; a resampling or guidance trial's own correction is only the empty frame of its
    proposals (no replacement, no replays), so it is the record's only where nothing ran."""
    if result.deciding is not None and result.deciding.correction is not None:
        return result.deciding.correction
    executed = [c for c in result.corrections if c.replays]  # a guided step has no replacement, and ran
    moved = [a.correction.replacement for a in changed if a.correction is not None]
    return next(
        (c for c in executed if c.replacement is not None and c.replacement in moved),
        next(iter(executed), trial.correction),
    )


def record_of(
    ctx: SearchContext,
    rounds: Sequence[Round],
    engine: ControlledReplay | None,
    mode: AttributionMode,
    *,
    no_replay: str | None = None,
    localization: LocalizationTest | None = None,
) -> AttributionRecord:
    """The record of a search, built once from its rounds: verified (the first verified trial, explained by its
    arms, with its localization test), not attributable (the first flip its control or sensitivity arm explained),
    or unverified (the last localization, a hypothesis). ``no_replay``: why a run with a replay adapter was not
    replayed."""
    run = ctx.run
    tested = Tested(
        replays=engine.replays if engine else (),
        corrections=[c for round_ in rounds for c in (*round_.diagnosis.refused, *_corrections(round_))],
        fidelity=engine.fidelity if engine else None,
        rounds=len(rounds),
        localizations=[round_.diagnosis.localization for round_ in rounds],
    )
    if not rounds:
        return run.record(
            Conclusion(AttributionStatus.UNVERIFIED, mode, reason="localization failed; see errors", tested=tested)
        )
    diagnosis, verified = rounds[-1].diagnosis, rounds[-1].verified
    results = [r for round_ in rounds for r in round_.results]
    flip = next((r for r in results if r.decision is Decision.NOT_ATTRIBUTABLE), None)
    localized = min(diagnosis.localization.step_index, len(run.trace.steps))
    if verified is not None:
        status, decided, step, reason = AttributionStatus.VERIFIED, verified, verified.trial.step, ""
    elif flip is not None:
        status, decided, step = AttributionStatus.NOT_ATTRIBUTABLE, flip, localized
        reason = f"step {flip.trial.step}: {flip.reason}"
    else:
        status, decided, step = AttributionStatus.UNVERIFIED, None, localized
        reason = _unverified_reason(rounds, results, engine, diagnosis.note, no_replay)
    classification = diagnosis.classification
    auditor_text = classification.explanation if classification else diagnosis.localization.reasoning
    names_step = diagnosis.localization.step_index == step
    conclusion = Conclusion(
        status,
        mode,
        step,
        reason,
        error_type=classification.error_type if classification and (names_step or verified is None) else None,
        auditor_confidence=diagnosis.localization.confidence,
        explanation=proof_text(ctx.trace, verified, auditor_text if names_step else "") if verified else auditor_text,
        root_cause=diagnosis.plan.root_cause if diagnosis.plan else "",
        intervention=_intervention(verified, diagnosis),
        effect=decided.effect if decided is not None else None,
        obstacle=flip.obstacle if status is AttributionStatus.NOT_ATTRIBUTABLE and flip is not None else None,
        localization_test=localization if verified is not None else None,
        corrected_answer=verified.deciding.final_answer if verified is not None and verified.deciding else None,
        tested=tested,
    )
    return run.record(conclusion)


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
    untested = "; ".join(
        dict.fromkeys(f"step {r.trial.step}: {r.reason}" for r in results if r.decision is Decision.NOT_TESTED)
    )
    skipped = f"; not tested: {untested}" if untested else ""
    return f"no intervention flipped the outcome under control in {len(rounds)} round(s){idle}{skipped}"[:2000]


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


def proof_text(trace: StructuredTrace, verified: TrialResult, auditor: str = "") -> str:
    """A verified record's explanation, built from its proof: the original step p and its result, the replacement
    executed and its result, and what the intervention, the control and the sensitivity arm answered from the same
    prefix; ``auditor``'s reading beside it (given only where the auditor named the same step)."""
    step = verified.trial.step
    original = trace.steps[step - 1]
    deciding = verified.deciding
    correction = deciding.correction if deciding is not None else None
    replaced = deciding.continuation[0] if deciding is not None and deciding.continuation else None
    lines = [f"Step {step} did: {_done(original)}."]
    if replaced is not None:
        source = f" ({correction.source}: {correction.finding[:200]})" if correction is not None else ""
        lines.append(f"Executed in its place{source}: {_done(replaced)}.")
    effect = verified.effect
    if deciding is not None:
        lines.append(f"From there the agent answered {shown_answer(deciding.final_answer)}, judged right.")
    if effect is not None:
        lines.append(
            f"From the same prefix with step {step} left alone (control) it answered "
            f"{', '.join(shown_answer(a) for a in effect.control.answers) or 'nothing'}."
        )
        if effect.sensitivity is not None:
            lines.append(
                f"With step {step} changed in text only ({effect.sensitivity_note}) it answered "
                f"{', '.join(shown_answer(a) for a in effect.sensitivity.answers) or 'nothing'}."
            )
    text = " ".join(lines)
    return f"{text}\n\nThe auditor's reading of step {step}: {auditor.strip()}" if auditor.strip() else text


_SHOWN_RESULT_CHARS = 300


def _done(step: Step) -> str:
    """A step as the proof tells it: the call and what it returned, or the thought."""
    action = StepAction.of_step(step).render()[:_SHOWN_RESULT_CHARS]
    if step.tool_name is None:
        return repr(action)
    result = " ".join((step.tool_result or "").split())
    cut = result[:_SHOWN_RESULT_CHARS] + ("..." if len(result) > _SHOWN_RESULT_CHARS else "")
    return f"{action}, which returned {cut!r}" if result else f"{action}, which returned nothing"


def faithfulness_gate(ctx: SearchContext) -> GateFn:
    """The paper's gate on a new step made under a plan: the cheap rules first (expected tool, forbidden action,
    the original step repeated), else the LLM gate. A gate that fails judges nothing, and an unjudged step cannot
    verify. It judges without the expected answer in view: it chooses which proposals a replay executes."""
    prompt = ctx.prompt_context(show_expected=False)

    def judge(plan: RepairPlan, proposed: Step, replaced: Step) -> GateVerdict:
        ruled = stages.gate_by_rules(plan, proposed, replaced)
        if ruled is not None:
            return ruled
        try:
            return stages.gate_with_llm(ctx.run.llm, prompt, ctx.trace, plan, proposed)
        except LLMError as error:
            ctx.run.error(Stage.GATE, error)
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
