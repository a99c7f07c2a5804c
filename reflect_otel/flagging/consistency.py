"""Self-consistency: an answer the agent's own resamples do not reproduce is suspect.

The :class:`ConsistencyVerifier` re-runs the agent on the run's own input (through a replay adapter that
:class:`~reflect_otel.replay.SamplesRuns`, its decisions sampled at ``temperature``), and compares each resample's
answer with the original's under the judge (:func:`reflect_otel.flagging.judge.same_answer`: the value each asserts, so
"22 laps" is "22"; numbers, dates, case, punctuation, answer lists as sets). No expected answer and no model call of
ours: the signal is the agent's disagreement with itself, the standard reference-free error signal.

**How many resamples** (:func:`sequential_stop`): at most ``samples``; with ``stop_lead`` set, resampling stops as
soon as the finished resamples that reproduce the answer and those that do not differ by ``stop_lead``. With 2, two
resamples that both reproduce the answer (or both do not) stop it; a split draws more, up to ``samples``. Agreeing
runs cost little and close calls get more samples; each check keeps how many it needed.

**The verdict** (the same rule for every agent): the run's score is the share of its finished resamples that did not
reproduce the answer, or the map fitted on labelled runs of the agent where the calibration holds one
(:mod:`reflect_otel.flagging.flag_score`); the run is flagged when the score reaches ``threshold``
(``REFLECT_FLAG_THRESHOLD``, default 0.5: at most half of the resamples reproduce the answer). The verdict's basis
names what decided: ``consistency_disagree`` (flagged), ``consistency_agree`` (all reproduce it) or
``consistency_partial`` (cleared, some did not) on the share; ``score_high`` or ``score_low`` on a fitted map. It is
``UNCERTAIN`` (``is_correct`` None) when no more than half of the resamples asked finished and the stopping rule did
not decide (one run of three is no consensus), the run gave no answer, there is no adapter, or the run was not drawn
by the sample rate.

The resamples are kept in the verdict (:class:`ConsistencyCheck`): each one's answer and the first step at which it
departed from the original, which REFLECT's localizer reads as evidence (as delimited data).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import TypedDict, Unpack

from reflect_otel.errors import ReplayError
from reflect_otel.flagging.calibration import ConfidenceCalibration, Resampling
from reflect_otel.flagging.flag_score import ScoreMap, flagged, uncalibrated_score
from reflect_otel.flagging.judge import same_answer
from reflect_otel.flagging.run_features import is_value, run_features
from reflect_otel.flagging.verifiers import Verifier, bound_to, extract_answer
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.replay import ReplayRequest, SamplesRuns
from reflect_otel.settings import settings
from reflect_otel.trace import Step, StructuredTrace
from reflect_otel.verdict import ConsistencyCheck, Resample, Verdict, shown_answer

__all__ = [
    "ConsensusVerifier",
    "ConsistencyVerifier",
    "answers_agree",
    "check_consistency",
    "consistency_basis",
    "consistency_verdict",
    "drawn_for_sampling",
    "first_divergence",
    "majority_answer",
    "render_consistency",
    "resampling_of",
    "revoted",
    "sequential_stop",
    "undecided",
]

_NOT_RUN = "not run: too many resamples failed to decide"
_NO_ADAPTER = (
    "no replay adapter that can resample this agent: pass one to observe(), or give its --replay-config endpoint "
    "resample = true"
)
_MAX_KEPT_ANSWER = 2000  # answers are compared (and voted on) within this bound; prompts show less (verdict.py)


def drawn_for_sampling(trace_id: str, rate: float) -> bool:
    """Whether the run ``trace_id`` is among the share ``rate`` of runs checked: a hash of its id, so the same run
    is drawn (or not) by every collector and on every retry."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.sha256(trace_id.encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def _shape(step: Step) -> tuple[str, str]:
    """What a step decided, for comparing two runs: its tool and arguments, or its text when it called none."""
    if step.tool_name:
        return step.tool_name, json.dumps(step.tool_args, sort_keys=True, default=str)
    return "", " ".join(step.reasoning.split()).casefold()


def first_divergence(original: StructuredTrace, other: StructuredTrace) -> int | None:
    """The 1-based index of the first step at which ``other`` decided differently from ``original`` (another
    tool, other arguments, other text, or one run ending first); None when they decided the same throughout."""
    for position, (mine, theirs) in enumerate(zip(original.steps, other.steps, strict=False), start=1):
        if _shape(mine) != _shape(theirs):
            return position
    if len(original.steps) != len(other.steps):
        return min(len(original.steps), len(other.steps)) + 1
    return None


def answers_agree(original: str | None, answer: str | None, *, question: str = "") -> bool:
    """Two answers to ``question`` are the same under the judge: the same value asserted, each way
    (:func:`~reflect_otel.flagging.judge.same_answer`; None only matches None)."""
    return same_answer(original, answer, question=question)


def _tokens(trace: StructuredTrace) -> int:
    return sum((s.prompt_tokens or 0) + (s.completion_tokens or 0) for s in trace.steps)


def _one_resample(runs: SamplesRuns, trace: StructuredTrace, temperature: float) -> object:
    """One run again, or the reason it gave none. Any exception of the adapter (a user's, or an endpoint's reply
    read wrong) is a failed resample, never the caller's: the check runs on the worker, beside other runs."""
    try:
        results = list(runs.resample(ReplayRequest.resampling(trace, temperature), samples=1))[:1]
    except ReplayError as error:
        return str(error)[:300]
    except Exception as error:  # a third-party adapter's bug fails this resample, not the worker
        return f"the adapter failed: {type(error).__name__}: {error}"[:300]
    if not results:
        return "the adapter returned no run for the resample asked"
    return results[0]


def _kept(trace: StructuredTrace, original: str | None, result: object) -> Resample:
    """One resample as kept: its answer, agreement and divergence, or why it has none."""
    rerun = getattr(result, "trace", None)
    if isinstance(result, str) or not isinstance(rerun, StructuredTrace):
        error = result if isinstance(result, str) else "the adapter returned a resample without a trace"
        return Resample(answer=None, agrees=False, error=error)
    returned = getattr(result, "final_answer", None)
    answer = extract_answer(returned if isinstance(returned, str) and returned else rerun.final_answer)
    return Resample(
        answer=answer[:_MAX_KEPT_ANSWER] if answer else None,
        agrees=answers_agree(original, answer, question=trace.question),
        diverged_at=first_divergence(trace, rerun),
        steps=len(rerun.steps),
        agent_tokens=_tokens(rerun),
    )


def sequential_stop(agreeing: int, disagreeing: int, *, stop_lead: int | None) -> bool:
    """Whether resampling stops with ``agreeing`` finished resamples that reproduced the answer and ``disagreeing``
    that did not: one side leads the other by ``stop_lead`` (a sequential test of "most resamples reproduce it"
    against "most do not"); never without a rule (None or 0: all resamples asked are run)."""
    return bool(stop_lead) and abs(agreeing - disagreeing) >= (stop_lead or 0)


def check_consistency(
    trace: StructuredTrace,
    runs: SamplesRuns,
    *,
    samples: int,
    temperature: float,
    stop_lead: int | None = None,
) -> ConsistencyCheck:
    """Resample the run at most ``samples`` times, one run per request (a failed one costs only itself: the others'
    answers and tokens are kept), and compare each answer with the original's, stopping as :func:`sequential_stop`
    says. A resample the adapter refused, failed or did not return is kept with its error and left out of the
    agreement; once so many failed that the check cannot decide, the rest are not run."""
    original = extract_answer(trace.final_answer)
    kept: list[Resample] = []
    for _ in range(samples):
        if 2 * (samples - sum(1 for r in kept if r.error is not None)) <= samples:
            # too many failed for the check to decide: the rest would cost agent runs and decide nothing
            kept.append(Resample(answer=None, agrees=False, error=_NOT_RUN))
            continue
        kept.append(_kept(trace, original, _one_resample(runs, trace, temperature)))
        agreeing = sum(1 for r in kept if r.error is None and r.agrees)
        disagreeing = sum(1 for r in kept if r.error is None and not r.agrees)
        if sequential_stop(agreeing, disagreeing, stop_lead=stop_lead):
            break
    return ConsistencyCheck(
        original_answer=original[:_MAX_KEPT_ANSWER] if original else None,
        runs=tuple(kept),
        temperature=temperature,
        samples=samples,
        stop_lead=stop_lead or None,
    )


def revoted(check: ConsistencyCheck, *, question: str) -> ConsistencyCheck:
    """``check`` with each finished resample's agreement judged again by the judge as it is now: a check kept from
    before the judge changed votes as a new one would."""
    runs = []
    for run in check.runs:
        agrees = (
            run.agrees if run.error is not None else answers_agree(check.original_answer, run.answer, question=question)
        )
        runs.append(run.model_copy(update={"agrees": agrees}))
    return check.model_copy(update={"runs": tuple(runs)})


def _decides(check: ConsistencyCheck) -> bool:
    """Enough resamples finished: the stopping rule decided, or more than half of those asked finished."""
    agreeing = check.agreeing
    stopped = sequential_stop(agreeing, check.finished - agreeing, stop_lead=check.stop_lead)
    return stopped or 2 * check.finished > max(check.samples, len(check.runs))


def consistency_basis(check: ConsistencyCheck, *, threshold: float = 0.5) -> str | None:
    """``consistency_disagree`` (the share of resamples not reproducing the answer reaches ``threshold``),
    ``consistency_agree`` (all reproduce it) or ``consistency_partial`` (the rest); None when too few resamples
    finished to decide, or the run gave no answer to compare (that is the evidence checks' finding to make)."""
    if not _decides(check) or check.original_answer is None:
        return None
    if flagged(1.0 - check.agreeing / check.finished, threshold):
        return "consistency_disagree"
    return "consistency_agree" if check.agreeing == check.finished else "consistency_partial"


def _failures(check: ConsistencyCheck) -> list[str]:
    """Why resamples failed, in the order they ran (the ones never run for it say nothing)."""
    return [r.error for r in check.runs if r.error and r.error != _NOT_RUN]


def undecided(check: ConsistencyCheck) -> str:
    """Why ``check`` decides nothing (:func:`consistency_basis` is None): no answer, or too few resamples finished
    (with the first reason one failed)."""
    if check.original_answer is None:
        return "the run gave no answer to compare"
    errors = _failures(check)
    why = f"too few resamples finished to decide ({check.finished} of {len(check.runs)})"
    return why + (f": {errors[0]}" if errors else "")


def render_consistency(check: ConsistencyCheck) -> str:
    """The resamples as evidence lines for an auditor's prompt (the caller shows them as data)."""
    lines = [
        f"The agent was run again on the same input {len(check.runs)} times (sampled at temperature "
        f"{check.temperature:g}): {check.summary()}."
    ]
    for number, run in enumerate(check.runs, start=1):
        if run.error is not None:
            lines.append(f"Resample {number}: did not finish.")
            continue
        where = f"; it first decided otherwise at step {run.diverged_at}" if run.diverged_at else ""
        lines.append(
            f"Resample {number}: answered {shown_answer(run.answer)} ({'the same' if run.agrees else 'different'})"
            f"{where}."
        )
    return "\n".join(lines)


class ConsistencyOptions(TypedDict, total=False):
    """How a :class:`ConsistencyVerifier` resamples: ``samples`` at most (3), at ``temperature`` (0.7), on the share
    ``sample_rate`` of runs (1.0), stopping early by ``stop_lead`` (None: all ``samples`` run), flagging at the score
    ``threshold`` (None: ``REFLECT_FLAG_THRESHOLD``)."""

    samples: int
    temperature: float
    sample_rate: float
    stop_lead: int | None
    threshold: float | None


class ConsistencyVerifier:
    """A :class:`~reflect_otel.flagging.verifiers.Verifier` for runs without an expected answer, through the run's replay
    adapter (bound per run with :meth:`with_runs`), resampling as :class:`ConsistencyOptions` says. Runs not drawn by
    ``sample_rate`` are ``UNCERTAIN``, with no agent run spent."""

    name = "consistency"

    def __init__(
        self,
        runs: SamplesRuns | None = None,
        *,
        calibration: ConfidenceCalibration | None = None,
        **options: Unpack[ConsistencyOptions],
    ) -> None:
        samples = options.get("samples", 3)
        sample_rate = options.get("sample_rate", 1.0)
        stop_lead = options.get("stop_lead")
        threshold = options.get("threshold")
        if samples < 1:
            raise ValueError("samples must be at least 1")
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError("sample_rate must lie in [0, 1]")
        if stop_lead is not None and stop_lead < 0:
            raise ValueError("stop_lead must be at least 0 (0 or None: run every resample asked)")
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise ValueError("threshold must lie in [0, 1]")
        self.runs = runs
        self.samples = samples
        self.temperature = options.get("temperature", 0.7)
        self.sample_rate = sample_rate
        self.stop_lead = stop_lead or None
        self.threshold = threshold if threshold is not None else settings().flag_threshold
        self.calibration = calibration if calibration is not None else ConfidenceCalibration.from_env()

    def with_runs(self, runs: SamplesRuns | None) -> ConsistencyVerifier:
        """The same verifier resampling through ``runs`` (the adapter found for one run)."""
        return ConsistencyVerifier(
            runs,
            calibration=self.calibration,
            samples=self.samples,
            temperature=self.temperature,
            sample_rate=self.sample_rate,
            stop_lead=self.stop_lead,
            threshold=self.threshold,
        )

    def with_original(self, trace: StructuredTrace, verdict: Verdict) -> ConsensusVerifier:
        """The judge of ``trace``'s replays: the agent's consensus where the check found one (else uncertain)."""
        return ConsensusVerifier(self.with_runs(None), trace, verdict.consistency, self.calibration)

    def check(self, trace: StructuredTrace) -> ConsistencyCheck | str:
        """The check, or why it was not made (no adapter, not drawn)."""
        if self.runs is None:
            return _NO_ADAPTER
        if not drawn_for_sampling(trace.trace_id, self.sample_rate):
            return f"not drawn for a consistency check (sample rate {self.sample_rate:g})"
        return check_consistency(
            trace, self.runs, samples=self.samples, temperature=self.temperature, stop_lead=self.stop_lead
        )

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        outcome = self.check(trace)
        if isinstance(outcome, str):
            return Verdict(verifier=self.name, is_correct=None, confidence=None, label="UNCERTAIN", reasoning=outcome)
        return consistency_verdict(trace, outcome, self.name, self.calibration, threshold=self.threshold)


def consistency_verdict(
    trace: StructuredTrace,
    check: ConsistencyCheck,
    verifier: str,
    calibration: ConfidenceCalibration,
    *,
    threshold: float,
) -> Verdict:
    """The verdict of one check of ``trace`` under the module's rule, its reasoning naming the answers the resamples
    gave. Its score is the map ``calibration`` fitted for ``verifier`` (basis ``score_high`` or ``score_low``, no
    measured confidence: the score is the estimate), else the share of resamples that did not reproduce the answer
    (a consistency basis, its confidence the precision ``calibration`` measured for ``verifier``'s verdicts on it)."""
    basis = consistency_basis(check, threshold=threshold)
    if basis is None:
        return _undecided_verdict(check, verifier)
    fitted = calibration.score_map(verifier)
    if fitted is not None:
        return _scored_verdict(trace, check, verifier, fitted, threshold)
    measured = calibration.measured(basis, verifier=verifier, resampling=resampling_of(check), threshold=threshold)
    return Verdict(
        verifier=verifier,
        is_correct=basis != "consistency_disagree",
        extracted_answer=check.original_answer,
        confidence=measured.rate if measured is not None else None,
        score=uncalibrated_score(verifier, run_features(trace, check)),
        label="HIGH_ERROR_SIGNAL" if basis == "consistency_disagree" else "LOW_ERROR_SIGNAL",
        reasoning=f"{basis}: {check.summary()}" + (f" (precision {measured.text()})" if measured else ""),
        basis=basis,
        measured=measured,
        consistency=check,
    )


def resampling_of(check: ConsistencyCheck) -> Resampling:
    """How ``check`` resampled, as a calibration's measurements are told apart."""
    return Resampling(check.samples, check.temperature, check.stop_lead)


def _undecided_verdict(check: ConsistencyCheck, verifier: str) -> Verdict:
    """The uncertain verdict of a check that decided nothing (too few resamples finished, or a split)."""
    errors = _failures(check)
    return Verdict(
        verifier=verifier,
        is_correct=None,
        confidence=None,
        label="UNCERTAIN",
        reasoning=undecided(check),
        consistency=check,
        # too few finished is a failed check (a benchmark counts it apart and measures it again), not a verdict
        error=errors[0] if errors and check.original_answer is not None else None,
    )


def _scored_verdict(
    trace: StructuredTrace, check: ConsistencyCheck, verifier: str, fitted: ScoreMap, threshold: float
) -> Verdict:
    """The verdict of ``check`` on the map ``fitted`` (basis ``score_high`` or ``score_low``: the score is the
    estimate, no measured confidence)."""
    score = fitted.score(run_features(trace, check))
    high = flagged(score, threshold)
    return Verdict(
        verifier=verifier,
        is_correct=not high,
        extracted_answer=check.original_answer,
        confidence=None,
        score=score,
        label="HIGH_ERROR_SIGNAL" if high else "LOW_ERROR_SIGNAL",
        reasoning=f"score {score:.2f} {'reaches' if high else 'is below'} the threshold {threshold:g} (the map "
        f"fitted on {fitted.fitted_on} labelled runs: {fitted.describe()}); {check.summary()}",
        basis="score_high" if high else "score_low",
        consistency=check,
    )


def majority_answer(check: ConsistencyCheck, *, question: str = "") -> str | None:
    """The answer most resamples gave when more than half of them gave it (under the judge, as answers to
    ``question``), else None: the agent's own consensus, used to judge a replay's answer where no answer is known.
    An answer that is no value (:func:`~reflect_otel.flagging.run_features.is_value`: the agent's advice about its own error)
    votes for nothing, and counts among the finished resamples all the same."""
    answers = [r.answer for r in check.runs if r.error is None and is_value(r.answer)]
    if not answers or not _decides(check):  # too few finished: one run is no consensus
        return None
    # each answer counted under the first one it matches: equal answers written differently vote together
    groups = Counter(
        next(j for j, other in enumerate(answers) if answers_agree(other, answer, question=question))
        for answer in answers
    )
    leader, count = groups.most_common(1)[0]
    return answers[leader] if 2 * count > check.finished else None


class ConsensusVerifier:
    """The judge of a run's replays where no answer is known (online attribution, ``reflect-proxy``).

    Where most of the run's resamples agreed on an answer other than the run's, a replay is right when it gives that
    answer and wrong otherwise (basis ``consistency_majority``): the agent's own consensus stands in for the
    expected answer. Without such a consensus, ``fallback`` judges the replay (it does not resample replays), and
    only its "wrong" stands: its "right" (an audit finding no deviation, whose precision on replays nobody measured)
    is no proof a correction worked, so the replay is left not judged."""

    name = "consensus"

    def __init__(
        self,
        fallback: Verifier,
        original: StructuredTrace,
        check: ConsistencyCheck | None,
        calibration: ConfidenceCalibration,
    ) -> None:
        self.fallback = fallback
        self.original = original
        self.check = check
        self.calibration = calibration

    def with_llm(self, llm: StructuredLLM) -> ConsensusVerifier:
        return ConsensusVerifier(bound_to(self.fallback, llm), self.original, self.check, self.calibration)

    @property
    def unprovable(self) -> str | None:
        """Why no replay of the run can be judged right (replaying it then proves nothing), or None."""
        if self.check is None:
            return "the run was not resampled, so no consensus of the agent's can judge a replay right"
        consensus = majority_answer(self.check, question=self.original.question)
        if consensus is None:
            return "the agent's resamples agreed on no answer, so none can judge a replay right"
        if answers_agree(consensus, self.check.original_answer, question=self.original.question):
            return "the agent's resamples agreed with the run's own answer, so none can judge a replay right"
        return None

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        check = self.check
        why = self.unprovable
        if check is None or why is not None:
            return _unproven(self.fallback.verify(trace, expected=None), why or "")
        consensus = majority_answer(check, question=self.original.question)
        assert consensus is not None  # unprovable says so otherwise
        answer = extract_answer(trace.final_answer)
        # compared as the resamples' answers were kept (a long consensus is held to the same bound)
        right = answer is not None and answers_agree(
            answer[:_MAX_KEPT_ANSWER], consensus, question=self.original.question
        )
        measured = self.calibration.measured(
            "consistency_majority", verifier=self.name, resampling=resampling_of(check)
        )
        return Verdict(
            verifier=self.name,
            is_correct=right,
            extracted_answer=answer,
            confidence=measured.rate if measured is not None else None,
            label="LOW_ERROR_SIGNAL" if right else "HIGH_ERROR_SIGNAL",
            reasoning=f"the replay answered {shown_answer(answer)}; the agent's resamples of the run agreed on "
            f"{shown_answer(consensus)} "
            f"({check.summary()})",
            basis="consistency_majority",
            measured=measured,
        )


def _unproven(verdict: Verdict, why: str) -> Verdict:
    """``verdict`` on a replay, its "right" withdrawn (see :class:`ConsensusVerifier`): a "wrong" stands. The
    withdrawn verdict keeps no basis (it decided nothing) and says what the fallback found."""
    if verdict.is_correct is not True:
        return verdict
    found = verdict.reasoning.replace(f"audit ({_NO_ADAPTER}): ", "audit: ")  # replays are never resampled
    return verdict.model_copy(
        update={
            "is_correct": None,
            "label": "UNCERTAIN",
            "confidence": None,
            "measured": None,
            "basis": None,
            "reasoning": f"not judged: {why}; a 'right' of {verdict.verifier} proves no replay ({found})",
        }
    )
