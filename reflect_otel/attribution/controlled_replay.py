"""Controlled replay: how every method tests an intervention, and what "verified" means.

A test of an intervention at step p compares two arms, both replayed from the same prefix (steps 1..p-1 kept), with
the same sampling:

* the **intervention** arm: step p replaced. An *action* (a concrete call or thought, from an evidence rule or the
  auditor) is executed in place of step p. A *guidance* trial asks the agent for its own decision at step p with a
  text in its context (a repair plan, a placebo, a hypothesis; nothing at all for bare resampling): proposals are
  sampled at ``proposal_temperature`` (:class:`~reflect_otel.replay.ProposesSteps`) and each is then executed as an
  action with the text still in context. An adapter that cannot propose replays the guidance instead, and the step p
  it regenerates is judged after the fact. Proposals may be sampled; the continuation after step p is the agent's,
  run by the adapter as it runs (greedily, where the adapter is deterministic).
* the **control** arm: the same prefix replayed with no intervention at all.

* the **sensitivity** arm: the same prefix with step p changed in text but not in effect (the original call
  re-serialised, the original thought under a step label: :func:`~reflect_otel.attribution.effects.sensitivity_variant`),
  executed as every intervention is; for guidance an adapter regenerates itself, a text that asks for nothing
  injected where the correction was. Run once per point, and only before a flip there is credited.

The decision rule. The intervention *changed step p* when it changed the step's **effect**
(:mod:`reflect_otel.attribution.effects`): the adapter executed it as given (an action) and what it produced differs from what
the original step produced (a call's result, under the tool's normalisation; a thought's content); never when it
takes the place of the run's answer turn or is a call the run made at a later step, moved earlier. A regenerated
step made under a plan must also be judged faithful to it by the gate (only a hard or soft gate judges; with the
gate off, or when the gate finds it unfaithful, a guidance flip is recorded and never verifies). Bare resampling has
no plan to follow: a change of effect is the intervention. A point whose step has no text-only variant is not
tested (a flip there could not be told from sensitivity), nor is the run's answer turn.

* **Deterministic adapter** (greedy continuations): one replay per arm. The control of a rollback point runs once
  and is reused by every intervention tried there. *Verified* when the intervention changed step p and answered
  right, and neither the control (it reproduced the run's outcome: a wrong answer) nor the sensitivity arm did. A
  control that answers right (the run flips with no intervention) makes a flip there *not attributable*: one
  intervention is replayed to show it, no more; so does a sensitivity arm that answers right (the point is
  *sensitive*: any change of text there flips the run).

* **Sampled adapter**: ``verify_samples`` replays per arm (the control and the sensitivity arm once per point,
  reused). *Verified* when the one-sided Fisher exact test of "the intervention flips more often than the control"
  gives p <= 0.05, and the same test against the sensitivity arm too, every counted flip having changed step p (at
  n = 3: 3 of 3 against 0 of 3). Flips that do not pass are *not attributable*.

Replay fidelity is recorded apart: whether each control gave the run's own answer. Greedy decoding on a real server
is not bit-exact (a prompt evaluated from llama.cpp's cache can tie-break another way than the run did), so a
control may take another path to another wrong answer. Then one control is not enough: before a flip at that point
is credited, the control arm is brought to ``verify_samples`` replays, and none may answer right (when the budget
cannot pay for them, the flip is not attributable). The record says how faithfully replay reproduced the run.
Every replay, controls and sensitivity arms included, comes out of the same replay budget (``--max-replays``); a test
that cannot afford its arms is not started, and a control runs only once an intervention is ready to replay at its point (proposals
are screened first: a control with nothing to compare it with would spend a replay on nothing). The engine holds
the control arms (:mod:`reflect_otel.attribution._replayer`) and applies the rule; what a trial replays is
:mod:`reflect_otel.attribution.proposals`'; what to test, and in which order, is the method's (:mod:`reflect_otel.attribution.search`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from reflect_otel.attribution._replayer import ControlArm, Controls, Replayer, Sensitivities, SensitivityArm, effect_arm
from reflect_otel.attribution._run import AttributionRun
from reflect_otel.attribution.corrections import repeated_call
from reflect_otel.attribution.effects import change_of, screened_change, sensitivity_variant
from reflect_otel.attribution.leaks import action_leak, leak
from reflect_otel.attribution.proposals import (
    ALREADY_REPLAYED,
    Candidate,
    Screening,
    candidates,
    judge,
    replayed_already,
)
from reflect_otel.attribution.trial import Decision, GateFn, Trial, TrialResult
from reflect_otel.config import ReflectConfig
from reflect_otel.flagging._stats import fisher_greater
from reflect_otel.record import (
    REFUSED_TEXT_CHARS,
    Correction,
    Effect,
    Fidelity,
    GateDecider,
    GateVerdict,
    Obstacle,
    ReplayArm,
    ReplayAttempt,
    StepChange,
)
from reflect_otel.replay import (
    ReplayAdapter,
    ReplayResult,
    is_deterministic,
    proposer,
    pure_tools,
    result_normaliser,
    variant_maker,
)
from reflect_otel.trace import Step, StepAction

__all__ = [
    "ALPHA",
    "RULE_DETERMINISTIC",
    "RULE_SAMPLED",
    "ControlledReplay",
    "Decision",
    "GateFn",
    "Trial",
    "TrialResult",
]

ALPHA = 0.05
"""The significance a sampled test must reach (one-sided Fisher exact test)."""

RULE_DETERMINISTIC = (
    "deterministic replay: the intervention changed step p's effect and answered right; from the same prefix, "
    "neither the control (no intervention) nor the sensitivity arm (step p changed in text, not in effect) did"
)
RULE_SAMPLED = (
    f"sampled replay: the intervention (changed step p's effect in each counted flip) flipped more often than the "
    f"control and than the sensitivity arm, one-sided Fisher exact p <= {ALPHA} against each"
)


class ControlledReplay:
    """The controlled tests of one failed run (see the module). One per attribution; not shared between threads."""

    def __init__(
        self,
        run: AttributionRun,
        adapter: ReplayAdapter,
        *,
        expected: str | None,
        config: ReflectConfig,
        gate: GateFn | None = None,
    ) -> None:
        self.run = run
        self.adapter = adapter
        self.expected = expected
        self.config = config
        self.gate = gate
        self.deterministic = is_deterministic(adapter, run.trace)
        self.samples = 1 if self.deterministic else config.verify_samples
        self.replayer = Replayer(run, adapter, expected=expected, injection_role=config.injection_role)
        self.controls = Controls(self.replayer, samples=self.samples)
        self.normalise = result_normaliser(adapter)
        self.sensitivities = Sensitivities(
            self.replayer,
            samples=self.samples,
            make_variant=variant_maker(adapter) or sensitivity_variant,
            normalise=self.normalise,
        )
        self._replayed: dict[int, set[str]] = {}  # per rollback point, the keys of the actions replayed there
        self.pure = pure_tools(adapter)
        self.screening = Screening.of(run, adapter, config, gate)

    @property
    def replays(self) -> tuple[ReplayAttempt, ...]:
        """Every replay made, controls included, in the order made."""
        return tuple(self.replayer.log)

    @property
    def fidelity(self) -> Fidelity | None:
        return self.controls.fidelity

    @property
    def remaining(self) -> int | None:
        return self.replayer.remaining

    def budget_refusal(self) -> str | None:
        """Why the replay budget cannot pay for even one controlled test (its three arms), naming the budget one
        needs; None when it can, or there is no budget. A method checks it before anything else costs a call."""
        need = self.samples * 3
        left = self.remaining
        if left is None or left >= need:
            return None
        per_arm = (
            "one replay per arm: this agent replays deterministically"
            if self.deterministic
            else f"{self.samples} replays per arm (--verify-samples): this agent's replays are sampled"
        )
        return (
            f"the replay budget ({left} replay{'s' if left != 1 else ''}) cannot pay for one controlled test, which "
            f"needs {need} (an intervention, a control and a sensitivity arm, {per_arm}): raise the replay budget "
            f"(--max-replays, REFLECT_MAX_REPLAYS) to {need} or more"
        )

    def can_test(self, step: int, *, sensitivity: bool = True, guided: bool = False) -> bool:
        """Whether the budget pays for a test at ``step``: its control and sensitivity arm (unless they ran) and one
        intervention arm. ``guided``: a guidance trial the adapter regenerates itself."""
        left = self.remaining
        point = step - 1
        need = self.samples * (1 if self.controls.ran(point) else 2)
        return left is None or left >= need + (self.sensitivities.cost(point, guided=guided) if sensitivity else 0)

    def _action_leak(self, trial: Trial) -> str | None:
        """Why an action trial's replacement must not run: what it introduces into the step it replaces carries the
        expected answer (see :func:`~reflect_otel.attribution.leaks.action_leak`)."""
        replacement = trial.correction.replacement
        if not trial.is_action or replacement is None:
            return None
        step = StepAction.of_step(self.run.trace.steps[trial.step - 1])
        return action_leak(step, replacement, self.expected, self.run.trace.question)

    def test(self, trial: Trial, *, sensitivity: bool = True) -> TrialResult:
        """Test ``trial`` under the decision rule. Never raises for what the adapter or the agent does. Without
        ``sensitivity`` (the localization test, which asks only whether a change flips the run there) no
        sensitivity arm is run and a flip its control does not explain is reported verified."""
        if not 1 <= trial.step <= len(self.run.trace.steps):
            return TrialResult(trial, Decision.NOT_TESTED, f"step {trial.step} is not a step of the run")
        if self.run.trace.steps[trial.step - 1].is_final_answer:
            return TrialResult(trial, Decision.NOT_TESTED, f"step {trial.step}: {StepChange.ANSWER_TURN.text}")
        replacement = trial.correction.replacement if trial.is_action else None
        screened = screened_change(replacement, self.run.trace, trial.step) if replacement is not None else None
        if screened is not None:
            refused = trial.correction.model_copy(update={"refused": screened.text})
            return TrialResult(trial, Decision.NOT_TESTED, f"refused: {screened.text}", corrections=(refused,))
        guided = self._guided(trial)
        variant, why_none = self.sensitivities.variant(trial.rollback_point)
        if sensitivity and variant is None and not guided:
            return TrialResult(
                trial,
                Decision.NOT_TESTED,
                f"step {trial.step} has no text-only variant ({why_none}), so a flip there could not be told from "
                "any change of text: not tested",
            )
        leaked = leak(_given_texts(trial), self.expected, self.run.trace.question) or self._action_leak(trial)
        if leaked is not None:
            given = "\n".join(_given_texts(trial))[:REFUSED_TEXT_CHARS]  # model_copy does not validate
            refused = trial.correction.model_copy(update={"refused": leaked, "refused_text": given})
            return TrialResult(trial, Decision.NOT_TESTED, f"refused: {leaked}", corrections=(refused,))
        repeated = replayed_already(trial, self._replayed.get(trial.rollback_point, set()))
        if repeated is not None:  # before the budget's and the control's checks, so the record lists why
            return TrialResult(trial, Decision.NOT_TESTED, ALREADY_REPLAYED, corrections=(repeated,))
        if not self.can_test(trial.step, sensitivity=sensitivity, guided=guided):
            return TrialResult(trial, Decision.NOT_TESTED, self._unaffordable(trial.step, sensitivity, guided))
        ran = self.controls.get(trial.rollback_point)
        if ran is not None and not ran.answered:
            return TrialResult(trial, Decision.NOT_TESTED, _CONTROL_FAILED)
        if ran is not None and self._explained(trial.rollback_point, ran):
            # the rule: one replay shows the flip the control explains, no more (nor proposals sampled for it)
            return TrialResult(
                trial,
                Decision.NOT_TESTED,
                f"the control from step {trial.step}'s prefix answers right with no intervention, and an intervention "
                "was replayed there already: nothing tried there can be attributed",
            )
        found, considered = candidates(
            trial, self.screening, replayed_here=self._replayed.get(trial.rollback_point, set())
        )
        if not found:  # screened before the control runs: a control nothing is compared with wastes a replay
            changed = "no proposal changed the step" + (" as the plan says" if trial.plan is not None else "")
            reason = changed if considered else "nothing to replay"
            return TrialResult(trial, Decision.NOT_TESTED, reason, corrections=tuple(considered))
        control = self.controls.at(trial.rollback_point, round_=trial.round, localized=trial.localized_step)
        if not control.answered:
            return TrialResult(trial, Decision.NOT_TESTED, _CONTROL_FAILED, corrections=tuple(considered))
        if self.deterministic and control.flips:  # one replay shows the flip the control explains; no more
            found = found[:1]
        return self._run(trial, control, found, considered, sensitivity=sensitivity)

    def _guided(self, trial: Trial) -> bool:
        """Whether ``trial`` is guidance the adapter regenerates itself (it cannot propose): its sensitivity arm is a
        neutral text injected, not a variant executed."""
        return not trial.is_action and proposer(self.adapter) is None

    def _unaffordable(self, step: int, sensitivity: bool, guided: bool) -> str:
        arms = ["an intervention"]
        if not self.controls.ran(step - 1):
            arms.append("a control")
        if sensitivity and self.sensitivities.cost(step - 1, guided=guided):
            arms.append("a sensitivity arm")
        need = self.samples * len(arms)
        return (
            f"the replay budget ({self.remaining} left) cannot pay for the {need} replays of a test at step {step} "
            f"({', '.join(arms)}); raise --max-replays"
        )

    def _explained(self, point: int, control: ControlArm) -> bool:
        """Whether, with a deterministic adapter, ``point``'s control answers right and an intervention was replayed
        there already (the rule then tries nothing more there)."""
        return (
            self.deterministic
            and control.flips > 0
            and any(a.arm is ReplayArm.INTERVENTION and a.rollback_point == point for a in self.replayer.log)
        )

    def _run(
        self,
        trial: Trial,
        control: ControlArm,
        found: list[Candidate],
        considered: list[Correction],
        *,
        sensitivity: bool,
    ) -> TrialResult:
        attempts: list[ReplayAttempt] = []
        settled: TrialResult | None = None
        for candidate in found:
            if self.remaining is not None and self.remaining < self.samples:
                break
            arm, results = self._intervention_arm(trial, candidate, considered[candidate.index])
            attempts += arm
            tried = _Tried(candidate, arm, results)
            considered[candidate.index] = considered[candidate.index].model_copy(
                update={"replays": len(arm), "flipped": bool(tried.flipped)}
            )
            if not tried.flipped:
                continue
            # the record's intervention names the correction as tried (its replays and flip), not as proposed
            judged = self._judged(trial, control, tried, considered[candidate.index], sensitivity=sensitivity)
            if judged.decision is Decision.VERIFIED:
                return replace(judged, attempts=tuple(attempts), corrections=tuple(considered))
            settled = settled or judged
            if judged.obstacle is Obstacle.SENSITIVE:
                break  # any change of text flips the run here: nothing more tried at this point can be credited
        if settled is not None:
            return replace(settled, attempts=tuple(attempts), corrections=tuple(considered))
        decision = Decision.NO_FLIP if attempts else Decision.NOT_TESTED
        reason = "no intervention flipped the outcome" if attempts else "the replay budget is spent"
        return TrialResult(trial, decision, reason, tuple(attempts), tuple(considered))

    def _judged(
        self, trial: Trial, control: ControlArm, tried: _Tried, correction: Correction, *, sensitivity: bool
    ) -> TrialResult:
        """The decision one candidate's flipping arm earns under the rule, against ``control`` and (with
        ``sensitivity``) the sensitivity arm: verified, or not attributable and why (its replays and the corrections
        are filled in by the caller)."""
        counted, flipped = tried.counted, tried.flipped
        unconfirmed = self._confirm(control, trial) if counted else None
        effect = self._effect(trial, tried.answered, len(counted), control)
        first = (counted or flipped)[0]
        deciding, replayed = first.model_copy(update={"correction": correction}), tried.results.get(id(first))
        obstacle: Obstacle | None = Obstacle.CONTROL_UNREPRODUCED if unconfirmed else None
        why = unconfirmed or ""
        if unconfirmed is None and self._verifies(effect, counted):
            if not sensitivity:
                return TrialResult(trial, Decision.VERIFIED, "", (), (), effect, deciding, replayed)
            sensitivity_arm = self.sensitivities.at(
                trial.rollback_point,
                round_=trial.round,
                localized=trial.localized_step,
                guided=tried.candidate.action is None,
            )
            effect = self._with_sensitivity(effect, sensitivity_arm, len(counted), len(tried.answered))
            obstacle, why = self._sensitivity_obstacle(trial, effect, sensitivity_arm)
            if obstacle is None:
                return TrialResult(trial, Decision.VERIFIED, "", (), (), effect, deciding, replayed)
        elif obstacle is None:
            why, obstacle = _why_not(effect, counted, flipped)
        return TrialResult(trial, Decision.NOT_ATTRIBUTABLE, why, (), (), effect, deciding, replayed, obstacle)

    def _confirm(self, control: ControlArm, trial: Trial) -> str | None:
        """Before a deterministic flip is credited: when the control did not give the run's own answer, greedy
        replay is not reproducing this run here, so one control is not enough; the control arm is brought to
        ``verify_samples`` replays (none may flip). None when that is done or not needed, else why it could not be."""
        if not self.deterministic or control.flips or control.reproduced_all:
            return None
        missing = self.config.verify_samples - len(control.answered)
        if missing <= 0:
            return None
        if self.remaining is not None and self.remaining < missing:
            return (
                "the control did not give the run's own answer, so replay does not reproduce the run here, and the "
                f"replay budget left no room for the {missing} more control replay(s) that would check the flip"
            )
        self.controls.extend(control, trial.rollback_point, missing, round_=trial.round, localized=trial.localized_step)
        return None

    def _intervention_arm(
        self, trial: Trial, candidate: Candidate, correction: Correction
    ) -> tuple[list[ReplayAttempt], dict[int, ReplayResult]]:
        arm: list[ReplayAttempt] = []
        results: dict[int, ReplayResult] = {}
        original = self.run.trace.steps[trial.step - 1]
        for sample in range(self.samples):
            planned = ReplayAttempt(
                round=trial.round,
                rollback_point=trial.rollback_point,
                arm=trial.arm,
                sample=sample,
                localized_step=trial.localized_step,
                injection=trial.injection,
                correction=correction,
            )
            attempt, result = self.replayer.replay(planned, action=candidate.action)
            if candidate.action is not None:
                self._replayed.setdefault(trial.rollback_point, set()).add(candidate.action.key())
            if result is not None:
                attempt = self._with_change(attempt, result, trial, candidate, original)
                results[id(attempt)] = result
            arm.append(self.replayer.record(attempt))
        return arm, results

    def _with_change(
        self, attempt: ReplayAttempt, result: ReplayResult, trial: Trial, candidate: Candidate, original: Step
    ) -> ReplayAttempt:
        """The attempt with what it changed at step p (:func:`~reflect_otel.attribution.effects.change_of`: only a change of
        effect counts) and the verdict on how: for an action, whether the adapter executed it (and, for a proposal,
        the gate's verdict on it); for regenerated guidance, the gate's verdict on the new step."""
        first = result.continuation[0] if result.continuation else None
        change = change_of(first, candidate.action, original, self.run.trace, normalise=self.normalise)
        if candidate.action is not None:
            executed = _executed(first, candidate.action)
            gate = candidate.gate if executed.is_faithful and candidate.gate is not None else executed
            return attempt.model_copy(
                update={"gate": gate, "changed_step": change is StepChange.CHANGED, "change": change}
            )
        # a pure tool's call the prefix made is no change either: the agent got only another turn
        regenerated = StepAction.of_step(first) if first is not None else None
        changed = (
            change is StepChange.CHANGED
            and regenerated is not None
            and repeated_call(regenerated, self.run.trace, trial.step, self.pure) is None
        )
        verdict = judge(trial, regenerated, original, self.gate, self.config.gate) if changed and regenerated else None
        return attempt.model_copy(update={"gate": verdict, "changed_step": changed, "change": change})

    def _effect(self, trial: Trial, answered: list[ReplayAttempt], counted: int, control: ControlArm) -> Effect:
        control_arm = control.arm()
        p_value = (
            None
            if self.deterministic
            else round(fisher_greater(counted, len(answered), control_arm.flips, control_arm.replays), 6)
        )
        return Effect(
            step_index=trial.step,
            rollback_point=trial.rollback_point,
            intervention=effect_arm(answered, counted),
            control=control_arm,
            deterministic=self.deterministic,
            p_value=p_value,
            rule=RULE_DETERMINISTIC if self.deterministic else RULE_SAMPLED,
        )

    def _with_sensitivity(self, effect: Effect, arm: SensitivityArm, counted: int, answered: int) -> Effect:
        shown = arm.arm() if arm.answered else None
        p_value = effect.p_value
        if shown is not None and not self.deterministic:
            against = round(fisher_greater(counted, answered, shown.flips, shown.replays), 6)
            p_value = max(p_value or 0.0, against)
        return effect.model_copy(
            update={
                "sensitivity": shown,
                "sensitivity_variant": arm.variant,
                "sensitivity_note": arm.note,
                "p_value": p_value,
            }
        )

    def _sensitivity_obstacle(self, trial: Trial, effect: Effect, arm: SensitivityArm) -> tuple[Obstacle | None, str]:
        """Whether the sensitivity arm lets the flip be credited: None when it ran as a text-only change and did not
        flip (sampled: the intervention flipped significantly more often), else why not."""
        if not arm.usable or effect.sensitivity is None:
            return Obstacle.SENSITIVITY_UNTESTED, (
                f"{effect.text()}: step {trial.step}'s sensitivity arm could not run ({arm.note}), so the flip cannot "
                "be told from any change of text there"
            )
        flipped = (
            effect.sensitivity.flips > 0 if self.deterministic else effect.p_value is None or effect.p_value > ALPHA
        )
        if flipped:
            return Obstacle.SENSITIVE, (
                f"{effect.text()}: step {trial.step} changed in text only ({arm.note}) flips the run too: the point "
                "is sensitive, and no flip there can be credited to a correction"
            )
        return None, ""

    def _verifies(self, effect: Effect, counted: list[ReplayAttempt]) -> bool:
        if not counted:
            return False
        if self.deterministic:
            return effect.control.flips == 0
        return effect.p_value is not None and effect.p_value <= ALPHA


_CONTROL_FAILED = "the control replay failed; see errors"


@dataclass(frozen=True, slots=True)
class _Tried:
    """One candidate's intervention arm: its replays, those that answered, flipped, and counted as flips."""

    candidate: Candidate
    arm: list[ReplayAttempt]
    results: dict[int, ReplayResult]

    @property
    def answered(self) -> list[ReplayAttempt]:
        return [a for a in self.arm if a.error is None]

    @property
    def flipped(self) -> list[ReplayAttempt]:
        return [a for a in self.answered if a.flipped]

    @property
    def counted(self) -> list[ReplayAttempt]:
        return [a for a in self.flipped if _counts(a)]


def _given_texts(trial: Trial) -> list[str]:
    """What the method puts into the replayed agent's context (the leak guard's input): the texts it wrote, not the
    run's own record that its injection quotes (the agent saw that data in its run). An action is checked apart,
    for what it changes in the step (:meth:`ControlledReplay._action_leak`)."""
    return list(trial.authored) if trial.authored is not None else [trial.injection]


def _counts(attempt: ReplayAttempt) -> bool:
    """A flip counts for the intervention only when it changed step p as intended (see the module)."""
    return bool(attempt.changed_step) and (attempt.gate is None or attempt.gate.is_faithful)


def _why_not(effect: Effect, counted: list[ReplayAttempt], flipped: list[ReplayAttempt]) -> tuple[str, Obstacle]:
    if effect.deterministic and effect.control.flips:
        return (
            f"{effect.text()}: the control replay from the same prefix answers right with no intervention",
            Obstacle.CONTROL_FLIPPED,
        )
    if not counted:
        gate = flipped[0].gate if flipped else None
        if flipped and not flipped[0].changed_step:
            change = flipped[0].change
            what = change.text if change is not None else "its step p is the original one or an answer given at once"
            return (
                f"the replay flipped, but {what}: the flip is not the step's change of effect",
                Obstacle.NO_CHANGE_OF_EFFECT,
            )
        return "the replay flipped, but the gate did not judge its step p faithful to the plan" + (
            f" ({gate.violation_type}: {gate.violation_reason})" if gate is not None and gate.violation_type else ""
        ), Obstacle.NOT_FAITHFUL
    if effect.control.flips:
        return f"{effect.text()}: the control explains the flips (p = {effect.p_value})", Obstacle.CONTROL_FLIPPED
    return f"{effect.text()}: the control explains the flips (p = {effect.p_value})", Obstacle.SAMPLED_NOT_SIGNIFICANT


def _executed(first: Step | None, action: StepAction) -> GateVerdict:
    """Whether the adapter executed ``action`` as the first regenerated step: faithful by construction, checked
    since an adapter is someone else's code."""
    done = first is not None and StepAction.of_step(first).same_as(action)
    if done:
        return GateVerdict(is_faithful=True, decided_by=GateDecider.ACTION)
    return GateVerdict(
        is_faithful=False,
        violation_type="ignores_instruction",
        violation_reason="the replay's first regenerated step is not the action the adapter was given",
        decided_by=GateDecider.ACTION,
    )
