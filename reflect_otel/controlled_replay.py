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

The decision rule. The intervention *changed step p* when it was an action the adapter executed as given, or a
regenerated step that differs from the original and that the faithfulness gate judged to follow the text's plan
(only a hard or soft gate judges; with the gate off, or when the gate finds it unfaithful, a guidance flip is
recorded and never verifies). Bare resampling has no plan to follow: a step that differs is a change.

* **Deterministic adapter** (greedy continuations): one replay per arm. The control of a rollback point runs once
  and is reused by every intervention tried there. *Verified* when the intervention changed step p and answered
  right, and the control did not (it reproduced the run's outcome: a wrong answer). A control that answers right
  (the run flips with no intervention) makes a flip there *not attributable*: one intervention is replayed to show
  it, no more.

* **Sampled adapter**: ``verify_samples`` replays per arm (the control once per point, reused). *Verified* when the
  one-sided Fisher exact test of "the intervention flips more often than the control" gives p <= 0.05, every
  counted flip having changed step p (at n = 3: 3 of 3 against 0 of 3). Flips that do not pass are *not
  attributable*.

Replay fidelity is recorded apart: whether each control gave the run's own answer. Greedy decoding on a real server
is not bit-exact (a prompt evaluated from llama.cpp's cache can tie-break another way than the run did), so a
control may take another path to another wrong answer. Then one control is not enough: before a flip at that point
is credited, the control arm is brought to ``verify_samples`` replays, and none may answer right (when the budget
cannot pay for them, the flip is not attributable). The record says how faithfully replay reproduced the run.
Every replay, controls included, comes out of the same replay budget (``--max-replays``); a test that cannot afford
both arms is not started, and a control runs only once an intervention is ready to replay at its point (proposals
are screened first: a control with nothing to compare it with would spend a replay on nothing). The engine holds
the control arms (:mod:`reflect_otel._replayer`) and applies the rule; what a trial replays is
:mod:`reflect_otel.proposals`'; what to test, and in which order, is the method's (:mod:`reflect_otel.search`).
"""

from __future__ import annotations

from reflect_otel._replayer import ControlArm, Controls, Replayer, effect_arm
from reflect_otel._run import AttributionRun
from reflect_otel._stats import fisher_greater
from reflect_otel.config import ReflectConfig
from reflect_otel.corrections import repeated_call
from reflect_otel.leaks import action_leak, leak
from reflect_otel.proposals import ALREADY_REPLAYED, Candidate, candidates, judge, replayed_already
from reflect_otel.record import (
    REFUSED_TEXT_CHARS,
    Correction,
    Effect,
    Fidelity,
    GateDecider,
    GateVerdict,
    ReplayArm,
    ReplayAttempt,
)
from reflect_otel.replay import ReplayAdapter, ReplayResult, is_deterministic, pure_tools
from reflect_otel.trace import Step, StepAction
from reflect_otel.trial import Decision, GateFn, Trial, TrialResult

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
    "deterministic replay: the intervention changed step p and answered right; the control from the same prefix, "
    "with no intervention, did not"
)
RULE_SAMPLED = (
    f"sampled replay: the intervention (changed step p in each counted flip) flipped more often than the control, "
    f"one-sided Fisher exact p <= {ALPHA}"
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
        self.deterministic = is_deterministic(adapter)
        self.samples = 1 if self.deterministic else config.verify_samples
        self.replayer = Replayer(run, adapter, expected=expected, injection_role=config.injection_role)
        self.controls = Controls(self.replayer, samples=self.samples)
        self._replayed: dict[int, set[str]] = {}  # per rollback point, the keys of the actions replayed there
        self.pure = pure_tools(adapter)

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

    def can_test(self, step: int) -> bool:
        """Whether the budget pays for a test at ``step``: its control (unless it ran) and one intervention arm."""
        left = self.remaining
        return left is None or left >= self.samples * (1 if self.controls.ran(step - 1) else 2)

    def _action_leak(self, trial: Trial) -> str | None:
        """Why an action trial's replacement must not run: what it introduces into the step it replaces carries the
        expected answer (see :func:`~reflect_otel.leaks.action_leak`)."""
        replacement = trial.correction.replacement
        if not trial.is_action or replacement is None:
            return None
        step = StepAction.of_step(self.run.trace.steps[trial.step - 1])
        return action_leak(step, replacement, self.expected, self.run.trace.question)

    def test(self, trial: Trial) -> TrialResult:
        """Test ``trial`` under the decision rule. Never raises for what the adapter or the agent does."""
        if not 1 <= trial.step <= len(self.run.trace.steps):
            return TrialResult(trial, Decision.NOT_TESTED, f"step {trial.step} is not a step of the run")
        leaked = leak(_given_texts(trial), self.expected, self.run.trace.question) or self._action_leak(trial)
        if leaked is not None:
            given = "\n".join(_given_texts(trial))[:REFUSED_TEXT_CHARS]  # model_copy does not validate
            refused = trial.correction.model_copy(update={"refused": leaked, "refused_text": given})
            return TrialResult(trial, Decision.NOT_TESTED, f"refused: {leaked}", corrections=(refused,))
        repeated = replayed_already(trial, self._replayed.get(trial.rollback_point, set()))
        if repeated is not None:  # before the budget's and the control's checks, so the record lists why
            return TrialResult(trial, Decision.NOT_TESTED, ALREADY_REPLAYED, corrections=(repeated,))
        if not self.can_test(trial.step):
            return TrialResult(trial, Decision.NOT_TESTED, "the replay budget cannot pay for both arms")
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
            trial,
            run=self.run,
            adapter=self.adapter,
            config=self.config,
            gate=self.gate,
            replayed_here=self._replayed.get(trial.rollback_point, set()),
        )
        if not found:  # screened before the control runs: a control nothing is compared with wastes a replay
            reason = "no proposal changed the step as the plan says" if considered else "nothing to replay"
            return TrialResult(trial, Decision.NOT_TESTED, reason, corrections=tuple(considered))
        control = self.controls.at(trial.rollback_point, round_=trial.round, localized=trial.localized_step)
        if not control.answered:
            return TrialResult(trial, Decision.NOT_TESTED, _CONTROL_FAILED, corrections=tuple(considered))
        if self.deterministic and control.flips:  # one replay shows the flip the control explains; no more
            found = found[:1]
        return self._run(trial, control, found, considered)

    def _explained(self, point: int, control: ControlArm) -> bool:
        """Whether, with a deterministic adapter, ``point``'s control answers right and an intervention was replayed
        there already (the rule then tries nothing more there)."""
        return (
            self.deterministic
            and control.flips > 0
            and any(a.arm is ReplayArm.INTERVENTION and a.rollback_point == point for a in self.replayer.log)
        )

    def _run(
        self, trial: Trial, control: ControlArm, found: list[Candidate], considered: list[Correction]
    ) -> TrialResult:
        attempts: list[ReplayAttempt] = []
        settled: TrialResult | None = None
        for candidate in found:
            if self.remaining is not None and self.remaining < self.samples:
                break
            arm, results = self._intervention_arm(trial, candidate, considered[candidate.index])
            attempts += arm
            answered = [a for a in arm if a.error is None]
            flipped = [a for a in answered if a.flipped]
            counted = [a for a in flipped if _counts(a)]
            considered[candidate.index] = considered[candidate.index].model_copy(
                update={"replays": len(arm), "flipped": bool(flipped)}
            )
            if not flipped:
                continue
            unconfirmed = self._confirm(control, trial) if counted else None
            effect = self._effect(trial, answered, len(counted), control)
            first = (counted or flipped)[0]
            # the record's intervention names the correction as tried (its replays and flip), not as proposed
            deciding, replayed = (
                first.model_copy(update={"correction": considered[candidate.index]}),
                results.get(id(first)),
            )
            if unconfirmed is None and self._verifies(effect, counted):
                return TrialResult(
                    trial, Decision.VERIFIED, "", tuple(attempts), tuple(considered), effect, deciding, replayed
                )  # fmt: skip
            if settled is None:
                why = unconfirmed or _why_not(effect, counted, flipped)
                settled = TrialResult(trial, Decision.NOT_ATTRIBUTABLE, why, (), (), effect, deciding, replayed)
        if settled is not None:
            return TrialResult(
                trial, settled.decision, settled.reason, tuple(attempts), tuple(considered), settled.effect,
                settled.deciding, settled.result,
            )  # fmt: skip
        decision = Decision.NO_FLIP if attempts else Decision.NOT_TESTED
        reason = "no intervention flipped the outcome" if attempts else "the replay budget is spent"
        return TrialResult(trial, decision, reason, tuple(attempts), tuple(considered))

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
                arm=ReplayArm.INTERVENTION,
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
        """The attempt with whether it changed step p, and the verdict on how: for an action, whether the adapter
        executed it (and, for a proposal, the gate's verdict on it); for regenerated guidance, the gate's verdict
        on the new step."""
        first = result.continuation[0] if result.continuation else None
        if candidate.action is not None:
            executed = _executed(first, candidate.action)
            gate = candidate.gate if executed.is_faithful and candidate.gate is not None else executed
            changed = executed.is_faithful and _differs(candidate.action, original)
            return attempt.model_copy(update={"gate": gate, "changed_step": changed})
        # a new answer in place of step p is no change of the step: it would flip the run from anywhere; nor is a
        # pure tool's call the prefix made (the agent got only another turn)
        if first is None:
            return attempt.model_copy(update={"gate": None, "changed_step": False})
        regenerated = StepAction.of_step(first)
        changed = (
            not _answers(first)
            and _differs(regenerated, original)
            and repeated_call(regenerated, self.run.trace, trial.step, self.pure) is None
        )
        verdict = judge(trial, regenerated, original, self.gate, self.config.gate) if changed else None
        return attempt.model_copy(update={"gate": verdict, "changed_step": changed})

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

    def _verifies(self, effect: Effect, counted: list[ReplayAttempt]) -> bool:
        if not counted:
            return False
        if self.deterministic:
            return effect.control.flips == 0
        return effect.p_value is not None and effect.p_value <= ALPHA


_CONTROL_FAILED = "the control replay failed; see errors"


def _given_texts(trial: Trial) -> list[str]:
    """What the method puts into the replayed agent's context (the leak guard's input): the texts it wrote, not the
    run's own record that its injection quotes (the agent saw that data in its run). An action is checked apart,
    for what it changes in the step (:meth:`ControlledReplay._action_leak`)."""
    return list(trial.authored) if trial.authored is not None else [trial.injection]


def _counts(attempt: ReplayAttempt) -> bool:
    """A flip counts for the intervention only when it changed step p as intended (see the module)."""
    return bool(attempt.changed_step) and (attempt.gate is None or attempt.gate.is_faithful)


def _why_not(effect: Effect, counted: list[ReplayAttempt], flipped: list[ReplayAttempt]) -> str:
    if effect.deterministic and effect.control.flips:
        return f"{effect.text()}: the control replay from the same prefix answers right with no intervention"
    if not counted:
        gate = flipped[0].gate if flipped else None
        if flipped and not flipped[0].changed_step:
            return (
                "the replay flipped, but its step p is the original one or an answer given at once: the change came "
                "later, or from anywhere, not from a changed step"
            )
        return "the replay flipped, but the gate did not judge its step p faithful to the plan" + (
            f" ({gate.violation_type}: {gate.violation_reason})" if gate is not None and gate.violation_type else ""
        )
    return f"{effect.text()}: the control explains the flips (p = {effect.p_value})"


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


def _answers(step: Step) -> bool:
    return step.is_final_answer


def _differs(action: StepAction, original: Step) -> bool:
    return not action.same_as(StepAction.of_step(original))
