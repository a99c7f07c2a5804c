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

Replay fidelity is recorded apart: whether each control gave the run's own answer. Greedy decoding on a real server
is not bit-exact (a prompt evaluated from a cache can tie-break another way), so a control may take another path to
another wrong answer; the contrast with the intervention still holds (both replays start from the same prefix in
the same environment), and the record says how faithfully replay reproduced the run.
* **Sampled adapter**: ``verify_samples`` replays per arm (the control once per point, reused). *Verified* when the
  one-sided Fisher exact test of "the intervention flips more often than the control" gives p <= 0.05, every
  counted flip having changed step p (at n = 3: 3 of 3 against 0 of 3). Flips that do not pass are *not
  attributable*.

Every replay, controls included, comes out of the same replay budget (``--max-replays``); a test that cannot afford
both arms is not started. The engine holds the control cache and the budget and nothing else; what to test, and in
which order, is the method's (:mod:`reflect_otel.search`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from reflect_otel import corrections
from reflect_otel._run import AttributionRun, is_correct
from reflect_otel._stats import fisher_greater, wilson
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.judge import answers_match
from reflect_otel.leaks import leak
from reflect_otel.record import (
    Correction,
    Effect,
    EffectArm,
    Fidelity,
    GateDecider,
    GateVerdict,
    InterventionKind,
    RepairPlan,
    ReplayArm,
    ReplayAttempt,
)
from reflect_otel.replay import ProposedStep, ReplayAdapter, ReplayResult, is_deterministic, proposer, replay_with
from reflect_otel.trace import Step, StepAction, StepKind, StructuredTrace
from reflect_otel.verifiers import extract_answer

__all__ = ["ALPHA", "ControlledReplay", "Decision", "GateFn", "Trial", "TrialResult"]

ALPHA = 0.05
"""The significance a sampled test must reach (one-sided Fisher exact test)."""

GateFn = Callable[[RepairPlan, Step, Step], GateVerdict]
"""Judges whether ``proposed`` (a new step p) follows ``plan``, ``replaced`` being the original step p."""

_log = logging.getLogger("reflect_otel.controlled_replay")


class Decision(str, Enum):
    """What one trial established."""

    VERIFIED = "verified"
    NOT_ATTRIBUTABLE = "not_attributable"
    """An intervention flipped the outcome, but the control from the same prefix explains it (see the module)."""
    NO_FLIP = "no_flip"
    NOT_TESTED = "not_tested"
    """Nothing ran: the budget could not pay for both arms, every candidate was refused, or the replay failed."""


@dataclass(frozen=True, slots=True)
class Trial:
    """One intervention to test at step ``correction.step_index``: an action (``correction.replacement``
    executed), or guidance (the agent decides the step with ``injection`` in context; ``plan`` is what its new step
    must follow, None for bare resampling, where any different step is the intervention)."""

    correction: Correction
    injection: str = ""
    plan: RepairPlan | None = None
    round: int = 1
    localized_step: int | None = None

    @property
    def step(self) -> int:
        return self.correction.step_index

    @property
    def is_action(self) -> bool:
        return self.correction.kind is InterventionKind.ACTION


@dataclass(frozen=True, slots=True)
class TrialResult:
    """What testing one trial produced, as a value: its decision and why, the intervention replays and the
    corrections behind them (a guidance trial's proposals each become an action), and the effect that decided."""

    trial: Trial
    decision: Decision
    reason: str
    attempts: tuple[ReplayAttempt, ...] = ()
    corrections: tuple[Correction, ...] = ()
    effect: Effect | None = None
    deciding: ReplayAttempt | None = None
    """The intervention replay behind a verified or not-attributable decision."""
    result: ReplayResult | None = None
    """That replay's result (its continuation explains the correction)."""


@dataclass(slots=True)
class _Control:
    """The control arm of one rollback point: its replays, in order."""

    attempts: list[ReplayAttempt] = field(default_factory=list)

    @property
    def answered(self) -> list[ReplayAttempt]:
        return [a for a in self.attempts if a.error is None]

    @property
    def flips(self) -> int:
        return sum(1 for a in self.answered if a.flipped)

    @property
    def reproduced(self) -> int:
        return sum(1 for a in self.answered if a.reproduced)

    def arm(self) -> EffectArm:
        return _arm(self.answered, self.flips)


@dataclass(frozen=True, slots=True)
class _Candidate:
    """An intervention ready to replay: the action to execute (None: the agent regenerates the step itself), the
    position of its correction among those considered, and the gate's verdict on a proposal made under a plan."""

    index: int
    action: StepAction | None
    gate: GateVerdict | None = None


def _arm(attempts: Sequence[ReplayAttempt], flips: int) -> EffectArm:
    low, high = wilson(flips, len(attempts))
    return EffectArm(
        replays=len(attempts), flips=flips, answers=tuple(a.final_answer for a in attempts), low=low, high=high
    )


class ControlledReplay:
    """The controlled tests of one failed run (see the module): the control cache, the replay budget, and the log
    of every replay made. One per attribution; not shared between threads."""

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
        self.trace = run.trace
        self.adapter = adapter
        self.expected = expected
        self.config = config
        self.gate = gate
        self.deterministic = is_deterministic(adapter)
        self.samples = 1 if self.deterministic else config.verify_samples
        self._controls: dict[int, _Control] = {}
        self._executed: dict[int, set[str]] = {}  # per rollback point, the actions replayed there
        self._log: list[ReplayAttempt] = []
        self._original_answer = extract_answer(self.trace.final_answer)

    # -- what the record needs ---------------------------------------------------------------------------------
    @property
    def replays(self) -> tuple[ReplayAttempt, ...]:
        """Every replay made, controls included, in the order made."""
        return tuple(self._log)

    @property
    def fidelity(self) -> Fidelity | None:
        answered = [a for c in self._controls.values() for a in c.answered]
        if not answered:
            return None
        return Fidelity(
            controls=len(answered),
            reproduced=sum(1 for a in answered if a.reproduced),
            flipped=sum(1 for a in answered if a.flipped),
        )

    @property
    def remaining(self) -> int | None:
        left = getattr(self.adapter, "remaining", None)
        return left if isinstance(left, int) else None

    def can_test(self, step: int) -> bool:
        """Whether the budget pays for a test at ``step``: its control (unless cached) and one intervention arm."""
        left = self.remaining
        need = self.samples * (1 if step - 1 in self._controls else 2)
        return left is None or left >= need

    # -- testing -------------------------------------------------------------------------------------------------
    def test(self, trial: Trial) -> TrialResult:
        """Test ``trial`` under the decision rule. Never raises for what the adapter or the agent does."""
        step, point = trial.step, trial.step - 1
        if not 1 <= step <= len(self.trace.steps):
            return TrialResult(trial, Decision.NOT_TESTED, f"step {step} is not a step of the run")
        leaked = leak(self._given_texts(trial), self.expected)
        if leaked is not None:
            refused = trial.correction.model_copy(update={"refused": leaked})
            return TrialResult(trial, Decision.NOT_TESTED, f"refused: {leaked}", corrections=(refused,))
        if not self.can_test(step):
            return TrialResult(trial, Decision.NOT_TESTED, "the replay budget cannot pay for both arms")
        control = self._control(point, trial)
        if not control.answered:
            return TrialResult(trial, Decision.NOT_TESTED, "the control replay failed; see errors")
        candidates, considered = self._candidates(trial)
        if not candidates:
            reason = "no proposal changed the step as the plan says" if considered else "nothing to replay"
            return TrialResult(trial, Decision.NOT_TESTED, reason, corrections=tuple(considered))
        if self.deterministic and control.flips:  # one replay shows the flip the control explains; no more
            candidates = candidates[:1]
        return self._run_candidates(trial, control, candidates, considered)

    def _given_texts(self, trial: Trial) -> list[str]:
        """What the trial puts into the replayed agent's context or executes there (the leak guard's input)."""
        texts = [trial.injection]
        replacement = trial.correction.replacement
        if trial.is_action and replacement is not None:
            texts.append(replacement.render())
        return texts

    def _control(self, point: int, trial: Trial) -> _Control:
        cached = self._controls.get(point)
        if cached is not None:
            return cached
        control = _Control()
        for sample in range(self.samples):
            planned = ReplayAttempt(
                round=trial.round,
                rollback_point=point,
                arm=ReplayArm.CONTROL,
                sample=sample,
                localized_step=trial.localized_step,
                injection="",
            )
            attempt, _ = self._replay(planned, action=None)
            if attempt.error is None:
                answer = extract_answer(attempt.final_answer)
                same = (answer is None and self._original_answer is None) or (
                    answer is not None
                    and self._original_answer is not None
                    and answers_match(answer, self._original_answer)
                )
                attempt = attempt.model_copy(update={"reproduced": same})
            control.attempts.append(attempt)
            self._log.append(attempt)
        self._controls[point] = control
        return control

    def _candidates(self, trial: Trial) -> tuple[list[_Candidate], list[Correction]]:
        """The interventions to replay for ``trial``, in order, and every correction considered for it (the
        candidates point into that list)."""
        if trial.is_action:
            return [_Candidate(0, trial.correction.replacement)], [trial.correction]
        source = proposer(self.adapter)
        if source is None:  # the agent regenerates the step itself in the replay; judged after the fact
            return [_Candidate(0, None)], [trial.correction]
        try:
            proposals = source.propose(
                self.trace,
                rollback_point=trial.step - 1,
                injection=trial.injection,
                injection_role=self.config.injection_role,
                samples=self.config.proposal_samples,
                temperature=self.config.proposal_temperature,
            )
        except Exception as error:  # the adapter or the agent may fail in any way
            self.run.error("propose", error, trial.round)
            return [], []
        return self._screened(trial, proposals)

    def _screened(self, trial: Trial, proposals: Sequence[ProposedStep]) -> tuple[list[_Candidate], list[Correction]]:
        """Each distinct proposal as an action correction: refused when it is a final answer or repeats the
        original step; gated against the plan, where a hard gate drops an unfaithful one before it costs a replay
        (a soft gate replays it, and it cannot verify)."""
        original = self.trace.steps[trial.step - 1]
        seen: set[str] = set()
        kept: list[_Candidate] = []
        considered: list[Correction] = []
        for number, proposal in enumerate(proposals, start=1):
            rendered = proposal.action.render()
            if rendered in seen:
                continue
            seen.add(rendered)
            correction = Correction(
                source=f"proposal:{trial.correction.source}",
                kind=InterventionKind.ACTION,
                step_index=trial.step,
                original=StepAction.of_step(original),
                replacement=proposal.action,
                finding=f"the agent's own decision at step {trial.step}"
                + (" with the correction in context" if trial.injection else " (resampled, no hint)")
                + f", proposal {number} of {len(proposals)}",
            )
            refused = _refusal(correction, proposal, self.trace)
            if refused is None and rendered in self._executed.get(trial.step - 1, set()):
                refused = "the same call was already replayed at this step"
            gate = None if refused else self._judge(trial, proposal.action, original)
            if refused is None and gate is not None and not gate.is_faithful and self.config.gate is GateMode.HARD:
                refused = f"the gate judged it unfaithful to the plan ({gate.violation_type}: {gate.violation_reason})"
            if refused is not None:
                considered.append(correction.model_copy(update={"refused": refused}))
                continue
            kept.append(_Candidate(len(considered), proposal.action, gate))
            considered.append(correction)
        return kept, considered

    def _judge(self, trial: Trial, proposed: StepAction, original: Step) -> GateVerdict | None:
        """The gate's verdict on a new step p made under a plan; None for bare resampling (no plan to follow)."""
        if trial.plan is None:
            return None
        if self.config.gate is GateMode.OFF or self.gate is None:
            return GateVerdict(
                is_faithful=False,
                violation_reason="the gate is off: a guidance flip is recorded, never verified",
                decided_by=GateDecider.SKIPPED,
            )
        return self.gate(trial.plan, _as_step(proposed, trial.step), original)

    def _run_candidates(
        self, trial: Trial, control: _Control, candidates: list[_Candidate], considered: list[Correction]
    ) -> TrialResult:
        attempts: list[ReplayAttempt] = []
        settled: TrialResult | None = None
        for candidate in candidates:
            if self.remaining is not None and self.remaining < self.samples:
                break
            arm, results = self._intervention_arm(trial, candidate, considered[candidate.index])
            attempts += arm
            answered = [a for a in arm if a.error is None]
            counted = [a for a in answered if a.flipped and _counts(a)]
            flipped = [a for a in answered if a.flipped]
            considered[candidate.index] = considered[candidate.index].model_copy(
                update={"replays": len(arm), "flipped": bool(flipped)}
            )
            if not flipped:
                continue
            effect = self._effect(trial, answered, len(counted), control)
            deciding = (counted or flipped)[0]
            if self._verifies(effect, counted):
                return TrialResult(
                    trial,
                    Decision.VERIFIED,
                    "",
                    tuple(attempts),
                    tuple(considered),
                    effect,
                    deciding,
                    results.get(id(deciding)),
                )
            if settled is None:
                settled = TrialResult(
                    trial,
                    Decision.NOT_ATTRIBUTABLE,
                    _why_not(effect, counted, flipped),
                    (),
                    (),
                    effect,
                    deciding,
                    results.get(id(deciding)),
                )
        if settled is not None:
            return TrialResult(
                trial,
                settled.decision,
                settled.reason,
                tuple(attempts),
                tuple(considered),
                settled.effect,
                settled.deciding,
                settled.result,
            )
        decision = Decision.NO_FLIP if attempts else Decision.NOT_TESTED
        reason = "no intervention flipped the outcome" if attempts else "the replay budget is spent"
        return TrialResult(trial, decision, reason, tuple(attempts), tuple(considered))

    def _intervention_arm(
        self, trial: Trial, candidate: _Candidate, correction: Correction
    ) -> tuple[list[ReplayAttempt], dict[int, ReplayResult]]:
        arm: list[ReplayAttempt] = []
        results: dict[int, ReplayResult] = {}
        original = self.trace.steps[trial.step - 1]
        for sample in range(self.samples):
            planned = ReplayAttempt(
                round=trial.round,
                rollback_point=trial.step - 1,
                arm=ReplayArm.INTERVENTION,
                sample=sample,
                localized_step=trial.localized_step,
                injection=trial.injection,
                correction=correction,
            )
            attempt, result = self._replay(planned, action=candidate.action)
            if candidate.action is not None:
                self._executed.setdefault(trial.step - 1, set()).add(candidate.action.render())
            if result is not None:
                attempt = self._with_change(attempt, result, trial, candidate, original)
                results[id(attempt)] = result
            arm.append(attempt)
            self._log.append(attempt)
        return arm, results

    def _with_change(
        self, attempt: ReplayAttempt, result: ReplayResult, trial: Trial, candidate: _Candidate, original: Step
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
        # a new answer in place of step p is no change of the step: it would flip the run from anywhere
        changed = first is not None and not _answers(first) and _differs(StepAction.of_step(first), original)
        verdict = self._judge(trial, StepAction.of_step(first), original) if changed and first is not None else None
        return attempt.model_copy(update={"gate": verdict, "changed_step": changed})

    def _replay(
        self, planned: ReplayAttempt, *, action: StepAction | None
    ) -> tuple[ReplayAttempt, ReplayResult | None]:
        """One replay and its verdict; a failure is recorded in the attempt and the run's errors, never raised."""
        try:
            result = replay_with(
                self.adapter, self.trace, planned.rollback_point, planned.injection, self.config.injection_role, action
            )
        except Exception as error:  # an adapter, or the agent it runs, may fail in any way
            self.run.error("replay", error, planned.round)
            return planned.model_copy(update={"error": str(error)[:2000] or type(error).__name__}), None
        verdict = self.run.verifier.verify(result.trace, expected=self.expected)
        attempt = planned.model_copy(
            update={
                "verdict": verdict,
                "flipped": is_correct(verdict),
                "final_answer": result.final_answer,
                "prefix_verified": result.prefix_verified,
                "continuation": result.continuation,
                "adapter_info": result.adapter_info,
            }
        )
        return attempt, result

    # -- the decision rule ---------------------------------------------------------------------------------------
    def _effect(self, trial: Trial, answered: list[ReplayAttempt], counted: int, control: _Control) -> Effect:
        control_arm = control.arm()
        p_value = (
            None
            if self.deterministic
            else round(fisher_greater(counted, len(answered), control_arm.flips, control_arm.replays), 6)
        )
        return Effect(
            step_index=trial.step,
            rollback_point=trial.step - 1,
            intervention=_arm(answered, counted),
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


RULE_DETERMINISTIC = (
    "deterministic replay: the intervention changed step p and answered right; the control from the same prefix, "
    "with no intervention, did not"
)
RULE_SAMPLED = (
    f"sampled replay: the intervention (changed step p in each counted flip) flipped more often than the control, "
    f"one-sided Fisher exact p <= {ALPHA}"
)


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


def _answers(step: Step) -> bool:
    return step.is_final_answer or step.kind is StepKind.FINAL_ANSWER


def _differs(action: StepAction, original: Step) -> bool:
    return action != StepAction.of_step(original)


def _as_step(action: StepAction, index: int) -> Step:
    return Step(
        index=index,
        span_id="proposal",
        kind=StepKind.TOOL_CALL if action.tool_name else StepKind.REASONING,
        tool_name=action.tool_name,
        tool_args=dict(action.arguments),
        reasoning=action.text,
    )


def _refusal(correction: Correction, proposal: ProposedStep, trace: StructuredTrace) -> str | None:
    if proposal.is_final_answer:
        return "the agent answered at once: a final answer proves nothing about the step"
    return corrections.refusal(correction, trace, expected=None)
