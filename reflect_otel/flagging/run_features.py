"""What a run shows of being wrong, as numbers a flagging score weighs (:mod:`reflect_otel.flagging.flag_score`).

Two kinds. **Cheap** features are read from the trace alone, with no model call and no agent run: a critical
evidence finding, the failed calls and the empty results the evidence checks found (:mod:`reflect_otel.flagging.evidence`),
an answer that is not a value, the answer's length, the steps the run took, and the mean log-probability of the
tokens of the agent's answer turn where its endpoint returned them (the trace's last model step that carries one).
**Resample** features need the consistency check (:mod:`reflect_otel.flagging.consistency`): the share of the agent's
resamples that did not reproduce the answer in substance, and the share of them that answered no value at all.

A feature the run cannot give is None (no log-probabilities recorded, no check made): a score fitted without it
never reads it, and one fitted with it reads its calibration mean instead (:class:`~reflect_otel.flagging.flag_score.ScoreMap`).
Counts enter as ``log(1 + count)``, so one more failed call weighs less after several.
"""

from __future__ import annotations

import math
import re
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from reflect_otel.flagging._asserted import extract_answer
from reflect_otel.flagging.evidence import FindingKind, Severity, find_evidence
from reflect_otel.reading import _tool_text
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import ConsistencyCheck

__all__ = [
    "CHEAP_FEATURES",
    "FEATURES",
    "RESAMPLE_FEATURES",
    "Feature",
    "RunFeatures",
    "is_value",
    "run_features",
]

Feature = Literal[
    "critical_evidence",
    "tool_errors",
    "empty_results",
    "not_a_value",
    "answer_words",
    "steps",
    "answer_logprob",
    "disagreement",
    "resample_not_values",
]
FEATURES: tuple[Feature, ...] = get_args(Feature)
CHEAP_FEATURES: tuple[Feature, ...] = FEATURES[:7]
"""Read from the trace alone (no model call, no agent run)."""
RESAMPLE_FEATURES: tuple[Feature, ...] = FEATURES[7:]
"""Read from the consistency check's resamples."""

_WORD = re.compile(r"\w+")


class RunFeatures(BaseModel):
    """One run's features (see the module); None where the run cannot give one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    critical_evidence: float = Field(description="1 when a critical evidence finding shows the run failed, else 0.")
    tool_errors: float = Field(description="log(1 + the failed tool calls the evidence checks found).")
    empty_results: float = Field(description="log(1 + the calls that returned an empty result).")
    not_a_value: float = Field(description="1 when the answer is no value (see is_value), else 0.")
    answer_words: float = Field(description="log(1 + the words of the answer the final message states).")
    steps: float = Field(description="log(1 + the run's steps).")
    answer_logprob: float | None = Field(
        default=None, description="Mean token log-probability of the answer turn, where the endpoint returned it."
    )
    disagreement: float | None = Field(
        default=None, description="Share of the finished resamples that did not reproduce the answer in substance."
    )
    resample_not_values: float | None = Field(
        default=None, description="Share of the finished resamples whose answer is no value."
    )

    def value(self, feature: Feature) -> float | None:
        found: float | None = getattr(self, feature)
        return found


def is_value(answer: str | None) -> bool:
    """Whether the answer a final message states is a value (one or a list): not none, not an error or a refusal
    (it reads as a failed call's result), and not a text laid out in lines or holding code, as the agent's advice
    about its own error is ("To fix the error, you need to ... the corrected query: ```sql ...```"). Its length is a
    feature of its own (``answer_words``)."""
    if answer is None or not answer.strip():
        return False
    return not ("\n" in answer.strip() or "```" in answer or _tool_text.reads_as_error(answer))


def _log_count(count: int) -> float:
    return round(math.log1p(max(0, count)), 6)


def _answer_logprob(trace: StructuredTrace) -> float | None:
    for step in reversed(trace.steps):
        if step.logprob is not None:
            return step.logprob
    return None


def run_features(trace: StructuredTrace, check: ConsistencyCheck | None = None) -> RunFeatures:
    """The run's features, its resample features from ``check`` where it decided anything (enough resamples
    finished and the run gave an answer), else None."""
    findings = find_evidence(trace)
    kinds = [f.kind for f in findings]
    answer = extract_answer(trace.final_answer)
    disagreement = resample_not_values = None
    finished = [r for r in check.runs if r.error is None] if check is not None else []
    if check is not None and check.original_answer is not None and finished:
        disagreement = round(1.0 - sum(1 for r in finished if r.agrees) / len(finished), 6)
        not_values = sum(1 for r in finished if not is_value(r.answer))
        resample_not_values = round(not_values / len(finished), 6)
    return RunFeatures(
        critical_evidence=float(any(f.severity is Severity.CRITICAL for f in findings)),
        tool_errors=_log_count(kinds.count(FindingKind.TOOL_ERROR)),
        empty_results=_log_count(kinds.count(FindingKind.EMPTY_RESULT)),
        not_a_value=float(not is_value(answer)),
        answer_words=_log_count(len(_WORD.findall(answer or ""))),
        steps=_log_count(len(trace.steps)),
        answer_logprob=_answer_logprob(trace),
        disagreement=disagreement,
        resample_not_values=resample_not_values,
    )
