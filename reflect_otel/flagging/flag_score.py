"""How likely a run is wrong, as a score in [0, 1], and the flag that score gives against a threshold.

**Fitted.** A :class:`ScoreMap` is a logistic regression of "the run was wrong" on a verifier's features
(:mod:`reflect_otel.flagging.run_features`), fitted on labelled runs of your agent (``python -m benchmarks.flagging --live
RESULTS``, kept in a calibration file with the runs it was fitted on: :mod:`reflect_otel.flagging.calibration`). Its score
estimates the probability that a run like this one is wrong, on runs like those it was fitted on. Features are
standardised on the fitting runs and the weights held small by an L2 penalty (``ridge``), so that a feature that
separates the fitting runs perfectly does not take an unbounded weight.

**Uncalibrated.** Without a fitted map a verifier's score is :func:`uncalibrated_score`: 1 on a critical evidence
finding (where the verifier reads evidence), else the share of the agent's resamples that did not reproduce the
answer. It ranks runs, but it is no probability.

**The flag.** A run is flagged when its score reaches the threshold (``REFLECT_FLAG_THRESHOLD``, default 0.5): a
lower threshold flags more wrong runs and more right ones with them (each flagged right run costs an attribution and
shows a false alarm), a higher one fewer of both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reflect_otel.flagging.run_features import CHEAP_FEATURES, FEATURES, RESAMPLE_FEATURES, Feature, RunFeatures

__all__ = [
    "VERIFIER_FEATURES",
    "ScoreMap",
    "fit_score_map",
    "flagged",
    "recall_threshold",
    "uncalibrated_score",
]

VERIFIER_FEATURES: dict[str, tuple[Feature, ...]] = {
    "evidence": CHEAP_FEATURES,
    "consistency": RESAMPLE_FEATURES,
    "combined": FEATURES,
}
"""What each verifier's score may weigh, by the name its verdicts carry: the evidence verifier the trace alone, the
consistency verifier its resamples alone, the combined verifier both."""

_ITERATIONS = 100
_TOLERANCE = 1e-10


def flagged(score: float, threshold: float) -> bool:
    """Whether a run scored ``score`` is flagged at ``threshold``: the score reaches it."""
    return score >= threshold


def uncalibrated_score(verifier: str, features: RunFeatures) -> float | None:
    """The score of a verifier without a fitted map (see the module); None when it has nothing to score (no
    critical finding for the evidence verifier, no decided check for the others)."""
    reads_evidence = verifier in ("evidence", "combined")
    if reads_evidence and features.critical_evidence:
        return 1.0
    if verifier == "evidence":
        return None
    return features.disagreement


def _sigmoid(value: float) -> float:
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    exp = math.exp(value)
    return exp / (1.0 + exp)


class ScoreMap(BaseModel):
    """A fitted logistic map from features to the probability that a run is wrong (see the module):
    ``sigmoid(intercept + sum(weight * (value - mean) / scale))``. ``fitted_on`` counts the runs it was fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    features: tuple[Feature, ...]
    means: tuple[float, ...]
    scales: tuple[float, ...]
    weights: tuple[float, ...]
    intercept: float
    ridge: float = Field(ge=0)
    fitted_on: int = Field(ge=1)
    wrong: int = Field(ge=0)

    @model_validator(mode="after")
    def _aligned(self) -> ScoreMap:
        if not len(self.features) == len(self.means) == len(self.scales) == len(self.weights):
            raise ValueError("features, means, scales and weights must have one entry per feature")
        if any(scale <= 0 for scale in self.scales):
            raise ValueError("every scale must be positive")
        return self

    def score(self, features: RunFeatures) -> float:
        """The probability the map gives ``features`` of a wrong run; a feature the run lacks reads as its mean on
        the fitting runs (it then moves the score not at all)."""
        total = self.intercept
        for name, mean, scale, weight in zip(self.features, self.means, self.scales, self.weights, strict=True):
            value = features.value(name)
            total += weight * (((mean if value is None else value) - mean) / scale)
        return round(_sigmoid(total), 6)

    def describe(self) -> str:
        """``feature +1.23, feature -0.40, ...``: each weight on the standardised feature, largest first."""
        ordered = sorted(zip(self.features, self.weights, strict=True), key=lambda pair: -abs(pair[1]))
        return ", ".join(f"{name} {weight:+.2f}" for name, weight in ordered)


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """``matrix x = vector`` by Gaussian elimination with partial pivoting (the matrix is small and, with a ridge,
    positive definite)."""
    size = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(size)]
    for column in range(size):
        pivot = max(range(column, size), key=lambda r: abs(rows[r][column]))
        rows[column], rows[pivot] = rows[pivot], rows[column]
        lead = rows[column][column]
        if abs(lead) < 1e-12:
            raise ValueError("the features are degenerate: no unique fit")
        for r in range(size):
            if r != column:
                factor = rows[r][column] / lead
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[column], strict=True)]
    return [rows[i][size] / rows[i][i] for i in range(size)]


def fit_score_map(
    runs: Sequence[RunFeatures], wrong: Sequence[bool], *, features: Sequence[Feature], ridge: float = 1.0
) -> ScoreMap:
    """The logistic map fitted on ``runs`` labelled ``wrong`` (Newton's method on the penalised likelihood, the
    intercept unpenalised). A feature some run lacks, or one that never varies, is left out of the map; raises
    :class:`ValueError` when the runs are not both right and wrong, or when no feature is left."""
    if len(runs) != len(wrong):
        raise ValueError("one label per run")
    if not any(wrong) or all(wrong):
        raise ValueError("fitting a score needs both right and wrong runs")
    kept, means, scales = _standardised(runs, features)
    if not kept:
        raise ValueError(f"none of the features {', '.join(features)} is known and varies on every run")
    rows = [
        [1.0, *(((run.value(n) or 0.0) - m) / s for n, m, s in zip(kept, means, scales, strict=True))] for run in runs
    ]
    beta = _newton([1.0 if w else 0.0 for w in wrong], rows, ridge)
    return ScoreMap(
        features=tuple(kept),
        means=tuple(round(m, 9) for m in means),
        scales=tuple(round(s, 9) for s in scales),
        weights=tuple(round(b, 9) for b in beta[1:]),
        intercept=round(beta[0], 9),
        ridge=ridge,
        fitted_on=len(runs),
        wrong=sum(1 for w in wrong if w),
    )


def _standardised(
    runs: Sequence[RunFeatures], features: Sequence[Feature]
) -> tuple[list[Feature], list[float], list[float]]:
    """The features every run has and that vary, with their means and standard deviations over ``runs``."""
    kept: list[Feature] = []
    means: list[float] = []
    scales: list[float] = []
    for name in features:
        values = [run.value(name) for run in runs]
        if any(v is None for v in values):
            continue
        present = [float(v) for v in values if v is not None]
        mean = sum(present) / len(present)
        scale = math.sqrt(sum((v - mean) ** 2 for v in present) / len(present))
        if scale > 1e-9:
            kept.append(name)
            means.append(mean)
            scales.append(scale)
    return kept, means, scales


def _newton(labels: Sequence[float], rows: Sequence[Sequence[float]], ridge: float) -> list[float]:
    """The weights (intercept first) maximising the ridge-penalised likelihood of ``labels`` given ``rows``."""
    size = len(rows[0])
    beta = [0.0] * size
    beta[0] = math.log(sum(labels) / (len(labels) - sum(labels)))
    for _ in range(_ITERATIONS):
        predicted = [_sigmoid(sum(b * x for b, x in zip(beta, row, strict=True))) for row in rows]
        gradient = [
            sum((y - p) * row[j] for y, p, row in zip(labels, predicted, rows, strict=True))
            - (ridge * beta[j] if j else 0.0)
            for j in range(size)
        ]
        hessian = [
            [
                sum(p * (1 - p) * row[i] * row[j] for p, row in zip(predicted, rows, strict=True))
                + (ridge if i == j and i else 0.0)
                for j in range(size)
            ]
            for i in range(size)
        ]
        step = _solve(hessian, gradient)
        beta = [b + s for b, s in zip(beta, step, strict=True)]
        if max(abs(s) for s in step) < _TOLERANCE:
            break
    return beta


def recall_threshold(scores: Sequence[float], wrong: Sequence[bool], *, recall: float) -> float | None:
    """The highest threshold at which the runs' ``scores`` flag at least ``recall`` of the wrong runs (flagging
    fewer right runs than any lower one); None when there is no wrong run."""
    wrong_scores = sorted((s for s, w in zip(scores, wrong, strict=True) if w), reverse=True)
    if not wrong_scores:
        return None
    needed = max(1, math.ceil(recall * len(wrong_scores) - 1e-9))
    return wrong_scores[needed - 1]
