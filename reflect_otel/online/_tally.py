"""What became of the runs the online side judged, counted one way for the in-process runtime and the collector's
attribution worker alike."""

from __future__ import annotations

from dataclasses import dataclass

from reflect_otel.attribution.service import Outcome
from reflect_otel.record import AttributionStatus

__all__ = ["OutcomeCounts"]


@dataclass(slots=True)
class OutcomeCounts:
    """Counters of :class:`~reflect_otel.attribution.service.Outcome` s: runs judged, flagged (judged wrong), attributed and
    verified among them, flagged runs a spent token budget left unattributed, exports that failed, tokens spent;
    runs a consistency check resampled, and the agent runs it cost."""

    verified: int = 0
    flagged: int = 0
    attributed: int = 0
    verified_attributions: int = 0
    budget_skips: int = 0
    export_errors: int = 0
    tokens: int = 0
    consistency_checked: int = 0
    resamples: int = 0

    def count(self, outcome: Outcome) -> None:
        """Add one run's outcome."""
        self.verified += 1
        self.export_errors += len(outcome.export_failures)
        check = outcome.verdict.consistency if outcome.verdict is not None else None
        if check is not None:
            self.consistency_checked += 1
            self.resamples += check.agent_runs
        if not outcome.flagged:
            return
        self.flagged += 1
        if outcome.budget_skipped:
            self.budget_skips += 1
        elif outcome.record is not None:
            self.tokens += outcome.tokens
            self.attributed += 1
            self.verified_attributions += outcome.record.status is AttributionStatus.VERIFIED
