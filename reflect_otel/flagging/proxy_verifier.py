"""The plan-anchored proxy verifier: judges a trace without ground truth (the paper's "Plan-Anchored Verifier").

1. Anchors from the question alone (one LLM call): hard anchors (required entities, filters, target property,
   operation, output form) and soft anchors (one or two plans of ordered subgoals).
2. Normalisation into macro-steps; a failed tool call followed by a successful call of the same tool collapses
   into one recovery step.
3. A stepwise audit of the macro-steps into nine categories, in chunks of 8 with 2 overlapping (the later chunk's
   verdict wins on the overlap); consecutive deviations of one category are merged; a deviation followed by a
   ``Recovery`` step is resolved.
4. Evidence: the evidence checks (:mod:`reflect_otel.flagging.evidence`) run first. A critical finding (no final answer, a
   step limit, a loop of identical calls, an answer given right after a failed call) flags the run
   ``HIGH_ERROR_SIGNAL`` with no LLM call, and the verdict's reasoning names it; the other findings are shown to
   the audit as data.
5. Scores: the error signal ``E = sigmoid(scale * (S - offset))`` of the severity-weighted deviation sum ``S``
   (resolved deviations weigh 30%); the confidence ``C`` starts at 1 and is penalised for ambiguity. Labels:
   ``HIGH_ERROR_SIGNAL`` (C >= 0.3 and E >= 0.5), ``LOW_ERROR_SIGNAL`` (C >= 0.3, E < 0.5), ``UNCERTAIN`` (C < 0.3).
6. Reported confidence: ``C`` says how ambiguous the audit was, not how often such a verdict is right, so it is
   never shown as a confidence. The verdict's ``confidence`` is the precision measured for its basis
   (:mod:`reflect_otel.flagging.calibration`: labelled runs of your agent, with the same auditor model), with its Wilson
   interval and count in ``measured``; a basis never measured reports no number (None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from reflect_otel.errors import LLMError
from reflect_otel.flagging.calibration import Basis, ConfidenceCalibration
from reflect_otel.flagging.evidence import Finding, Severity, find_evidence, render_findings
from reflect_otel.flagging.flag_score import flagged
from reflect_otel.flagging.run_features import run_features
from reflect_otel.llm.base import LLMOutputError, StructuredLLM
from reflect_otel.prompts import format_step
from reflect_otel.prompts.proxy import Anchors, AuditedStep, AuditOutput, anchors_prompt, audit_prompt
from reflect_otel.record import Stage
from reflect_otel.settings import settings
from reflect_otel.trace import Step, StepStatus, StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = [
    "BENIGN",
    "DEVIATIONS",
    "Anchors",
    "AuditOutput",
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
    calibration: ConfidenceCalibration = Field(default_factory=ConfidenceCalibration.from_env)
    """Measured precision per basis (see the module's step 6); empty unless ``REFLECT_PROXY_CALIBRATION`` names one."""


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
    """A :class:`~reflect_otel.flagging.verifiers.Verifier` for the proxy regime (no expected answer is used)."""

    name = "plan_anchored"

    def __init__(self, llm: StructuredLLM, *, config: ProxyVerifierConfig | None = None) -> None:
        self.llm = llm
        self.config = config or ProxyVerifierConfig()

    def with_llm(self, llm: StructuredLLM) -> PlanAnchoredVerifier:
        return PlanAnchoredVerifier(llm, config=self.config)

    def anchors(self, question: str) -> Anchors:
        messages = anchors_prompt(question, self.config.max_field_chars)
        return self.llm.complete(messages, Anchors, stage=Stage.PROXY_ANCHORS).value

    def audit(
        self, question: str, anchors: Anchors, steps: Sequence[MacroStep], evidence: str = ""
    ) -> list[AuditedStep]:
        verdicts: dict[int, AuditedStep] = {}
        for window in chunks(len(steps), self.config.chunk_size, self.config.chunk_overlap):
            audited = self._audit_window(question, anchors, steps, window, evidence)
            verdicts.update(audited)  # the later chunk wins on the overlap
        return [verdicts[i] for i in sorted(verdicts)]

    def _audit_window(
        self, question: str, anchors: Anchors, steps: Sequence[MacroStep], window: range, evidence: str
    ) -> dict[int, AuditedStep]:
        """The window's macro-steps classified. A reply that still leaves some out after its repair is kept, and
        each run of the steps it left out is asked for once more, alone (a model may leave a step out, mostly the
        last). Raises :class:`LLMError` when that fails too, or when the model could not be reached."""
        replies: list[AuditOutput] = []
        try:
            return _classified(self._ask_audit(question, anchors, steps, window, evidence, replies), window)
        except LLMOutputError:
            if not replies:
                raise  # no reply parsed at all: nothing to keep
        kept = _classified(replies[-1], window)  # the last reply that parsed
        for run in _runs(sorted(set(window) - kept.keys())):
            kept |= _classified(self._ask_audit(question, anchors, steps, run, evidence, []), run)
        return kept

    def _ask_audit(
        self,
        question: str,
        anchors: Anchors,
        steps: Sequence[MacroStep],
        window: range,
        evidence: str,
        replies: list[AuditOutput],
    ) -> AuditOutput:
        shown = [steps[i - 1] for i in window]
        listing = "\n\n".join(m.render(self.config.max_field_chars) for m in shown)
        messages = audit_prompt(question, anchors, listing, window, self.config.max_field_chars, evidence)

        def check(out: AuditOutput) -> str | None:
            replies.append(out)
            missing = set(window) - {s.macro_step for s in out.steps}
            return f"classify every macro-step; missing: {sorted(missing)}" if missing else None

        return self.llm.complete(messages, AuditOutput, stage=Stage.PROXY_AUDIT, check=check).value

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        return self.judge(trace)[0]

    def judge(self, trace: StructuredTrace, context: str = "") -> tuple[Verdict, Basis | None]:
        """The verdict, and what it rests on (None when UNCERTAIN): the pair a calibration counts. ``context`` is
        more evidence about the run (a consistency check's resamples), shown to the audit as data."""
        steps = macro_steps(trace)
        if not steps:
            return Verdict(
                verifier=self.name, is_correct=None, confidence=None, label="UNCERTAIN", reasoning="no steps"
            ), None
        findings = find_evidence(trace) if self.config.use_evidence else ()
        critical = critical_evidence_verdict(findings, self.name, self.config.calibration)
        if critical is not None:
            return critical, "critical_evidence"
        evidence = "\n".join(
            part for part in (context, render_findings(findings)) if part
        )  # context first: kept if cut
        try:
            anchors = self.anchors(trace.question)
            audited = self.audit(trace.question, anchors, steps, evidence)
            if _degenerate(audited):
                return _uncertain(
                    self.name, "degenerate audit: every macro-step got the same verdict and the same rationale"
                ), None
            scores = score_audit(audited, self.config)
        except LLMError as error:
            failed = _uncertain(self.name, f"the proxy verifier failed: {error}")
            return failed.model_copy(update={"error": str(error)[:500]}), None
        is_correct = {"HIGH_ERROR_SIGNAL": False, "LOW_ERROR_SIGNAL": True}.get(scores.label)
        described = "; ".join(
            f"{d.category} at macro-step {d.first_step}"
            + ("" if d.first_step == d.last_step else f"-{d.last_step}")
            + (" (resolved)" if d.resolved else "")
            for d in scores.deviations
        )
        basis = verdict_basis(scores)
        calibration = self.config.calibration
        measured = calibration.measured(basis, verifier=self.name, model=self.llm.model_name) if basis else None
        verdict = Verdict(
            verifier=self.name,
            is_correct=is_correct,
            confidence=measured.rate if measured is not None else None,
            score=scores.error_signal,
            label=scores.label,
            reasoning=f"E={scores.error_signal:.3f} C={scores.confidence:.2f} "
            + (f"({basis}: {measured.text() if measured else 'precision not measured'}); " if basis else "; ")
            + (described or "no deviations"),
            basis=basis,
            measured=measured,
        )
        return verdict, basis


def _runs(indices: Sequence[int]) -> list[range]:
    """Sorted ``indices`` as ranges of consecutive ones: [2, 3, 7] -> range(2, 4), range(7, 8)."""
    runs: list[range] = []
    for index in indices:
        if runs and runs[-1].stop == index:
            runs[-1] = range(runs[-1].start, index + 1)
        else:
            runs.append(range(index, index + 1))
    return runs


def _classified(out: AuditOutput, window: range) -> dict[int, AuditedStep]:
    return {audited.macro_step: audited for audited in out.steps if audited.macro_step in window}


def _uncertain(verifier: str, reasoning: str) -> Verdict:
    return Verdict(verifier=verifier, is_correct=None, confidence=None, label="UNCERTAIN", reasoning=reasoning)


def critical_evidence_verdict(
    findings: Sequence[Finding], verifier: str, calibration: ConfidenceCalibration
) -> Verdict | None:
    """The run judged wrong on its critical findings (no LLM call), naming them; None when it has none. Its
    confidence is the precision ``calibration`` measured for critical evidence, else none."""
    critical = [f for f in findings if f.severity is Severity.CRITICAL]
    if not critical:
        return None
    named = "; ".join(f"step {f.step_index} {f.kind.value}: {f.evidence}" for f in critical[:3])
    measured = calibration.measured("critical_evidence", verifier=verifier)
    return Verdict(
        verifier=verifier,
        is_correct=False,
        confidence=measured.rate if measured is not None else None,
        score=1.0,
        label="HIGH_ERROR_SIGNAL",
        reasoning=f"critical evidence (no audit needed): {named}",
        basis="critical_evidence",
        measured=measured,
    )


class EvidenceVerifier:
    """Flags a run on critical evidence alone (no answer given, a step limit hit, a loop of identical calls, an
    answer right after a failed call), with no model call; any other run it cannot judge (``is_correct`` None).
    The cheapest online triage: it catches the loud failures, never the silent ones. Where the calibration holds a
    score map fitted for it (the trace's features alone, :mod:`reflect_otel.flagging.run_features`), a run without critical
    evidence is scored on it and flagged or cleared against ``threshold`` (None: ``REFLECT_FLAG_THRESHOLD``)."""

    name = "evidence"

    def __init__(self, config: ProxyVerifierConfig | None = None, *, threshold: float | None = None) -> None:
        self.config = config or ProxyVerifierConfig()
        self.threshold = threshold if threshold is not None else settings().flag_threshold

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        critical = critical_evidence_verdict(find_evidence(trace), self.name, self.config.calibration)
        if critical is not None:
            return critical
        fitted = self.config.calibration.score_map(self.name)
        if fitted is None:
            return _uncertain(
                self.name, "no critical evidence; a silent failure needs the proxy verifier or an expected answer"
            )
        score = fitted.score(run_features(trace))
        high = flagged(score, self.threshold)
        return Verdict(
            verifier=self.name,
            is_correct=not high,
            confidence=None,
            score=score,
            label="HIGH_ERROR_SIGNAL" if high else "LOW_ERROR_SIGNAL",
            reasoning=f"no critical evidence; score {score:.2f} {'reaches' if high else 'is below'} the threshold "
            f"{self.threshold:g} (the map fitted on {fitted.fitted_on} labelled runs: {fitted.describe()})",
            basis="score_high" if high else "score_low",
        )


def verdict_basis(scores: ProxyScores) -> Basis | None:
    """What an audit's verdict rests on; None for UNCERTAIN (no verdict to calibrate)."""
    if scores.label == "HIGH_ERROR_SIGNAL":
        return "audit_high"
    if scores.label == "LOW_ERROR_SIGNAL":
        return "audit_low_with_deviations" if scores.deviations else "audit_low_clean"
    return None
