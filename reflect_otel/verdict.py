"""A verifier's answer about a trace (the contract lives in :mod:`reflect_otel.flagging.verifiers`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ConsistencyCheck", "MeasuredPrecision", "Resample", "Verdict", "shown_answer"]


_SHOWN_ANSWER_CHARS = 200


def shown_answer(answer: str | None) -> str:
    """An answer as a reasoning line or a prompt shows it: quoted, cut to 200 characters (``nothing`` for none)."""
    if not answer:
        return "nothing"
    cut = answer[:_SHOWN_ANSWER_CHARS]
    return repr(cut) + ("..." if len(answer) > len(cut) else "")


class Resample(BaseModel):
    """One run of the agent again on the original's input, its decisions sampled (see
    :mod:`reflect_otel.flagging.consistency`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    answer: str | None
    agrees: bool = Field(description="Its answer is the original's under the judge's normalisation.")
    diverged_at: int | None = Field(
        default=None, description="The first step (1-based) at which it decided otherwise than the original run."
    )
    steps: int = 0
    agent_tokens: int = Field(default=0, description="The tokens its model calls used (the agent's own).")
    error: str | None = Field(default=None, description="Why it did not finish (the adapter's error).")


class ConsistencyCheck(BaseModel):
    """The original run's answer against its resamples'."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    original_answer: str | None
    runs: tuple[Resample, ...]
    temperature: float
    samples: int = Field(
        default=0,
        ge=0,
        description="Resamples asked for at most (``runs`` holds one entry for each one tried, and one for each left "
        "untried because too many had failed).",
    )
    stop_lead: int | None = Field(
        default=None,
        description="The stopping rule: resampling stopped once the reproducing and the other finished resamples "
        "differed by this many (None: all ``samples`` were asked for).",
    )

    @property
    def finished(self) -> int:
        return sum(1 for r in self.runs if r.error is None)

    @property
    def agreeing(self) -> int:
        return sum(1 for r in self.runs if r.error is None and r.agrees)

    @property
    def agent_runs(self) -> int:
        """The agent runs this check cost: those that finished (a refused or failed request ran none to the end)."""
        return self.finished

    @property
    def agent_tokens(self) -> int:
        return sum(r.agent_tokens for r in self.runs)

    @property
    def first_divergence(self) -> int | None:
        """The earliest step at which a resample that answered otherwise departed from the original."""
        steps = [r.diverged_at for r in self.runs if r.error is None and not r.agrees and r.diverged_at]
        return min(steps) if steps else None

    def summary(self) -> str:
        """``1 of 3 resamples reproduced the answer 'X'; the others answered 'Y', 'Z' (first diverging at step 2)``."""
        others = [shown_answer(r.answer) for r in self.runs if r.error is None and not r.agrees]
        text = (
            f"{self.agreeing} of {self.finished} resamples reproduced the answer {shown_answer(self.original_answer)}"
        )
        if others:
            text += f"; the others answered {', '.join(others)}"
        if self.first_divergence is not None:
            text += f" (first diverging at step {self.first_divergence})"
        failed = len(self.runs) - self.finished
        return text + (f"; {failed} failed" if failed else "")


class MeasuredPrecision(BaseModel):
    """How often verdicts on one basis were right on labelled runs: ``right`` of ``judged``, with the Wilson 95%
    interval ``[low, high]``, from a calibration file (``source`` says which runs and command)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    basis: str
    right: int = Field(ge=0)
    judged: int = Field(ge=1)
    low: float = Field(ge=0, le=1)
    high: float = Field(ge=0, le=1)
    source: str = ""

    @property
    def rate(self) -> float:
        return self.right / self.judged

    def text(self) -> str:
        return f"{self.rate:.2f} [{self.low:.2f}, {self.high:.2f}] ({self.right} of {self.judged} right)"


class Verdict(BaseModel):
    """Is the trace's answer correct? ``is_correct`` is None when the verifier cannot tell.

    ``confidence`` is how often such a verdict is right where that was measured; None when it was not (a verifier
    without a calibration shows no number). ``basis`` names what the verdict rests on and ``measured`` its
    calibration; ``consistency`` keeps the resamples a consistency check ran; ``error`` says why a verifier that
    failed (not one that could not tell) gave no verdict."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verifier: str
    is_correct: bool | None
    extracted_answer: str | None = None
    confidence: float | None = Field(default=1.0, ge=0, le=1)
    score: float | None = Field(
        default=None,
        description="How likely the run is wrong, in [0, 1]: a flagging verifier's score (fitted on labelled runs "
        "where the calibration holds a map, else uncalibrated: the share of resamples not reproducing the answer, the "
        "audit's error signal). The consistency, combined and evidence verifiers flag a run whose score reaches "
        "REFLECT_FLAG_THRESHOLD.",
    )
    label: str | None = None
    reasoning: str = ""
    basis: str | None = None
    measured: MeasuredPrecision | None = None
    consistency: ConsistencyCheck | None = None
    error: str | None = Field(
        default=None, description="Why the verifier could not run (its model or the agent's adapter failed)."
    )
