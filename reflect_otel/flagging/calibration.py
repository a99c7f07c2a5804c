"""What a flagging verdict's confidence and score rest on: measured on labelled runs of your agent, never shipped.

A verdict without an expected answer rests on one basis (:data:`BASES`): a critical evidence finding, the agent's
resamples disagreeing with (or reproducing) its answer, an audit, or a fitted score. How often verdicts on each basis
were right is measured on labelled runs of your agent (``python -m benchmarks.flagging --live RESULTS
--calibration-out FILE``) and read from the file named by ``REFLECT_PROXY_CALIBRATION``. The same file holds, per
verifier, the score map fitted on those runs (:class:`~reflect_otel.flagging.flag_score.ScoreMap`) and the threshold at which
its score flagged 80% of their wrong runs. Nothing is shipped: without a file, or for a basis the file never
measured, a verdict carries no number (``confidence`` None), never a default that looks measured.

A calibration's precisions hold one verifier's verdicts (``verifier``: the combined verifier's audits see only the
runs no consistency check decided, so they are not the plain proxy verifier's), and apply only to that verifier. The
audit bases depend on the auditor model, so they apply only when the auditor is the file's ``model``; the
consistency bases depend on how many resamples were drawn, by which stopping rule, at what temperature and against
which threshold, so they apply only with the file's ``samples``, ``stop_lead``, ``temperature`` and ``threshold``.

**Never in-sample.** ``sample`` names the labelled runs the file was measured and fitted on, with their question
ids: scoring those same runs with it would report how well the map remembers them, so :meth:`refuse_sample` refuses
them (the benchmark calls it before scoring).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from reflect_otel.errors import ConfigError
from reflect_otel.flagging._stats import wilson
from reflect_otel.flagging.flag_score import ScoreMap
from reflect_otel.settings import settings
from reflect_otel.verdict import MeasuredPrecision

__all__ = ["BASES", "CALIBRATION_ENV", "Basis", "CalibrationSample", "ConfidenceCalibration", "Resampling"]

Basis = Literal[
    "critical_evidence",
    "consistency_disagree",
    "consistency_agree",
    "consistency_partial",
    "consistency_majority",
    "audit_high",
    "audit_low_with_deviations",
    "audit_low_clean",
    "score_high",
    "score_low",
]
BASES: tuple[Basis, ...] = get_args(Basis)
"""What a verdict rests on: a critical evidence finding; the share of the agent's resamples not reproducing its
answer reaching the threshold (by default: at most half reproduce it), all of them reproducing it, or some; a replay
judged by the resamples' consensus (the proxy regime); an audit whose deviations flag the run, one whose deviations
are too light to, or one that found none; a fitted score reaching the threshold, or not."""

CALIBRATION_ENV = "REFLECT_PROXY_CALIBRATION"
"""A JSON file of :class:`ConfidenceCalibration`, measured on labelled runs of your agent; none is shipped."""


@dataclass(frozen=True, slots=True)
class Resampling:
    """How a consistency check resampled: at most ``samples`` runs at ``temperature``, stopped by ``stop_lead``
    (None: every one asked for was run)."""

    samples: int | None
    temperature: float | None
    stop_lead: int | None = None


class CalibrationSample(BaseModel):
    """The labelled runs a calibration was measured and fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    results: str = Field(description="The results file the runs were read from.")
    journal: str = Field(default="", description="The flagging journal their verdicts and resamples were kept in.")
    question_ids: tuple[str, ...] = Field(description="Each run's question id.")
    wrong: int = Field(ge=0, description="How many of the runs were wrong.")


class ConfidenceCalibration(BaseModel):
    """How often verdicts on each basis were right on labelled runs: ``counts[basis] = (right, judged)``; per
    verifier the score map fitted on the same runs (``scores``) and the threshold at which that score flagged
    ``recall_target`` of their wrong runs (``recall_thresholds``).

    ``model`` is the auditor the audit bases were measured with; ``source`` says which runs, when, and the command;
    ``sample`` which runs, by question id.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    verifier: str = ""
    model: str = ""
    samples: int | None = None
    stop_lead: int | None = Field(default=None, description="The resamples' stopping rule (None: all were run).")
    temperature: float | None = None
    threshold: float = Field(default=0.5, description="The threshold the consistency bases were counted at.")
    counts: dict[Basis, tuple[int, int]] = Field(default_factory=dict)
    scores: dict[str, ScoreMap] = Field(default_factory=dict)
    recall_target: float = Field(default=0.8, gt=0, le=1)
    recall_thresholds: dict[str, float] = Field(default_factory=dict)
    sample: CalibrationSample | None = None
    source: str = ""

    def measured(
        self,
        basis: str,
        *,
        verifier: str,
        model: str = "",
        resampling: Resampling | None = None,
        threshold: float | None = None,
    ) -> MeasuredPrecision | None:
        """The precision measured for ``basis`` of ``verifier``'s verdicts (with ``model`` as the auditor for an
        audit basis; resampled as ``resampling`` says and flagged at ``threshold``, for a consistency basis), with
        its Wilson interval and count; None when never measured under those conditions."""
        if self.verifier and verifier != self.verifier:
            return None
        if basis.startswith("audit") and (not self.model or model != self.model):
            return None
        r = resampling or Resampling(None, None)
        drawn = (r.samples, r.stop_lead, r.temperature, self.threshold if threshold is None else threshold)
        if basis.startswith("consistency") and drawn != (
            self.samples,
            self.stop_lead,
            self.temperature,
            self.threshold,
        ):
            return None
        right, judged = self.counts.get(basis, (0, 0))  # type: ignore[call-overload]
        if judged <= 0 or not 0 <= right <= judged:
            return None
        low, high = wilson(right, judged)
        return MeasuredPrecision(basis=basis, right=right, judged=judged, low=low, high=high, source=self.source)

    def score_map(self, verifier: str) -> ScoreMap | None:
        """The score map fitted for ``verifier`` (the name its verdicts carry), or None."""
        return self.scores.get(verifier)

    def refuse_sample(self, question_ids: Iterable[str]) -> None:
        """Raise :class:`ConfigError` when any of ``question_ids`` is among the runs this calibration was fitted on:
        its figures on them would be in-sample."""
        if self.sample is None:
            return
        fitted = set(self.sample.question_ids)
        shared = sorted({q for q in question_ids if q in fitted})
        if shared:
            named = ", ".join(shared[:5]) + (f" and {len(shared) - 5} more" if len(shared) > 5 else "")
            raise ConfigError(
                f"this calibration was fitted on {len(fitted)} runs of {self.sample.results}, and {len(shared)} of the "
                f"runs to score are among them ({named}): scoring them would be in-sample; score runs drawn after "
                "it (another seed, its questions excluded)"
            )

    @classmethod
    def load(cls, path: Path) -> ConfidenceCalibration:
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as error:
            raise ConfigError(
                f"{CALIBRATION_ENV}={path}: not a readable calibration ({error}); write one with "
                "python -m benchmarks.flagging --live RESULTS --calibration-out FILE, or unset the variable"
            ) from None

    @classmethod
    def from_env(cls) -> ConfidenceCalibration:
        """The file named by ``REFLECT_PROXY_CALIBRATION``, else an empty calibration (every verdict unmeasured)."""
        path = settings().proxy_calibration
        return cls() if path is None else cls.load(Path(path))
