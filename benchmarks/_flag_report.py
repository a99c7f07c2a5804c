"""The flagging benchmark's report of one verifier's scores against the labels: how well the score ranks a wrong run
above a right one (AUROC with DeLong's 95% interval), the flag at a threshold (recall, precision and specificity with
Wilson intervals, beside the base rate and flagging everything), the operating point that flags 80% of the wrong
runs, and what each feature adds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from reflect_otel.flagging._stats import auroc, wilson
from reflect_otel.flagging.flag_score import ScoreMap, fit_score_map, flagged, recall_threshold
from reflect_otel.flagging.run_features import Feature, RunFeatures

__all__ = [
    "Scored",
    "feature_lines",
    "flag_line",
    "operating_lines",
    "out_of_fold_scores",
    "samples_line",
]


@dataclass(frozen=True, slots=True)
class Scored:
    """One labelled run's score from one verifier; ``score`` None when the verifier gave none (ranked below every
    scored run, never flagged), ``failed`` when the verifier failed on it (counted apart, never scored)."""

    wrong: bool
    score: float | None
    failed: bool = False


def _rate(hits: int, total: int) -> str:
    return f"{hits / total:.2f}" if total else "n/a"


def _interval(hits: int, total: int) -> str:
    low, high = wilson(hits, total)
    return f"[{low:.2f}, {high:.2f}] ({hits} of {total})" if total else "(none)"


def _ranked(runs: Sequence[Scored]) -> tuple[list[float], list[float]]:
    """The scores of the wrong and of the right runs the verifier did not fail on; a run without a score ranks
    below every scored run (it is never flagged)."""
    kept = [r for r in runs if not r.failed]
    lowest = min((r.score for r in kept if r.score is not None), default=0.0) - 1.0
    wrong = [r.score if r.score is not None else lowest for r in kept if r.wrong]
    right = [r.score if r.score is not None else lowest for r in kept if not r.wrong]
    return wrong, right


def _counts(runs: Sequence[Scored], threshold: float) -> tuple[int, int, int, int]:
    """(wrong flagged, wrong runs, right flagged, right runs) at ``threshold``, failed runs left out."""
    kept = [r for r in runs if not r.failed]
    hit = [r.score is not None and flagged(r.score, threshold) for r in kept]
    wrong_flagged = sum(1 for r, h in zip(kept, hit, strict=True) if h and r.wrong)
    right_flagged = sum(1 for r, h in zip(kept, hit, strict=True) if h and not r.wrong)
    return wrong_flagged, sum(r.wrong for r in kept), right_flagged, sum(not r.wrong for r in kept)


def _auroc_text(runs: Sequence[Scored]) -> tuple[str, str]:
    wrong, right = _ranked(runs)
    if not wrong or not right:
        return "n/a", "AUROC not defined (the runs are not both right and wrong)"
    area, low, high = auroc(wrong, right)
    unscored = sum(1 for r in runs if not r.failed and r.score is None)
    return f"{area:.2f}", (
        f"AUROC 95% [{low:.2f}, {high:.2f}] (DeLong; {len(wrong)} wrong and {len(right)} right runs"
        + (f"; {unscored} without a score ranked lowest" if unscored else "")
        + ")"
    )


def flag_line(name: str, runs: Sequence[Scored], threshold: float) -> list[str]:
    """The verifier's line ``flagging verifier=NAME runs=N auroc=X recall=R precision=P specificity=S
    base_rate=B`` at ``threshold``, then its intervals and flagging everything beside it."""
    wrong_flagged, wrong, right_flagged, right = _counts(runs, threshold)
    area, area_text = _auroc_text(runs)
    failed = sum(1 for r in runs if r.failed)
    base = wrong / (wrong + right) if wrong + right else 0.0
    right_cleared = right - right_flagged
    return [
        f"flagging verifier={name} runs={len(runs)} auroc={area} recall={_rate(wrong_flagged, wrong)} "
        f"precision={_rate(wrong_flagged, wrong_flagged + right_flagged)} "
        f"specificity={_rate(right_cleared, right)} base_rate={base:.2f}",
        f"  at threshold {threshold:g}: recall 95% {_interval(wrong_flagged, wrong)} wrong runs flagged; precision "
        f"95% {_interval(wrong_flagged, wrong_flagged + right_flagged)} flagged runs wrong; specificity 95% "
        f"{_interval(right_cleared, right)} right runs left unflagged; the verifier failed on {failed} runs",
        f"  {area_text}",
        f"  flagging everything: recall 1.00, precision {base:.2f} (the base rate), specificity 0.00",
    ]


def operating_lines(
    runs: Sequence[Scored], *, recall: float, calibrated: float | None, calibration_name: str
) -> list[str]:
    """Where the score flags ``recall`` of the wrong runs: at the threshold the calibration chose on its own sample
    (``calibrated``; the out-of-sample operating point), and at the highest threshold that reaches it on these runs
    (chosen on them: descriptive of this sample's ROC, not a threshold to ship)."""
    lines = []
    if calibrated is not None:
        wrong_flagged, wrong, right_flagged, right = _counts(runs, calibrated)
        lines.append(
            f"  at {calibration_name}'s recall-{recall:g} threshold {calibrated:.3g}: recall "
            f"{_rate(wrong_flagged, wrong)}, specificity {_rate(right - right_flagged, right)} "
            f"{_interval(right - right_flagged, right)}, precision {_rate(wrong_flagged, wrong_flagged + right_flagged)}"
        )
    kept = [r for r in runs if not r.failed]
    scores = [r.score if r.score is not None else float("-inf") for r in kept]
    chosen = recall_threshold(scores, [r.wrong for r in kept], recall=recall)
    if chosen is None or chosen == float("-inf"):
        lines.append(f"  no threshold flags {recall:.0%} of the wrong runs short of flagging runs with no score")
        return lines
    wrong_flagged, wrong, right_flagged, right = _counts(runs, chosen)
    lines.append(
        f"  at the highest threshold reaching recall {recall:g} on these runs ({chosen:.3g}, chosen on them): recall "
        f"{_rate(wrong_flagged, wrong)}, specificity {_rate(right - right_flagged, right)} "
        f"{_interval(right - right_flagged, right)}, precision {_rate(wrong_flagged, wrong_flagged + right_flagged)}"
    )
    return lines


def samples_line(needed: Sequence[int]) -> str:
    """How many agent runs each checked run needed, as a histogram: ``2: 40, 4: 9, 5: 11``."""
    counts = Counter(needed)
    return ", ".join(f"{n}: {counts[n]}" for n in sorted(counts))


def _oriented(name: Feature, runs: Sequence[RunFeatures], wrong: Sequence[bool], sign: float) -> str:
    scored = [Scored(w, (sign * v) if v is not None else None) for r, w in zip(runs, wrong, strict=True) for v in
              [r.value(name)]]  # fmt: skip
    area, _ = _auroc_text(scored)
    return area


def feature_lines(
    fitted: ScoreMap,
    refit_without: dict[Feature, ScoreMap | None],
    runs: Sequence[RunFeatures],
    wrong: Sequence[bool],
) -> list[str]:
    """What each feature of ``fitted`` carries on ``runs``: its AUROC alone (oriented by the sign of its weight),
    and the AUROC of the map fitted on the same sample without it (``refit_without``)."""
    full = [Scored(w, fitted.score(r)) for r, w in zip(runs, wrong, strict=True)]
    lines = [f"  score map: {fitted.describe()} (fitted on {fitted.fitted_on} runs, {fitted.wrong} wrong)"]
    area, _ = _auroc_text(full)
    lines.append(f"  features, on the {len(runs)} runs the map scores here (its AUROC on them {area}):")
    for name, weight in zip(fitted.features, fitted.weights, strict=True):
        alone = _oriented(name, runs, wrong, 1.0 if weight >= 0 else -1.0)
        other = refit_without.get(name)
        without = (
            _auroc_text([Scored(w, other.score(r)) for r, w in zip(runs, wrong, strict=True)])[0] if other else "n/a"
        )
        lines.append(f"    {name}: alone {alone}, the map without it {without}")
    return lines


def out_of_fold_scores(
    runs: Sequence[RunFeatures], wrong: Sequence[bool], *, features: Sequence[Feature], folds: int
) -> list[float]:
    """Each run scored by a map fitted on the other folds (runs dealt to ``folds`` folds in order): a design
    estimate within one sample, never a substitute for a sample drawn after the fit."""
    scores = [0.0] * len(runs)
    for fold in range(folds):
        train = [i for i in range(len(runs)) if i % folds != fold]
        fitted = fit_score_map([runs[i] for i in train], [wrong[i] for i in train], features=features)
        for i in range(fold, len(runs), folds):
            scores[i] = fitted.score(runs[i])
    return scores
