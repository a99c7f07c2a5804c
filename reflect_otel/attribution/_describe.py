"""An attribution in words, the same on every surface that shows one (``show``, the HTML report): who named the
step (REFLECT's auditor, or a baseline, which is no auditor), the verdict the run was judged by, and how the step
compares with the benchmark's human labels."""

from __future__ import annotations

from collections.abc import Sequence

from reflect_otel.attribution.baselines import BASELINES
from reflect_otel.attribution.manual import MANUAL_METHOD
from reflect_otel.record import AttributionRecord, AttributionStatus
from reflect_otel.trace import ErrorLabel
from reflect_otel.verdict import Verdict

__all__ = ["confidence_text", "error_type_text", "labels_text", "named_by", "verdict_text"]


def named_by(record: AttributionRecord) -> str:
    """Who named the step: "the auditor" for REFLECT and its controls (their LLM auditor), "the aao baseline" for a
    baseline that asked a model, "the first-step baseline (no model call)" for one that did not."""
    if record.method in BASELINES:
        asked = BASELINES[record.method].needs_llm
        return f"the {record.method} baseline" + ("" if asked else " (no model call)")
    if record.method.startswith(("reflect", "control-")):
        return "the auditor"
    if record.method == MANUAL_METHOD:
        return "your manual replay"
    return f"the {record.method} method"


def error_type_text(record: AttributionRecord) -> str:
    """The error type, or why there is none: no step was named, or the method does not classify."""
    if record.step_index is None:
        return "none (no step named)"
    if record.error_type is not None:
        return record.error_type.value
    return "not classified"


def verdict_text(verdict: Verdict | None, expected: str | None = None) -> str:
    """How the run was judged before it was attributed: right, wrong, or not judged, by which verifier, with the
    answer it read and the expected answer when known."""
    parts = []
    if expected is not None:
        parts.append(f"expected answer {expected!r}")
    if verdict is None:
        parts.append("the run's answer was not judged")
    else:
        judged = {True: "judged right", False: "judged wrong", None: "not judged"}[verdict.is_correct]
        text = f"{judged} by the {verdict.verifier} verifier"
        if verdict.extracted_answer is not None:
            text += f" (answer read: {verdict.extracted_answer!r})"
        if verdict.basis is not None:  # a verdict without an expected answer: on what, and how often that is right
            text += f", on {verdict.basis}: " + (
                f"precision {verdict.measured.text()} on labelled runs"
                if verdict.measured is not None
                else "precision not measured (REFLECT_PROXY_CALIBRATION names no calibration of this verifier and basis)"
            )
        if verdict.consistency is not None:
            text += f"; {verdict.consistency.summary()}"
        if verdict.is_correct is None and verdict.reasoning:
            text += f": {verdict.reasoning}"
        parts.append(text)
    return "; ".join(parts)


def labels_text(labels: Sequence[ErrorLabel], step_index: int | None) -> str | None:
    """The benchmark's human labels beside the attributed step: whether the step is one of them; None when the
    trace has no labels."""
    if not labels:
        return None
    marked = sorted({label.step_index for label in labels if label.step_index is not None})
    if not marked:
        return f"the benchmark's {len(labels)} label(s) map to no step"
    steps = ", ".join(str(s) for s in marked)
    if step_index is None:
        return f"the benchmark labels step(s) {steps}; no step was named"
    agreement = "the named step is one of them" if step_index in marked else f"step {step_index} is not one of them"
    return f"the benchmark labels step(s) {steps}: {agreement}"


def confidence_text(record: AttributionRecord) -> str:
    """The record's confidence for people: measured (with its count) for a verified record, not measured for a
    hypothesis (whoever made it: REFLECT's auditor or a baseline), none when no step was named."""
    if record.step_index is None:
        return "none (no step named)"
    if record.status is AttributionStatus.VERIFIED or record.confidence is not None:
        return record.confidence_text
    return "not measured (unverified: a hypothesis that no replay confirmed)"
