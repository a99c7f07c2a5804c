"""Is a trace's answer correct? The contract and its implementations.

* :class:`OracleVerifier`: the judge (:func:`reflect_otel.flagging.judge.judge_answer`): the value the final message asserts
  against the expected answer, right, wrong or undecided (``is_correct`` None, labelled ``undecided``). Strict: when
  no answer can be extracted, the trace is incorrect.
* :class:`SelfVerifier`: an LLM judges the answer without ground truth.

A dataset's own verifier lives with its reader (BIG-Bench Mistake's: :class:`reflect_otel.datasets.bbm.BBMVerifier`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from reflect_otel import prompts
from reflect_otel.errors import LLMError
from reflect_otel.flagging._asserted import extract_answer
from reflect_otel.flagging.judge import Judgement, Outcome, answer_value, answers_match, judge_answer
from reflect_otel.llm.base import StructuredLLM, prompt_budget
from reflect_otel.record import Stage
from reflect_otel.replay import SamplesRuns
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = [
    "CallsLLM",
    "JudgesByOriginal",
    "KnowsUnprovable",
    "OracleVerifier",
    "ResamplesRuns",
    "SelfVerifier",
    "Verifier",
    "answers_match",
    "bound_to",
    "bound_to_original",
    "bound_to_runs",
    "extract_answer",
    "is_undecided",
    "judged_correct",
    "normalise_answer",
    "takes_runs",
    "unprovable_by",
]


class Verifier(Protocol):
    """Judges a trace's final answer. ``expected`` is the ground truth when known (oracle regime), else None.

    Returns a :class:`Verdict` whose ``is_correct`` is None when it cannot tell; never raises for bad content.
    What else a verifier can do is a capability of its own: :class:`CallsLLM` (a verifier that calls a model
    should be one, or its calls escape the attribution's cost and token budget), :class:`ResamplesRuns`,
    :class:`JudgesByOriginal`, :class:`KnowsUnprovable`.
    """

    name: str

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict: ...


@runtime_checkable
class CallsLLM(Protocol):
    """A verifier that calls a model: ``with_llm(llm)`` is the same verifier calling ``llm`` instead, so that its
    calls are recorded in the attribution's cost and held to its token budget (:func:`bound_to`)."""

    def with_llm(self, llm: StructuredLLM) -> Verifier: ...


@runtime_checkable
class ResamplesRuns(Protocol):
    """A verifier that resamples the agent (the consistency and combined verifiers): ``with_runs(runs)`` is the same
    verifier resampling through ``runs`` (the run's replay adapter; None: it cannot)."""

    def with_runs(self, runs: SamplesRuns | None) -> Verifier: ...


@runtime_checkable
class JudgesByOriginal(Protocol):
    """A verifier that judges a run's replays against the run (the consistency and combined verifiers: by the
    agent's consensus): ``with_original(trace, verdict)`` is the same verifier judging the replays of ``trace``,
    judged ``verdict``."""

    def with_original(self, trace: StructuredTrace, verdict: Verdict) -> Verifier: ...


@runtime_checkable
class KnowsUnprovable(Protocol):
    """A verifier (bound to the original run) that can say it will judge no replay right: ``unprovable`` is why
    (the agent's consensus where there is none), else None."""

    @property
    def unprovable(self) -> str | None: ...


def bound_to(verifier: Verifier, llm: StructuredLLM) -> Verifier:
    """``verifier`` making its model calls through ``llm``; one that calls no model is returned as it is."""
    return verifier.with_llm(llm) if isinstance(verifier, CallsLLM) else verifier


def takes_runs(verifier: Verifier) -> bool:
    """Whether ``verifier`` resamples the agent."""
    return isinstance(verifier, ResamplesRuns)


def bound_to_runs(verifier: Verifier, runs: SamplesRuns | None) -> Verifier:
    """``verifier`` resampling the run's agent through ``runs`` (its replay adapter; None: it cannot); one that
    does not resample is returned as it is."""
    return verifier.with_runs(runs) if isinstance(verifier, ResamplesRuns) else verifier


def bound_to_original(verifier: Verifier, trace: StructuredTrace, verdict: Verdict) -> Verifier:
    """``verifier`` judging the replays of ``trace`` (judged ``verdict``) against it, when it does so; else as it
    is."""
    return verifier.with_original(trace, verdict) if isinstance(verifier, JudgesByOriginal) else verifier


def unprovable_by(verifier: Verifier) -> str | None:
    """Why ``verifier`` (bound to the original run) can judge no replay right, when it says so, else None:
    replaying would then prove nothing."""
    reason = verifier.unprovable if isinstance(verifier, KnowsUnprovable) else None
    return reason if isinstance(reason, str) else None


# -- extraction and normalisation --------------------------------------------------------------------------------
def judged_correct(text: str | None, expected: str, *, question: str = "") -> bool:
    """Whether a final message ``text`` answering ``question`` is judged right against ``expected``
    (:func:`~reflect_otel.flagging.judge.judge_answer`); an undecided answer is not."""
    return judge_answer(text, expected, question=question).outcome is Outcome.RIGHT


def is_undecided(verdict: Verdict | None) -> bool:
    """Whether ``verdict`` is the oracle's "undecided": an answer naming several values without saying which it
    asserts, neither right nor a failure."""
    return verdict is not None and verdict.is_correct is None and verdict.label == Outcome.UNDECIDED.value


def normalise_answer(text: str) -> str:
    """One value of an answer as the judge compares it (:mod:`reflect_otel.flagging.judge`): a number in one form
    ("12,467" == "12467", "3.0" == "3"), a date as yyyy-mm-dd, else the normalised text."""
    value = answer_value(text)
    if value.number is not None:
        return format(value.number, "g") if abs(value.number) < 1e15 else str(value.number)
    if value.date is not None:
        return "-".join("xx" if part < 0 else f"{part:02d}" for part in value.date)
    return value.text


class OracleVerifier:
    """The judge (:func:`reflect_otel.flagging.judge.judge_answer`) on the final message and the trace's question: right,
    wrong, or undecided (``is_correct`` None, labelled ``undecided``: never right, never a failure). A missing
    expected answer gives ``is_correct=None`` (it cannot tell)."""

    name = "oracle"

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        if expected is None:
            return Verdict(
                verifier=self.name,
                is_correct=None,
                extracted_answer=extract_answer(trace.final_answer),
                confidence=0.0,
                reasoning="no expected answer to compare with",
            )
        judged = judge_answer(trace.final_answer, expected, question=trace.question)
        if judged.answer is None:
            return Verdict(verifier=self.name, is_correct=False, reasoning="no answer could be extracted")
        return Verdict(
            verifier=self.name,
            is_correct=judged.correct,
            extracted_answer=judged.answer,
            label=Outcome.UNDECIDED.value if judged.outcome is Outcome.UNDECIDED else None,
            reasoning=_reasoning(judged),
        )


def _reasoning(judged: Judgement) -> str:
    if judged.outcome is Outcome.UNDECIDED:
        named = ", ".join(repr(c) for c in judged.candidates)
        return f"undecided: the answer names {named} and does not say which it asserts ({judged.how})"
    said = "matches the expected answer" if judged.outcome is Outcome.RIGHT else "differs from the expected answer"
    if judged.how == "as written":
        return said
    asserted = repr(judged.value) if judged.value is not None else ", ".join(repr(c) for c in judged.candidates)
    return f"{said}: it asserts {asserted} ({judged.how})"


class SelfVerifier:
    """An LLM judges the answer from the question and the trace alone (no ground truth is shown, even if known)."""

    name = "self"

    def __init__(self, llm: StructuredLLM, *, max_chars: int = 500, domain_context: str = "") -> None:
        self.llm = llm
        self.max_chars = max_chars
        self.domain_context = domain_context

    def with_llm(self, llm: StructuredLLM) -> SelfVerifier:
        return SelfVerifier(llm, max_chars=self.max_chars, domain_context=self.domain_context)

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        ctx = prompts.PromptContext.of(
            trace,
            None,
            include_expected=False,
            max_chars=self.max_chars,
            budget=prompt_budget(self.llm),
            domain_context=self.domain_context,
        )
        try:
            out = self.llm.complete(prompts.self_verify(ctx, trace.steps), prompts.SelfVerifyOutput, stage=Stage.VERIFY)
        except LLMError as error:
            return Verdict(verifier=self.name, is_correct=None, confidence=0.0, reasoning=f"judge failed: {error}")
        judged = out.value
        return Verdict(
            verifier=self.name,
            is_correct=judged.is_correct,
            extracted_answer=extract_answer(trace.final_answer),
            confidence=judged.confidence,
            reasoning=judged.reasoning,
        )
