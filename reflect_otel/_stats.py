"""The two statistics a controlled replay needs: the Wilson interval of a flip rate, and the one-sided Fisher exact
test of "the intervention flips more often than the control" on paired arms of replays."""

from __future__ import annotations

import math

__all__ = ["fisher_greater", "wilson"]

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
