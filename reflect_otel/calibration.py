"""What a flagging verdict's confidence is: the measured precision of the basis it rests on.

A verdict without an expected answer rests on one basis (:data:`BASES`): a critical evidence finding, the agent's
resamples disagreeing with (or reproducing) its answer, or an audit. How often verdicts on that basis are right is
measured on labelled runs of your agent (``python -m benchmarks.flagging --live RESULTS --calibration-out FILE``)
and read from the file named by ``REFLECT_PROXY_CALIBRATION``. Nothing is shipped: without a file, or for a basis
the file never measured, a verdict carries no number (``confidence`` None), never a default that looks measured.

A calibration holds one verifier's verdicts (``verifier``: the combined verifier's audits see only the runs its
consistency check split, shown the resamples, so they are not the plain proxy verifier's), and applies only to that
verifier. The audit bases depend on the auditor model, so they apply only when the auditor is the file's ``model``;
the consistency bases depend on how many resamples were drawn and at what temperature, so they apply only with the
file's ``samples`` and ``temperature``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from reflect_otel._stats import wilson
from reflect_otel.errors import ConfigError
from reflect_otel.settings import settings
from reflect_otel.verdict import MeasuredPrecision

__all__ = ["BASES", "CALIBRATION_ENV", "Basis", "ConfidenceCalibration"]

Basis = Literal[
    "critical_evidence",
    "consistency_disagree",
    "consistency_agree",
    "consistency_partial",
    "consistency_majority",
    "audit_high",
    "audit_low_with_deviations",
    "audit_low_clean",
]
BASES: tuple[Basis, ...] = get_args(Basis)
"""What a verdict rests on: a critical evidence finding; fewer than half of the agent's resamples reproducing its
answer, all of them, or some; a replay judged by the resamples' consensus (the proxy regime); an audit whose deviations flag the run, one whose deviations are too light to, or
one that found none."""

CALIBRATION_ENV = "REFLECT_PROXY_CALIBRATION"
"""A JSON file of :class:`ConfidenceCalibration`, measured on labelled runs of your agent; none is shipped."""


class ConfidenceCalibration(BaseModel):
    """How often verdicts on each basis were right on labelled runs: ``counts[basis] = (right, judged)``.

    ``model`` is the auditor the audit bases were measured with; ``source`` says which runs, when, and the command.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    verifier: str = ""
    model: str = ""
    samples: int | None = None
    temperature: float | None = None
    counts: dict[Basis, tuple[int, int]] = Field(default_factory=dict)
    source: str = ""

    def measured(
        self,
        basis: str,
        *,
        verifier: str,
        model: str = "",
        samples: int | None = None,
        temperature: float | None = None,
    ) -> MeasuredPrecision | None:
        """The precision measured for ``basis`` of ``verifier``'s verdicts (with ``model`` as the auditor for an
        audit basis; ``samples`` resamples at ``temperature`` for a consistency basis), with its Wilson interval and
        count; None when never measured under those conditions."""
        if self.verifier and verifier != self.verifier:
            return None
        if basis.startswith("audit") and (not self.model or model != self.model):
            return None
        if basis.startswith("consistency") and (samples, temperature) != (self.samples, self.temperature):
            return None
        right, judged = self.counts.get(basis, (0, 0))  # type: ignore[call-overload]
        if judged <= 0 or not 0 <= right <= judged:
            return None
        low, high = wilson(right, judged)
        return MeasuredPrecision(basis=basis, right=right, judged=judged, low=low, high=high, source=self.source)

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
