"""The statistics the measurements report: the Wilson interval of a rate, the one-sided Fisher exact test of "the
intervention flips more often than the control" on paired arms of replays, and the area under the ROC curve of a
score with its DeLong interval."""

from __future__ import annotations

import math

__all__ = ["auroc", "fisher_greater", "wilson"]

Z_95 = 1.959963984540054


def wilson(successes: int, trials: int, *, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of ``successes`` in ``trials``; ``(0.0, 1.0)`` for no trials.
    Unlike the normal approximation it stays inside [0, 1] and is honest at 0 of 1 and 3 of 3."""
    if trials <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= trials:
        raise ValueError(f"{successes} successes in {trials} trials")
    share = successes / trials
    denominator = 1 + z * z / trials
    centre = (share + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, round(centre - half, 6)), min(1.0, round(centre + half, 6))


def fisher_greater(flips_a: int, trials_a: int, flips_b: int, trials_b: int) -> float:
    """The one-sided p-value of Fisher's exact test that arm a flips more often than arm b: the probability, with
    the margins fixed, of a table at least as extreme as the one seen (hypergeometric tail). 3 of 3 against 0 of 3
    gives 0.05; 1 of 1 against 0 of 1 gives 0.5."""
    if not (0 <= flips_a <= trials_a and 0 <= flips_b <= trials_b):
        raise ValueError("flips must lie between 0 and the arm's trials")
    total_flips, total = flips_a + flips_b, trials_a + trials_b
    if total == 0:
        return 1.0
    denominator = math.comb(total, trials_a)
    upper = min(total_flips, trials_a)
    return min(
        1.0,
        sum(math.comb(total_flips, k) * math.comb(total - total_flips, trials_a - k) for k in range(flips_a, upper + 1))
        / denominator,
    )


def _placement(score: float, other: float) -> float:
    return 1.0 if score > other else 0.5 if score == other else 0.0


def auroc(positives: list[float], negatives: list[float], *, z: float = Z_95) -> tuple[float, float, float]:
    """The area under the ROC curve of a score that should rank ``positives`` above ``negatives`` (the chance that a
    positive drawn at random scores above a negative, ties counting half), with its 95% interval by DeLong's
    variance (DeLong, DeLong and Clarke-Pearson 1988), clipped to [0, 1]: ``(area, low, high)``. Raises
    :class:`ValueError` when either side is empty (no ranking to measure)."""
    if not positives or not negatives:
        raise ValueError("the area under the ROC curve needs at least one positive and one negative")
    above = [sum(_placement(p, n) for n in negatives) / len(negatives) for p in positives]
    below = [sum(_placement(p, n) for p in positives) / len(positives) for n in negatives]
    area = sum(above) / len(above)

    def variance(values: list[float]) -> float:
        if len(values) < 2:
            return 0.0
        mean = sum(values) / len(values)
        return sum((v - mean) ** 2 for v in values) / (len(values) - 1)

    half = z * math.sqrt(variance(above) / len(above) + variance(below) / len(below))
    return round(area, 6), max(0.0, round(area - half, 6)), min(1.0, round(area + half, 6))
