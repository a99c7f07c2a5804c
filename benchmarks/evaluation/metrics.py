"""The paper's metrics, each with its standard error (the standard deviation of the per-trace values over
sqrt(n)): exact match (the predicted step is in the gold set), off-by-one (within 1 of a gold step), mean
distance to the nearest gold step, correction rate, the verified share and the EM of verified and unverified
records, and LLM calls, tokens and seconds per trace: the attributor's calls, and apart from them the calls a
replayed agent made on the attributor's model (where it ran there and the rows recorded it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Prediction", "compute_metrics", "mean_se", "metrics_markdown"]


@dataclass(frozen=True, slots=True)
class Prediction:
    """One scored trace: the predicted step (None when the method gave none) and the gold steps."""

    trace_id: str
    predicted: int | None
    gold: frozenset[int]
    status: str = "unverified"
    corrected: bool = False
    llm_calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    earliest_high: int | None = None
    failed: bool = False
    """The method's stages failed and it gave no step: counted, never scored."""
    agent_calls: int | None = None
    """The replayed agent's calls on the attributor's model; None where not recorded (its own model, older rows)."""
    agent_tokens: int | None = None


def mean_se(values: Sequence[float]) -> dict[str, float | int]:
    """Mean and standard error of the mean (sample standard deviation / sqrt(n)); 0 error for n < 2."""
    n = len(values)
    if n == 0:
        return {"mean": float("nan"), "se": float("nan"), "n": 0}
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return {"mean": mean, "se": math.sqrt(variance / n), "n": n}


def _distance(prediction: Prediction) -> float | None:
    if prediction.predicted is None or not prediction.gold:
        return None
    return float(min(abs(prediction.predicted - g) for g in prediction.gold))


def compute_metrics(all_predictions: Sequence[Prediction]) -> dict[str, Any]:
    """Every metric, as {"mean", "se", "n"} (fractions for rates), over the traces whose attribution did not fail
    (``failed`` counts the others); a missing prediction that is not a failure counts as a miss. With every trace
    failed, every metric has n = 0: nothing was measured."""
    predictions = [p for p in all_predictions if not p.failed]
    em = [1.0 if p.predicted in p.gold else 0.0 for p in predictions]
    off1 = [1.0 if (d := _distance(p)) is not None and d <= 1 else 0.0 for p in predictions]
    distances = [d for p in predictions if (d := _distance(p)) is not None]
    verified = [p for p in predictions if p.status == "verified"]
    unverified = [p for p in predictions if p.status != "verified"]
    high = [p for p in predictions if p.earliest_high is not None]
    return {
        "traces": len(all_predictions),
        "failed": len(all_predictions) - len(predictions),
        "exact_match": mean_se(em),
        "off_by_one": mean_se(off1),
        "mean_distance": mean_se(distances),
        "exact_match_earliest_high": mean_se([1.0 if p.predicted == p.earliest_high else 0.0 for p in high]),
        "correction_rate": mean_se([1.0 if p.corrected else 0.0 for p in predictions]),
        "verified_share": mean_se([1.0 if p.status == "verified" else 0.0 for p in predictions]),
        "exact_match_verified": mean_se([1.0 if p.predicted in p.gold else 0.0 for p in verified]),
        "exact_match_unverified": mean_se([1.0 if p.predicted in p.gold else 0.0 for p in unverified]),
        "llm_calls_per_trace": mean_se([float(p.llm_calls) for p in predictions]),
        "tokens_per_trace": mean_se([float(p.tokens) for p in predictions]),
        "seconds_per_trace": mean_se([p.seconds for p in predictions]),
        "agent_calls_per_trace": mean_se([float(p.agent_calls) for p in predictions if p.agent_calls is not None]),
        "agent_tokens_per_trace": mean_se([float(p.agent_tokens) for p in predictions if p.agent_tokens is not None]),
    }


def _cell(stat: dict[str, float | int], percent: bool) -> str:
    if not stat.get("n"):
        return "-"
    scale = 100.0 if percent else 1.0
    return f"{stat['mean'] * scale:.1f} ({stat['se'] * scale:.1f})"


def metrics_markdown(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """A markdown table: one row per run (label, metrics); rates in percent, standard errors in parentheses; "-"
    where nothing was measured. "failed" counts traces whose stages failed, which no metric includes."""
    header = (
        "| run | traces | failed | EM | Off-1 | mean distance | correction | verified | EM verified | EM unverified "
        "| calls | tokens | agent calls | agent tokens |"
    )
    lines = [header, "|" + " --- |" * 14]
    for label, m in rows:
        lines.append(
            f"| {label} | {m['traces']} | {m.get('failed', 0)} | {_cell(m['exact_match'], True)} | "
            f"{_cell(m['off_by_one'], True)} | "
            f"{_cell(m['mean_distance'], False)} | {_cell(m['correction_rate'], True)} | {_cell(m['verified_share'], True)} | "
            f"{_cell(m['exact_match_verified'], True)} | {_cell(m['exact_match_unverified'], True)} | "
            f"{_cell(m['llm_calls_per_trace'], False)} | {_cell(m['tokens_per_trace'], False)} | "
            f"{_cell(m.get('agent_calls_per_trace', {}), False)} | {_cell(m.get('agent_tokens_per_trace', {}), False)} |"
        )
    return "\n".join(lines) + "\n"
