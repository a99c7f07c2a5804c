"""One verdict on a run without an expected answer, from the evidence checks, the agent's own resamples and the
plan-anchored audit, with its score and the basis that decided it.

The rule, in order (the cheapest signal first):

1. a critical evidence finding (no answer, a step limit, a loop, an answer right after a failed call) flags the
   run (basis ``critical_evidence``, score 1; no model call). Where flagged runs go on to attribution (online, and
   ``reflect-proxy``), the run is resampled anyway, as step 2 would (sample rate and budget alike), so that its
   replays can be judged by the agent's consensus; the flagging benchmark measures the rule without it;
2. where the run's replay adapter can resample it and the run is drawn by the sample rate, the consistency check
   (:mod:`reflect_otel.flagging.consistency`) scores the run, on the map fitted for the combined verifier where the
   calibration holds one (its features: the trace's and the resamples', :mod:`reflect_otel.flagging.run_features`), else on
   the share of resamples that did not reproduce the answer; the score against the threshold flags or clears it;
3. where no check decided (no adapter, not drawn, too few resamples finished), the plan-anchored audit decides
   (:mod:`reflect_otel.flagging.proxy_verifier`), shown the resamples that finished; its confidence is the precision measured
   for the proxy verifier's audits.

A split check is decided by its score, not by the audit: close calls draw more resamples instead
(``REFLECT_FLAG_STOP_LEAD``).
"""

from __future__ import annotations

from reflect_otel.flagging.calibration import ConfidenceCalibration
from reflect_otel.flagging.consistency import (
    ConsensusVerifier,
    ConsistencyVerifier,
    consistency_basis,
    consistency_verdict,
    render_consistency,
    undecided,
)
from reflect_otel.flagging.evidence import find_evidence
from reflect_otel.flagging.proxy_verifier import EvidenceVerifier, PlanAnchoredVerifier, critical_evidence_verdict
from reflect_otel.flagging.verifiers import Verifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.replay import SamplesRuns
from reflect_otel.settings import settings
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import ConsistencyCheck, Verdict

__all__ = ["VERIFIER_NAMES", "CombinedVerifier", "flagging_verifier", "proxy_regime_verifier"]


class CombinedVerifier:
    """A :class:`~reflect_otel.flagging.verifiers.Verifier` for runs without an expected answer (see the module's rule).
    Bound per run to the model (:meth:`with_llm`) and to the run's adapter (:meth:`with_runs`)."""

    name = "combined"

    def __init__(
        self,
        proxy: PlanAnchoredVerifier,
        consistency: ConsistencyVerifier,
        *,
        calibration: ConfidenceCalibration | None = None,
        check_after_evidence: bool = False,
    ) -> None:
        self.proxy = proxy
        self.consistency = consistency
        self.calibration = calibration if calibration is not None else proxy.config.calibration
        self.check_after_evidence = check_after_evidence
        """Resample a run the evidence already flagged too: its replays then have the agent's consensus to be
        judged by (where flagged runs are attributed); flagging alone saves those agent runs."""

    def _like(self, proxy: PlanAnchoredVerifier, consistency: ConsistencyVerifier) -> CombinedVerifier:
        return CombinedVerifier(
            proxy, consistency, calibration=self.calibration, check_after_evidence=self.check_after_evidence
        )

    def with_llm(self, llm: StructuredLLM) -> CombinedVerifier:
        return self._like(self.proxy.with_llm(llm), self.consistency)

    def with_runs(self, runs: SamplesRuns | None) -> CombinedVerifier:
        return self._like(self.proxy, self.consistency.with_runs(runs))

    def with_original(self, trace: StructuredTrace, verdict: Verdict) -> ConsensusVerifier:
        """The judge of ``trace``'s replays: the agent's consensus where its check found one, else this verifier
        without resampling (evidence, then the audit)."""
        return ConsensusVerifier(self.with_runs(None), trace, verdict.consistency, self.calibration)

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        critical = critical_evidence_verdict(find_evidence(trace), self.name, self.calibration)
        if critical is not None:
            if not self.check_after_evidence:
                return critical
            resampled = self.consistency.check(trace)  # kept for the replays; the evidence decided
            return (
                critical.model_copy(update={"consistency": resampled}) if not isinstance(resampled, str) else critical
            )
        outcome = self.consistency.check(trace)
        check = outcome if isinstance(outcome, ConsistencyCheck) else None
        threshold = self.consistency.threshold
        if check is not None and consistency_basis(check, threshold=threshold) is not None:
            return consistency_verdict(trace, check, self.name, self.calibration, threshold=threshold)
        context = render_consistency(check) if check is not None else ""  # shown inside the audit's EVIDENCE block
        audit, basis = self.proxy.judge(trace, context=context)
        why = str(outcome) if check is None else undecided(check)
        # no check decided: the audit is the proxy's own, and takes the proxy's measured precision (or none)
        measured = (
            self.calibration.measured(basis, verifier=self.proxy.name, model=self.proxy.llm.model_name)
            if basis
            else None
        )
        return audit.model_copy(  # the audit's verdict, as the combined verifier's (its own calibration)
            update={
                "verifier": self.name,
                "consistency": check,
                "reasoning": f"audit ({why}): {audit.reasoning}",
                "confidence": measured.rate if measured is not None else None,
                "measured": measured,
                "extracted_answer": check.original_answer if check is not None else audit.extracted_answer,
            }
        )


VERIFIER_NAMES = ("proxy", "evidence", "consistency", "combined")
"""The verifiers for runs without an expected answer, by the name ``--verifier`` takes."""


def _consistency() -> ConsistencyVerifier:
    current = settings()
    return ConsistencyVerifier(
        samples=current.flag_samples,
        temperature=current.flag_temperature,
        sample_rate=current.flag_sample_rate,
        stop_lead=current.flag_stop_lead,
        threshold=current.flag_threshold,
    )


def proxy_regime_verifier(llm: StructuredLLM) -> CombinedVerifier:
    """``reflect-proxy``'s judge: the combined verdict on the run (resampling as :func:`flagging_verifier` does),
    then its replays judged by the agent's consensus (:meth:`CombinedVerifier.with_original`), a run the evidence
    flagged resampled as well so that its replays have one."""
    return CombinedVerifier(PlanAnchoredVerifier(llm), _consistency(), check_after_evidence=True)


def flagging_verifier(name: str, llm: StructuredLLM) -> Verifier:
    """The verifier ``name`` (:data:`VERIFIER_NAMES`) of online attribution (its flagged runs are attributed):
    the consistency check's samples, stopping rule, rate, temperature and threshold come from
    ``REFLECT_FLAG_SAMPLES``, ``REFLECT_FLAG_STOP_LEAD``, ``REFLECT_FLAG_SAMPLE_RATE``, ``REFLECT_FLAG_TEMPERATURE``
    and ``REFLECT_FLAG_THRESHOLD``."""
    if name == "evidence":
        return EvidenceVerifier()
    if name == "proxy":
        return PlanAnchoredVerifier(llm)
    consistency = _consistency()
    if name == "consistency":
        return consistency
    if name == "combined":  # its flagged runs are attributed: their replays need the agent's consensus
        return CombinedVerifier(PlanAnchoredVerifier(llm), consistency, check_after_evidence=True)
    raise ValueError(f"unknown verifier {name!r}; choose from {', '.join(VERIFIER_NAMES)}")
