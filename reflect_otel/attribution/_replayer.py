"""The arms' bookkeeping for a controlled test: :class:`Replayer` makes one replay and judges it (every replay of an
attribution goes through it, in order, out of one budget), :class:`Controls` keeps the control arm of each rollback
point (run once, reused, topped up when the run is not reproduced) and the replay fidelity they show, and
:class:`Sensitivities` the sensitivity arm of each (step p changed in text, not in effect; run once, reused)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from reflect_otel.attribution._run import AttributionRun, is_correct
from reflect_otel.attribution.effects import ResultNormaliser, same_content, same_result, variant_replayed_as_given
from reflect_otel.flagging._stats import wilson
from reflect_otel.flagging.judge import same_answer
from reflect_otel.flagging.verifiers import extract_answer
from reflect_otel.record import EffectArm, Fidelity, ReplayArm, ReplayAttempt, Stage, StepChange
from reflect_otel.replay import InjectionRole, ReplayAdapter, ReplayRequest, ReplayResult, replay_with
from reflect_otel.trace import Step, StepAction

__all__ = ["NEUTRAL_INJECTION", "ControlArm", "Controls", "Replayer", "Sensitivities", "SensitivityArm", "effect_arm"]


def effect_arm(attempts: Sequence[ReplayAttempt], flips: int) -> EffectArm:
    """An arm of replays that ran to an answer, ``flips`` of them counted, with the Wilson interval."""
    low, high = wilson(flips, len(attempts))
    return EffectArm(
        replays=len(attempts), flips=flips, answers=tuple(a.final_answer for a in attempts), low=low, high=high
    )


class Replayer:
    """Replays one failed run through ``adapter`` and judges each replay with the run's verifier; keeps every replay
    made, in order. A failure is recorded in the attempt and the run's errors, never raised."""

    def __init__(
        self, run: AttributionRun, adapter: ReplayAdapter, *, expected: str | None, injection_role: InjectionRole
    ) -> None:
        self.run = run
        self.adapter = adapter
        self.expected = expected
        self.injection_role = injection_role
        self.log: list[ReplayAttempt] = []

    @property
    def remaining(self) -> int | None:
        """Replays the budget still allows (None: no budget)."""
        left = getattr(self.adapter, "remaining", None)
        return left if isinstance(left, int) else None

    def replay(self, planned: ReplayAttempt, *, action: StepAction | None) -> tuple[ReplayAttempt, ReplayResult | None]:
        trace = self.run.trace
        try:
            request = ReplayRequest.intervention(
                trace, planned.rollback_point, planned.injection, role=self.injection_role, action=action
            )
            result = replay_with(self.adapter, request)
        except Exception as error:  # an adapter, or the agent it runs, may fail in any way
            self.run.error(Stage.REPLAY, error, planned.round)
            failed = planned.model_copy(update={"error": str(error)[:2000] or type(error).__name__})
            return failed, None
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

    def record(self, attempt: ReplayAttempt) -> ReplayAttempt:
        """Keep ``attempt`` (after its arm has annotated it) in the attribution's replays."""
        self.log.append(attempt)
        return attempt


class _ArmReplays:
    """What every arm says of its replays: those that answered, how many flipped, the arm as the record keeps it."""

    __slots__ = ()
    attempts: list[ReplayAttempt]

    @property
    def answered(self) -> list[ReplayAttempt]:
        return [a for a in self.attempts if a.error is None]

    @property
    def flips(self) -> int:
        return sum(1 for a in self.answered if a.flipped)

    def arm(self) -> EffectArm:
        return effect_arm(self.answered, self.flips)


@dataclass(slots=True)
class ControlArm(_ArmReplays):
    """The control arm of one rollback point: its replays, in order."""

    attempts: list[ReplayAttempt] = field(default_factory=list)

    @property
    def reproduced_all(self) -> bool:
        return all(a.reproduced for a in self.answered)


class Controls:
    """The control arm of each rollback point: ``samples`` replays with no intervention, run once and reused by every
    intervention tried there; each says whether it gave the run's own answer (replay fidelity)."""

    def __init__(self, replayer: Replayer, *, samples: int) -> None:
        self.replayer = replayer
        self.samples = samples
        self._arms: dict[int, ControlArm] = {}
        self._original = extract_answer(replayer.run.trace.final_answer)

    def ran(self, point: int) -> bool:
        return point in self._arms

    def get(self, point: int) -> ControlArm | None:
        """The control arm of ``point`` if it ran."""
        return self._arms.get(point)

    def at(self, point: int, *, round_: int, localized: int | None) -> ControlArm:
        """The control arm of ``point``, run now unless it ran before."""
        arm = self._arms.get(point)
        if arm is None:
            arm = self._arms[point] = ControlArm()
            self.extend(arm, point, self.samples, round_=round_, localized=localized)
        return arm

    def extend(self, arm: ControlArm, point: int, count: int, *, round_: int, localized: int | None) -> None:
        """``count`` more control replays at ``point``."""
        for sample in range(len(arm.attempts), len(arm.attempts) + count):
            planned = _planned(ReplayArm.CONTROL, round_, point, sample, localized)
            attempt, _ = self.replayer.replay(planned, action=None)
            if attempt.error is None:
                attempt = attempt.model_copy(update={"reproduced": self._reproduces(attempt)})
            arm.attempts.append(self.replayer.record(attempt))

    def _reproduces(self, attempt: ReplayAttempt) -> bool:
        """The run's own answer: the same value asserted under the judge (:func:`~reflect_otel.flagging.judge.same_answer`:
        "22 laps" is "22"), or the same answer the verifier read from both in the task's form (a chain of thought
        answering "Melissa" where its run wrote "(A)", the option the question lists as "(A) Melissa")."""
        answer = extract_answer(attempt.final_answer)
        if answer is None or self._original is None:
            return answer is None and self._original is None
        if same_answer(answer, self._original, question=self.replayer.run.trace.question):
            return True
        ours, run = attempt.verdict, self.replayer.run.original_verdict
        read = [v.extracted_answer for v in (ours, run) if v is not None and v.extracted_answer]
        return len(read) == 2 and read[0].casefold().split() == read[1].casefold().split()

    @property
    def fidelity(self) -> Fidelity | None:
        answered = [a for arm in self._arms.values() for a in arm.answered]
        if not answered:
            return None
        return Fidelity(
            controls=len(answered),
            reproduced=sum(1 for a in answered if a.reproduced),
            flipped=sum(1 for a in answered if a.flipped),
        )


NEUTRAL_INJECTION = "Continue with the task."
"""The sensitivity arm of a guidance trial the adapter regenerates itself (no action to re-serialise): a text that
asks for nothing, injected where the correction was."""

VariantMaker = Callable[[Step], tuple[StepAction | None, str]]
"""``step -> (its text-only variant, how)``, or ``(None, why)`` (:func:`reflect_otel.attribution.effects.sensitivity_variant`)."""


@dataclass(slots=True)
class SensitivityArm(_ArmReplays):
    """The sensitivity arm of one rollback point: the variant executed in place of step p (None: none could be
    made), how it differs or why there is none, and its replays. ``usable`` is False once a replay shows the variant
    is no text-only change (not executed as given, another effect, or replayed as the original step), with why."""

    variant: StepAction | None
    note: str
    attempts: list[ReplayAttempt] = field(default_factory=list)
    usable: bool = True


class Sensitivities:
    """The sensitivity arm of each rollback point, run once on demand (only before a flip is credited there) and
    reused; ``samples`` replays per arm, as the control's."""

    def __init__(
        self,
        replayer: Replayer,
        *,
        samples: int,
        make_variant: VariantMaker,
        normalise: ResultNormaliser | None = None,
    ) -> None:
        self.replayer = replayer
        self.samples = samples
        self.make_variant = make_variant
        self.normalise = normalise
        self._arms: dict[tuple[int, bool], SensitivityArm] = {}

    def variant(self, point: int) -> tuple[StepAction | None, str]:
        """The variant of the step after ``point`` (step ``point + 1``), or ``(None, why)``."""
        arm = self._arms.get((point, False))
        if arm is not None:
            return arm.variant, arm.note
        step = self.replayer.run.trace.steps[point]
        try:
            return self.make_variant(step)
        except Exception as error:  # an adapter's variant maker is someone else's code
            return None, f"the adapter's variant maker failed: {type(error).__name__}: {str(error)[:200]}"

    def cost(self, point: int, *, guided: bool = False) -> int:
        """Replays the arm of ``point`` still needs: none once it ran, or when no variant can be made. ``guided``:
        the arm of a guidance trial the adapter regenerates (a neutral text injected, always possible)."""
        if (point, guided) in self._arms:
            return 0
        return self.samples if guided or self.variant(point)[0] is not None else 0

    def at(self, point: int, *, round_: int, localized: int | None, guided: bool = False) -> SensitivityArm:
        """The sensitivity arm of ``point``, run now unless it ran before. ``guided``: a neutral text injected
        instead of a variant executed (for a guidance trial the adapter regenerates itself)."""
        arm = self._arms.get((point, guided))
        if arm is not None:
            return arm
        if guided:
            return self._guided(point, round_=round_, localized=localized)
        variant, note = self.variant(point)
        arm = self._arms[(point, False)] = SensitivityArm(variant, note)
        if variant is None:
            arm.usable = False
            return arm
        original = self.replayer.run.trace.steps[point]
        for sample in range(self.samples):
            planned = _planned(ReplayArm.SENSITIVITY, round_, point, sample, localized)
            attempt, result = self.replayer.replay(planned, action=variant)
            if result is not None:
                first = result.continuation[0] if result.continuation else None
                why = self._not_text_only(first, variant, original)
                attempt = attempt.model_copy(
                    update={"change": StepChange.SAME_EFFECT if why is None else StepChange.CHANGED}
                )
                if why is not None and arm.usable:
                    arm.usable, arm.note = False, f"{note}; but {why}: no sensitivity test"
            arm.attempts.append(self.replayer.record(attempt))
        if not arm.answered and arm.usable:
            arm.usable, arm.note = False, f"{note}; but its replay failed (see errors)"
        return arm

    def _guided(self, point: int, *, round_: int, localized: int | None) -> SensitivityArm:
        note = f"a text that asks for nothing ({NEUTRAL_INJECTION!r}) injected where the correction was"
        arm = self._arms[(point, True)] = SensitivityArm(None, note)
        for sample in range(self.samples):
            planned = _planned(ReplayArm.SENSITIVITY, round_, point, sample, localized, injection=NEUTRAL_INJECTION)
            attempt, _ = self.replayer.replay(planned, action=None)
            arm.attempts.append(self.replayer.record(attempt))
        if not arm.answered:
            arm.usable, arm.note = False, f"{note}; but its replay failed (see errors)"
        return arm

    def _not_text_only(self, replayed: Step | None, variant: StepAction, original: Step) -> str | None:
        """Why the replayed step p is not the variant as a text-only change of ``original``, or None."""
        if replayed is None or not StepAction.of_step(replayed).same_as(variant):
            return "the adapter did not execute it as given"
        if not variant_replayed_as_given(replayed, variant, original):
            return "the adapter replayed it as the original step (the same text)"
        if variant.tool_name is None:
            return None if same_content(replayed.reasoning, original.reasoning) else "its words changed"
        same = same_result(
            original.tool_result, replayed.tool_result, tool_name=variant.tool_name, normalise=self.normalise
        )
        return None if same else "it returned another result than the original call"


def _planned(
    arm: ReplayArm, round_: int, point: int, sample: int, localized: int | None, *, injection: str = ""
) -> ReplayAttempt:
    """One replay of ``arm`` planned at ``point`` (its ``sample``-th), in the round that localized ``localized``."""
    return ReplayAttempt(
        round=round_, rollback_point=point, arm=arm, sample=sample, localized_step=localized, injection=injection
    )
