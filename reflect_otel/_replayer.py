"""The two arms' bookkeeping for a controlled test: :class:`Replayer` makes one replay and judges it (every replay
of an attribution goes through it, in order, out of one budget), :class:`Controls` keeps the control arm of each
rollback point (run once, reused, topped up when the run is not reproduced) and the replay fidelity they show."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from reflect_otel._run import AttributionRun, is_correct
from reflect_otel._stats import wilson
from reflect_otel.judge import answers_match
from reflect_otel.record import EffectArm, Fidelity, ReplayArm, ReplayAttempt
from reflect_otel.replay import InjectionRole, ReplayAdapter, ReplayResult, replay_with
from reflect_otel.trace import StepAction
from reflect_otel.verifiers import extract_answer

__all__ = ["ControlArm", "Controls", "Replayer", "effect_arm"]


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
            result = replay_with(
                self.adapter, trace, planned.rollback_point, planned.injection, self.injection_role, action
            )
        except Exception as error:  # an adapter, or the agent it runs, may fail in any way
            self.run.error("replay", error, planned.round)
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


@dataclass(slots=True)
class ControlArm:
    """The control arm of one rollback point: its replays, in order."""

    attempts: list[ReplayAttempt] = field(default_factory=list)

    @property
    def answered(self) -> list[ReplayAttempt]:
        return [a for a in self.attempts if a.error is None]

    @property
    def flips(self) -> int:
        return sum(1 for a in self.answered if a.flipped)

    @property
    def reproduced_all(self) -> bool:
        return all(a.reproduced for a in self.answered)

    def arm(self) -> EffectArm:
        return effect_arm(self.answered, self.flips)


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
            planned = ReplayAttempt(
                round=round_,
                rollback_point=point,
                arm=ReplayArm.CONTROL,
                sample=sample,
                localized_step=localized,
                injection="",
            )
            attempt, _ = self.replayer.replay(planned, action=None)
            if attempt.error is None:
                attempt = attempt.model_copy(update={"reproduced": self._reproduces(attempt)})
            arm.attempts.append(self.replayer.record(attempt))

    def _reproduces(self, attempt: ReplayAttempt) -> bool:
        """The run's own answer: the same under the judge's normalisation, or the same answer the verifier read
        from both in the task's form (a chain of thought answering "Melissa" where its run wrote "(A)", the option
        the question lists as "(A) Melissa")."""
        answer = extract_answer(attempt.final_answer)
        if answer is None or self._original is None:
            return answer is None and self._original is None
        if answers_match(answer, self._original):
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
