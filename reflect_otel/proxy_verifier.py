"""The plan-anchored proxy verifier: judges a trace without ground truth (the paper's "Plan-Anchored Verifier").

1. Anchors from the question alone (one LLM call): hard anchors (required entities, filters, target property,
   operation, output form) and soft anchors (one or two plans of ordered subgoals).
2. Normalisation into macro-steps; a failed tool call followed by a successful call of the same tool collapses
   into one recovery step.
3. A stepwise audit of the macro-steps into nine categories, in chunks of 8 with 2 overlapping (the later chunk's
   verdict wins on the overlap); consecutive deviations of one category are merged; a deviation followed by a
   ``Recovery`` step is resolved.
4. Evidence: the evidence checks (:mod:`reflect_otel.evidence`) run first. A critical finding (no final answer, a
   step limit, a loop of identical calls, an answer given right after a failed call) flags the run
   ``HIGH_ERROR_SIGNAL`` with no LLM call, and the verdict's reasoning names it; the other findings are shown to
   the audit as data.
5. Scores: the error signal ``E = sigmoid(scale * (S - offset))`` of the severity-weighted deviation sum ``S``
   (resolved deviations weigh 30%); the confidence ``C`` starts at 1 and is penalised for ambiguity. Labels:
   ``HIGH_ERROR_SIGNAL`` (C >= 0.3 and E >= 0.5), ``LOW_ERROR_SIGNAL`` (C >= 0.3, E < 0.5), ``UNCERTAIN`` (C < 0.3).
6. Reported confidence: ``C`` says how ambiguous the audit was, not how often such a verdict is right. The verdict
   reports ``min(C, p)``, where ``p`` is how often verdicts on the same basis (:data:`BASES`) were right on labelled
   runs with the same auditor model (:class:`ConfidenceCalibration`, Laplace-smoothed); a basis or model never
   measured reports :data:`UNMEASURED_CONFIDENCE`, so an audit that found nothing is never "sure" by default. A run
   flagged by critical evidence (no audit) reports its measured rate, else the configured prior
   ``evidence_confidence``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from reflect_otel.errors import ConfigError, LLMError
from reflect_otel.evidence import Finding, Severity, find_evidence, render_findings
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.prompts import format_step
from reflect_otel.prompts.proxy import Anchors, AuditedStep, AuditOutput, anchors_prompt, audit_prompt
from reflect_otel.settings import settings
from reflect_otel.trace import Step, StepStatus, StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = [
    "BASES",
    "BENIGN",
    "CALIBRATION_ENV",
    "DEVIATIONS",
    "UNMEASURED_CONFIDENCE",
    "Anchors",
    "AuditOutput",
    "Basis",
    "ConfidenceCalibration",
    "EvidenceVerifier",
    "MacroStep",
    "PlanAnchoredVerifier",
    "ProxyScores",
    "ProxyVerifierConfig",
    "critical_evidence_verdict",
    "macro_steps",
    "score_audit",
    "verdict_basis",
]

BENIGN = ("Housekeeping", "Aligned", "Valid_Alternative", "Recovery")
DEVIATIONS = (
    "Constraint_Drop",
    "Evidence_Contradiction",
    "Unsupported_Jump",
    "Missed_Required_Subgoal",
    "Output_Drift",
)


Basis = Literal["critical_evidence", "audit_high", "audit_low_with_deviations", "audit_low_clean"]
BASES: tuple[Basis, ...] = ("critical_evidence", "audit_high", "audit_low_with_deviations", "audit_low_clean")
"""What a verdict rests on: a critical evidence finding; an audit whose deviations flag the run; an audit that
found deviations too light to flag it; an audit that found none."""

UNMEASURED_CONFIDENCE = 0.5
"""The confidence of a verdict whose basis was never measured for the auditor model: a coin, not certainty."""

CALIBRATION_ENV = "REFLECT_PROXY_CALIBRATION"
"""A JSON file of :class:`ConfidenceCalibration` (``python -m benchmarks.flagging ... --calibration-out FILE``
writes one from labelled runs of your agent); none is shipped."""


class ConfidenceCalibration(BaseModel):
    """How often verdicts on each basis were right on labelled runs, with one auditor model.

    ``counts[basis] = (right, judged)``; the calibrated confidence is ``(right + 1) / (judged + 2)``. Counts apply
    only when the auditor is ``model``: another model's verdicts are as good as that model, which was not measured.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = ""
    counts: dict[Basis, tuple[int, int]] = Field(default_factory=dict)
    source: str = ""
    """What was measured: data, run count, date, command."""

    def confidence(self, basis: Basis, model: str) -> float | None:
        """The measured rate for ``basis`` with ``model`` (Laplace-smoothed); None when never measured."""
        if not self.model or model != self.model:
            return None
        right, judged = self.counts.get(basis, (0, 0))
        return (right + 1) / (judged + 2) if judged else None

    @classmethod
    def from_env(cls) -> ConfidenceCalibration:
        """The file named by ``REFLECT_PROXY_CALIBRATION``, else none: nothing measured on one agent's runs is
        shipped as another's calibration, so until measured every basis reports :data:`UNMEASURED_CONFIDENCE` (a
        run flagged by critical evidence, the configured prior ``ProxyVerifierConfig.evidence_confidence``)."""
        path = settings().proxy_calibration
        if path is None:
            return cls()
        try:
            return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError) as error:
            raise ConfigError(
                f"{CALIBRATION_ENV}={path}: not a readable calibration ({error}); write one with "
                "python -m benchmarks.flagging --calibration-out FILE, or unset the variable"
            ) from None


class ProxyVerifierConfig(BaseModel):
    """Weights and thresholds (all configurable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights: dict[str, float] = Field(
        default_factory=lambda: {
            "critical/hard": 3.0,
            "critical/soft": 1.5,
            "major/hard": 1.5,
            "major/soft": 0.75,
            "minor/hard": 0.5,
            "minor/soft": 0.25,
        }
    )
    resolved_factor: float = 0.3
    offset: float = 1.5
    """The weighted sum at which E = 0.5."""
    scale: float = 1.5
    high_error_threshold: float = 0.5
    min_confidence: float = 0.3
    chunk_size: int = Field(default=8, ge=3)
    chunk_overlap: int = Field(default=2, ge=0)
    max_field_chars: int = 500
    use_evidence: bool = True
    """Combine the evidence checks with the audit (off measures the audit alone)."""
    evidence_confidence: float = Field(default=0.9, ge=0, le=1)
    """The confidence reported for a run flagged by a critical evidence finding when ``calibration`` has no
    measurement of that basis (a prior: the critical checks name failures that hold whatever the task)."""
    calibration: ConfidenceCalibration = Field(default_factory=ConfidenceCalibration.from_env)
    """Measured rates per basis (see the module's step 6)."""


@dataclass(frozen=True, slots=True)
class MacroStep:
    """One audited unit: the steps it covers, and whether it is a failed call followed by a successful retry."""

    index: int
    steps: tuple[Step, ...]
    recovery: bool = False

    def render(self, max_chars: int) -> str:
        head = f"Macro-step {self.index}" + (" (a failed call, then a successful retry)" if self.recovery else "")
        body = "\n".join(format_step(s, max_chars) for s in self.steps)
        return f"{head}\n{body}"


def _failed(step: Step) -> bool:
    result = (step.tool_result or "").lstrip().lower()
    return step.status is StepStatus.ERROR or result.startswith(("error", "traceback"))


def macro_steps(trace: StructuredTrace) -> list[MacroStep]:
    """Steps grouped for the audit; a failed tool call and the successful retry of the same tool right after it
    become one recovery step."""
    groups: list[MacroStep] = []
    steps = list(trace.steps)
    i = 0
    while i < len(steps):
        step = steps[i]
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if (
            step.tool_name
            and _failed(step)
            and nxt is not None
            and nxt.tool_name == step.tool_name
            and not _failed(nxt)
        ):
            groups.append(MacroStep(len(groups) + 1, (step, nxt), recovery=True))
            i += 2
        else:
            groups.append(MacroStep(len(groups) + 1, (step,)))
            i += 1
    return groups


def chunks(count: int, size: int, overlap: int) -> list[range]:
    """1-based ranges of ``size`` macro-steps, each overlapping the previous by ``overlap``."""
    if count <= size:
        return [range(1, count + 1)]
    out, start, stride = [], 1, max(1, size - overlap)
    while True:
        end = min(start + size - 1, count)
        out.append(range(start, end + 1))
        if end == count:
            return out
        start += stride


@dataclass(frozen=True, slots=True)
class Deviation:
    first_step: int
    last_step: int
    category: str
    severity: str
    anchor: str
    resolved: bool


@dataclass(frozen=True, slots=True)
class ProxyScores:
    error_signal: float
    confidence: float
    label: str
    deviations: tuple[Deviation, ...]
    weighted_sum: float

    @property
    def health(self) -> float:
        return 1.0 - self.error_signal


def score_audit(audited: Sequence[AuditedStep], config: ProxyVerifierConfig) -> ProxyScores:
    """Merge, resolve and score one audit (one verdict per macro-step, in order)."""
    ordered = sorted(audited, key=lambda s: s.macro_step)
    deviations: list[Deviation] = []
    for position, step in enumerate(ordered):
        if step.category not in DEVIATIONS:
            continue
        resolved = any(later.category == "Recovery" for later in ordered[position + 1 :])
        previous = deviations[-1] if deviations else None
        if previous and previous.category == step.category and previous.last_step == step.macro_step - 1:
            severity = min((previous.severity, step.severity), key=("critical", "major", "minor").index)
            anchor = "hard" if "hard" in (previous.anchor, step.anchor) else previous.anchor
            deviations[-1] = Deviation(previous.first_step, step.macro_step, step.category, severity, anchor, resolved)
        else:
            deviations.append(
                Deviation(step.macro_step, step.macro_step, step.category, step.severity, step.anchor, resolved)
            )
    total = 0.0
    for deviation in deviations:
        anchor = "hard" if deviation.anchor == "hard" else "soft"
        weight = config.weights[f"{deviation.severity}/{anchor}"]
        total += weight * (config.resolved_factor if deviation.resolved else 1.0)
    error = 1.0 / (1.0 + math.exp(-config.scale * (total - config.offset)))
    confidence = 1.0
    alternatives = sum(1 for s in ordered if s.category == "Valid_Alternative")
    confidence -= 0.15 * max(0, alternatives - 2)
    unresolved_soft = sum(1 for d in deviations if not d.resolved and d.anchor != "hard")
    confidence -= 0.15 * max(0, unresolved_soft - 2)
    substantive = sum(1 for s in ordered if s.category != "Housekeeping")
    if substantive < 2:
        confidence -= 0.5
    confidence = min(1.0, max(0.0, confidence))
    if confidence < config.min_confidence:
        label = "UNCERTAIN"
    elif error >= config.high_error_threshold:
        label = "HIGH_ERROR_SIGNAL"
    else:
        label = "LOW_ERROR_SIGNAL"
    return ProxyScores(round(error, 6), round(confidence, 6), label, tuple(deviations), round(total, 6))


def _degenerate(audited: Sequence[AuditedStep]) -> bool:
    """An audit that says the same thing of every step (three or more) in the same words has not looked at them."""
    if len(audited) < 3:
        return False
    return len({(s.category, " ".join(s.rationale.lower().split())) for s in audited}) == 1


class PlanAnchoredVerifier:
    """A :class:`~reflect_otel.verifiers.Verifier` for the proxy regime (no expected answer is used)."""

    name = "plan_anchored"

    def __init__(self, llm: StructuredLLM, *, config: ProxyVerifierConfig | None = None) -> None:
        self.llm = llm
        self.config = config or ProxyVerifierConfig()

    def with_llm(self, llm: StructuredLLM) -> PlanAnchoredVerifier:
        return PlanAnchoredVerifier(llm, config=self.config)

    def anchors(self, question: str) -> Anchors:
        messages = anchors_prompt(question, self.config.max_field_chars)
        return self.llm.complete(messages, Anchors, stage="proxy_anchors").value

    def audit(
        self, question: str, anchors: Anchors, steps: Sequence[MacroStep], evidence: str = ""
    ) -> list[AuditedStep]:
        verdicts: dict[int, AuditedStep] = {}
        for window in chunks(len(steps), self.config.chunk_size, self.config.chunk_overlap):
            shown = [steps[i - 1] for i in window]
            listing = "\n\n".join(m.render(self.config.max_field_chars) for m in shown)
            messages = audit_prompt(
                question, anchors, listing, window.start, window.stop - 1, self.config.max_field_chars, evidence
            )
            wanted = set(window)

            def check(out: AuditOutput, wanted: set[int] = wanted) -> str | None:
                missing = wanted - {s.macro_step for s in out.steps}
                return f"classify every macro-step; missing: {sorted(missing)}" if missing else None

            out = self.llm.complete(messages, AuditOutput, stage="proxy_audit", check=check).value
            for audited in out.steps:
                if audited.macro_step in wanted:
                    verdicts[audited.macro_step] = audited  # the later chunk wins on the overlap
        return [verdicts[i] for i in sorted(verdicts)]

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        return self.judge(trace)[0]

    def judge(self, trace: StructuredTrace) -> tuple[Verdict, Basis | None]:
        """The verdict, and what it rests on (None when UNCERTAIN): the pair a calibration counts."""
        steps = macro_steps(trace)
        if not steps:
            return Verdict(
                verifier=self.name, is_correct=None, confidence=0.0, label="UNCERTAIN", reasoning="no steps"
            ), None
        findings = find_evidence(trace) if self.config.use_evidence else ()
        measured = self.config.calibration.confidence("critical_evidence", self.llm.model_name)
        flagged = critical_evidence_verdict(
            findings, self.name, self.config.evidence_confidence if measured is None else measured
        )
        if flagged is not None:
            return flagged, "critical_evidence"
        try:
            anchors = self.anchors(trace.question)
            audited = self.audit(trace.question, anchors, steps, render_findings(findings))
            if _degenerate(audited):
                return Verdict(
                    verifier=self.name,
                    is_correct=None,
                    confidence=0.0,
                    label="UNCERTAIN",
                    reasoning="degenerate audit: every macro-step got the same verdict and the same rationale",
                ), None
            scores = score_audit(audited, self.config)
        except LLMError as error:
            return Verdict(
                verifier=self.name,
                is_correct=None,
                confidence=0.0,
                label="UNCERTAIN",
                reasoning=f"the proxy verifier failed: {error}",
            ), None
        is_correct = {"HIGH_ERROR_SIGNAL": False, "LOW_ERROR_SIGNAL": True}.get(scores.label)
        described = "; ".join(
            f"{d.category} at macro-step {d.first_step}"
            + ("" if d.first_step == d.last_step else f"-{d.last_step}")
            + (" (resolved)" if d.resolved else "")
            for d in scores.deviations
        )
        basis = verdict_basis(scores)
        measured = self.config.calibration.confidence(basis, self.llm.model_name) if basis else None
        confidence = min(scores.confidence, UNMEASURED_CONFIDENCE if measured is None else measured)
        verdict = Verdict(
            verifier=self.name,
            is_correct=is_correct,
            confidence=confidence if basis else scores.confidence,
            score=scores.error_signal,
            label=scores.label,
            reasoning=f"E={scores.error_signal:.3f} C={scores.confidence:.2f} "
            + (
                f"({basis}: {'measured' if measured is not None else 'not calibrated'} {confidence:.2f}); "
                if basis
                else "; "
            )
            + (described or "no deviations"),
        )
        return verdict, basis


def critical_evidence_verdict(findings: Sequence[Finding], verifier: str, confidence: float) -> Verdict | None:
    """The run judged wrong on its critical findings (no LLM call), naming them; None when it has none."""
    critical = [f for f in findings if f.severity is Severity.CRITICAL]
    if not critical:
        return None
    named = "; ".join(f"step {f.step_index} {f.kind.value}: {f.evidence}" for f in critical[:3])
    return Verdict(
        verifier=verifier,
        is_correct=False,
        confidence=confidence,
        score=1.0,
        label="HIGH_ERROR_SIGNAL",
        reasoning=f"critical evidence (no audit needed): {named}",
    )


class EvidenceVerifier:
    """Flags a run on critical evidence alone (no answer given, a step limit hit, a loop of identical calls, an
    answer right after a failed call), with no model call; any other run it cannot judge (``is_correct`` None).
    The cheapest online triage: it catches the loud failures, never the silent ones."""

    name = "evidence"

    def __init__(self, config: ProxyVerifierConfig | None = None) -> None:
        self.config = config or ProxyVerifierConfig()

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        flagged = critical_evidence_verdict(find_evidence(trace), self.name, self.config.evidence_confidence)
        return flagged or Verdict(
            verifier=self.name,
            is_correct=None,
            confidence=0.0,
            label="UNCERTAIN",
            reasoning="no critical evidence; a silent failure needs the proxy verifier or an expected answer",
        )


def verdict_basis(scores: ProxyScores) -> Basis | None:
    """What an audit's verdict rests on; None for UNCERTAIN (no verdict to calibrate)."""
    if scores.label == "HIGH_ERROR_SIGNAL":
        return "audit_high"
    if scores.label == "LOW_ERROR_SIGNAL":
        return "audit_low_with_deviations" if scores.deviations else "audit_low_clean"
    return None
