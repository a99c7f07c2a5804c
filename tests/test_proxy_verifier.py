"""The plan-anchored proxy verifier: scores and labels against hand-computed values, chunking with overlap, and
recovery handling, with a scripted auditor."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.errors import ConfigError, LLMError
from reflect_otel.flagging.calibration import BASES, CALIBRATION_ENV, ConfidenceCalibration
from reflect_otel.flagging.proxy_verifier import (
    AuditedStep,
    PlanAnchoredVerifier,
    ProxyVerifierConfig,
    chunks,
    macro_steps,
    score_audit,
)
from reflect_otel.testing import ScriptedLLM, ScriptedRequest, make_trace
from reflect_otel.trace import StepStatus

CONFIG = ProxyVerifierConfig()


def audit(*rows: tuple[str, str, str]) -> list[AuditedStep]:
    return [
        AuditedStep(macro_step=i, category=c, severity=s, anchor=a, rationale="r")  # type: ignore[arg-type]
        for i, (c, s, a) in enumerate(rows, start=1)
    ]


def sigmoid(total: float) -> float:
    return 1 / (1 + math.exp(-1.5 * (total - 1.5)))


def test_one_hard_major_deviation_sits_on_the_threshold() -> None:
    scores = score_audit(
        audit(("Aligned", "minor", "none"), ("Constraint_Drop", "major", "hard"), ("Aligned", "minor", "none")), CONFIG
    )
    assert scores.weighted_sum == 1.5 and scores.error_signal == 0.5
    assert scores.confidence == 1.0 and scores.label == "HIGH_ERROR_SIGNAL"


def test_a_deviation_followed_by_recovery_is_resolved_at_30_percent() -> None:
    scores = score_audit(
        audit(("Constraint_Drop", "critical", "hard"), ("Recovery", "minor", "none"), ("Aligned", "minor", "none")),
        CONFIG,
    )
    assert scores.deviations[0].resolved
    assert scores.weighted_sum == pytest.approx(0.9)
    assert scores.error_signal == pytest.approx(sigmoid(0.9), abs=1e-6) == pytest.approx(0.289050, abs=1e-6)
    assert scores.label == "LOW_ERROR_SIGNAL"


def test_consecutive_deviations_of_one_category_merge_into_the_most_severe() -> None:
    scores = score_audit(
        audit(
            ("Unsupported_Jump", "minor", "soft"),
            ("Unsupported_Jump", "major", "soft"),
            ("Output_Drift", "critical", "hard"),
        ),
        CONFIG,
    )
    assert [(d.first_step, d.last_step, d.category, d.severity) for d in scores.deviations] == [
        (1, 2, "Unsupported_Jump", "major"),
        (3, 3, "Output_Drift", "critical"),
    ]
    assert scores.weighted_sum == pytest.approx(0.75 + 3.0)
    assert scores.error_signal == pytest.approx(
        0.966914, abs=1e-6
    )  # 1 / (1 + e^-3.375) and scores.label == "HIGH_ERROR_SIGNAL"


def test_ambiguity_lowers_confidence_to_uncertain() -> None:
    rows = [("Valid_Alternative", "minor", "none")] * 6 + [
        ("Unsupported_Jump", "minor", "soft"),
        ("Aligned", "minor", "none"),
        ("Constraint_Drop", "minor", "soft"),
        ("Aligned", "minor", "none"),
        ("Output_Drift", "minor", "soft"),
    ]
    scores = score_audit(audit(*rows), CONFIG)
    # 6 alternatives: -0.15 * 4; 3 unresolved soft deviations: -0.15 * 1
    assert scores.confidence == pytest.approx(0.25) and scores.label == "UNCERTAIN"
    assert score_audit(audit(("Housekeeping", "minor", "none")), CONFIG).confidence == 0.5  # too few substantive steps


def test_chunks_of_eight_overlap_by_two() -> None:
    assert chunks(5, 8, 2) == [range(1, 6)]
    assert chunks(14, 8, 2) == [range(1, 9), range(7, 15)]
    assert chunks(20, 8, 2) == [range(1, 9), range(7, 15), range(13, 21)]


def test_failed_call_and_its_retry_collapse_into_one_recovery_step() -> None:
    trace = make_trace(
        "q",
        [
            {"tool": "search", "args": {"q": "x"}, "result": "error: timeout", "status": StepStatus.ERROR},
            {"tool": "search", "args": {"q": "x"}, "result": "found"},
            {"tool": "read", "args": {}, "result": "Error: bad file"},
            {"tool": "other", "args": {}, "result": "ok"},
            {"reasoning": "done", "is_final_answer": True},
        ],
    )
    groups = macro_steps(trace)
    assert [(m.index, [s.index for s in m.steps], m.recovery) for m in groups] == [
        (1, [1, 2], True),
        (2, [3], False),
        (3, [4], False),
        (4, [5], False),
    ]


def _long_trace(n: int):  # type: ignore[no-untyped-def]
    return make_trace(
        "Which river is longest?",
        [{"tool": "search", "args": {"q": str(i)}, "result": f"r{i}"} for i in range(1, n)]
        + [{"reasoning": "The Nile", "is_final_answer": True}],
        final_answer="The Nile",
    )


ANCHORS = {
    "hard": {
        "entities": ["rivers"],
        "filters": [],
        "target_property": "length",
        "operation": "compare",
        "output_form": "a river name",
    },
    "plans": [{"subgoals": ["find lengths", "compare"]}],
}


def test_verifier_audits_in_overlapping_chunks_and_labels() -> None:
    def respond(request: ScriptedRequest) -> Any:
        if request.stage == "proxy_anchors":
            return ANCHORS
        shown = [int(line.split()[1]) for line in request.text.splitlines() if line.startswith("Macro-step ")]
        category = "Aligned" if shown[0] == 1 else "Output_Drift"  # the second chunk calls the overlap a drift
        return {
            "steps": [
                {"macro_step": i, "category": category, "severity": "critical", "anchor": "hard", "rationale": "r"}
                for i in shown
            ]
        }

    llm = ScriptedLLM(respond=respond)
    verdict = PlanAnchoredVerifier(llm).verify(_long_trace(14), expected="IGNORED")
    assert [r.stage for r in llm.requests] == ["proxy_anchors", "proxy_audit", "proxy_audit"]
    assert "IGNORED" not in "".join(r.text for r in llm.requests)  # no ground truth in the proxy regime
    # steps 7-14 are Output_Drift (the later chunk wins on 7-8): one merged critical/hard deviation
    assert verdict.label == "HIGH_ERROR_SIGNAL" and verdict.is_correct is False
    assert verdict.score == pytest.approx(sigmoid(3.0), abs=1e-6)
    assert "Output_Drift at macro-step 7-14" in verdict.reasoning


def test_clean_audit_is_low_error_and_a_failing_llm_is_uncertain() -> None:
    llm = ScriptedLLM(
        [
            ANCHORS,
            {
                "steps": [
                    {
                        "macro_step": i,
                        "category": "Aligned",
                        "severity": "minor",
                        "anchor": "none",
                        "rationale": f"search {i} serves the plan",
                    }
                    for i in range(1, 4)
                ]
            },
        ]
    )
    verdict = PlanAnchoredVerifier(llm).verify(_long_trace(3), expected=None)
    assert (verdict.label, verdict.is_correct, verdict.score) == (
        "LOW_ERROR_SIGNAL",
        True,
        pytest.approx(sigmoid(0.0), abs=1e-6),
    )
    broken = PlanAnchoredVerifier(ScriptedLLM(["x", "y"])).verify(_long_trace(3), expected=None)
    assert broken.label == "UNCERTAIN" and broken.is_correct is None and "failed" in broken.reasoning


def test_audit_missing_steps_is_sent_back() -> None:
    partial = {
        "steps": [{"macro_step": 1, "category": "Aligned", "severity": "minor", "anchor": "none", "rationale": "r"}]
    }
    full = {
        "steps": [
            {"macro_step": i, "category": "Aligned", "severity": "minor", "anchor": "none", "rationale": "r"}
            for i in (1, 2, 3)
        ]
    }
    llm = ScriptedLLM([ANCHORS, partial, full])
    PlanAnchoredVerifier(llm).verify(_long_trace(3), expected=None)
    assert "missing: [2, 3]" in llm.requests[2].messages[-1].content


def _audited(*steps: int, category: str = "Aligned") -> dict[str, Any]:
    return {
        "steps": [
            {"macro_step": i, "category": category, "severity": "minor", "anchor": "none", "rationale": f"step {i}"}
            for i in steps
        ]
    }


def test_steps_still_missing_after_the_repair_are_asked_for_alone_and_the_rest_is_kept() -> None:
    """The default model left the last macro-step out of 10 of 80 audits even after the repair; those steps are
    asked once more on their own (each run of consecutive ones), and the repair's verdicts on the steps it did
    classify are kept, not asked again."""
    first = _audited(1, 2, 5, category="Output_Drift")
    repaired = _audited(1, 4, 5)  # misses 2-3 and 6: the repair's verdicts are the ones kept
    llm = ScriptedLLM([ANCHORS, first, repaired, _audited(2, 3), _audited(6, category="Output_Drift")])
    verdict = PlanAnchoredVerifier(llm).verify(_long_trace(6), expected=None)
    assert [r.stage for r in llm.requests] == ["proxy_anchors", *["proxy_audit"] * 4]
    assert "Macro-steps 1 to 6:" in llm.requests[1].text
    assert "Macro-steps 2 to 3:" in llm.requests[3].text and "Macro-steps 6 to 6:" in llm.requests[4].text
    assert "Output_Drift at macro-step 6" in verdict.reasoning  # the drift on 1, 2, 5 was the first reply's
    assert "macro-step 1" not in verdict.reasoning and "macro-step 5" not in verdict.reasoning
    still = ScriptedLLM([ANCHORS, _audited(1, 2), _audited(1, 2), _audited(1), _audited(1)])
    failed = PlanAnchoredVerifier(still).verify(_long_trace(3), expected=None)
    assert len(still.requests) == 5 and failed.label == "UNCERTAIN" and failed.error is not None
    assert "missing: [3]" in failed.reasoning


def test_an_unreachable_model_is_not_asked_again_for_the_missing_steps() -> None:
    """Only a reply that misses steps is mended: a transport failure on the repair fails the verdict at once."""
    llm = ScriptedLLM([ANCHORS, _audited(1, 2), LLMError("connection refused")])
    verdict = PlanAnchoredVerifier(llm).verify(_long_trace(3), expected=None)
    assert len(llm.requests) == 3 and verdict.label == "UNCERTAIN" and "connection refused" in verdict.reasoning


def test_a_critical_evidence_finding_flags_the_run_without_an_llm_call() -> None:
    loop = {"tool": "sort", "args": {"col": "Year"}, "result": "t2: 5 rows"}
    trace = make_trace("Which year?", [loop, loop, loop], final_answer="")
    llm = ScriptedLLM([])
    verdict = PlanAnchoredVerifier(llm).verify(trace, expected=None)
    assert llm.requests == []
    assert (verdict.label, verdict.is_correct) == ("HIGH_ERROR_SIGNAL", False)
    assert "step 2 repeated_call" in verdict.reasoning and "no_final_answer" in verdict.reasoning


def test_warning_findings_are_shown_to_the_audit_as_data() -> None:
    trace = make_trace(
        "Which river is longest?",
        [
            {"tool": "search", "args": {"q": "rivers"}, "result": "[]"},
            {"reasoning": "The Nile", "is_final_answer": True},
        ],
        final_answer="The Nile",
    )
    audit = {
        "steps": [
            {"macro_step": i, "category": "Aligned", "severity": "minor", "anchor": "none", "rationale": "ok"}
            for i in (1, 2)
        ]
    }
    llm = ScriptedLLM([ANCHORS, audit])
    PlanAnchoredVerifier(llm).verify(trace, expected=None)
    evidence = llm.requests[1].text.split("<<<BEGIN EVIDENCE>>>", 1)[1].split("<<<END EVIDENCE>>>", 1)[0]
    assert "Step 1: [warning] empty_result" in evidence and "Step 2: [warning] unsupported_answer" in evidence


def test_a_degenerate_audit_is_uncertain_and_online_attribution_of_uncertain_runs_is_a_setting(
    tmp_path: Any,
) -> None:
    from reflect_otel.attribution.methods import METHODS
    from reflect_otel.attribution.service import AttributionService
    from reflect_otel.config import ReflectConfig
    from reflect_otel.flagging.verifiers import OracleVerifier

    same = {
        "steps": [
            {"macro_step": i, "category": "Aligned", "severity": "minor", "anchor": "none", "rationale": "Looks fine."}
            for i in range(1, 4)
        ]
    }
    verdict = PlanAnchoredVerifier(ScriptedLLM([ANCHORS, same])).verify(_long_trace(3), expected=None)
    assert (verdict.label, verdict.is_correct) == ("UNCERTAIN", None) and "degenerate" in verdict.reasoning

    def service(attribute_uncertain: bool) -> AttributionService:
        return AttributionService(
            ScriptedLLM([]),
            METHODS["first-step"],
            verifier=OracleVerifier(),
            proxy=PlanAnchoredVerifier(ScriptedLLM([ANCHORS, same])),
            config=ReflectConfig(attribute_uncertain=attribute_uncertain),
            triage=True,
        )

    assert service(False).process(_long_trace(3)).record is None  # counted, not attributed
    outcome = service(True).process(_long_trace(3))
    assert outcome.flagged and outcome.record is not None and outcome.record.step_index == 1


def _clean_audit_llm(model_name: str = "scripted-llm") -> ScriptedLLM:
    steps = [
        {"macro_step": i, "category": "Aligned", "severity": "minor", "anchor": "none", "rationale": f"step {i} fits"}
        for i in range(1, 4)
    ]
    return ScriptedLLM([ANCHORS, {"steps": steps}], model_name=model_name)


def test_an_audit_that_found_nothing_shows_no_confidence_unless_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Structural confidence 1.0 is how unambiguous the audit was, never shown as a confidence; the verdict reports
    the precision measured for its basis with this auditor model (its Wilson interval and count), and no number
    when that was never measured."""
    monkeypatch.delenv(CALIBRATION_ENV, raising=False)
    verdict = PlanAnchoredVerifier(_clean_audit_llm()).verify(_long_trace(3), expected=None)
    assert verdict.label == "LOW_ERROR_SIGNAL" and verdict.confidence is None and verdict.measured is None
    assert verdict.basis == "audit_low_clean" and "audit_low_clean: precision not measured" in verdict.reasoning
    measured = ConfidenceCalibration(
        verifier="plan_anchored", model="scripted-llm", counts={"audit_low_clean": (3, 8)}, source="test"
    )
    config = ProxyVerifierConfig(calibration=measured)
    verdict = PlanAnchoredVerifier(_clean_audit_llm(), config=config).verify(_long_trace(3), expected=None)
    assert verdict.confidence == pytest.approx(3 / 8) and verdict.measured is not None
    assert (verdict.measured.right, verdict.measured.judged) == (3, 8)
    assert verdict.measured.low == pytest.approx(0.1368, abs=1e-3) and verdict.measured.high == pytest.approx(
        0.6943, abs=1e-3
    )
    assert "0.38 [0.14, 0.69] (3 of 8 right)" in verdict.reasoning
    verdict = PlanAnchoredVerifier(_clean_audit_llm("another-model"), config=config).verify(
        _long_trace(3), expected=None
    )
    assert verdict.confidence is None  # measured with another auditor: does not apply


def test_critical_evidence_reports_its_measured_precision_or_no_number() -> None:
    loop = {"tool": "sort", "args": {"col": "Year"}, "result": "t2: 5 rows"}
    trace = make_trace("Which year?", [loop, loop, loop], final_answer="")
    unmeasured = PlanAnchoredVerifier(ScriptedLLM([]), config=ProxyVerifierConfig(calibration=ConfidenceCalibration()))
    assert unmeasured.verify(trace, expected=None).confidence is None
    measured = ConfidenceCalibration(model="scripted-llm", counts={"critical_evidence": (9, 10)})
    verifier = PlanAnchoredVerifier(ScriptedLLM([]), config=ProxyVerifierConfig(calibration=measured))
    verdict = verifier.verify(trace, expected=None)
    assert verdict.confidence == pytest.approx(0.9) and verdict.basis == "critical_evidence"
    # evidence is judged without an auditor: its precision holds whatever the model
    other = PlanAnchoredVerifier(ScriptedLLM([], model_name="other"), config=ProxyVerifierConfig(calibration=measured))
    assert other.verify(trace, expected=None).confidence == pytest.approx(0.9)


def test_a_calibration_file_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(ConfidenceCalibration(model="m", counts={"audit_high": (1, 2)}).model_dump_json())
    monkeypatch.setenv(CALIBRATION_ENV, str(path))
    assert ProxyVerifierConfig().calibration.counts == {"audit_high": (1, 2)}
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="--calibration-out"):
        ProxyVerifierConfig()


def test_no_calibration_is_shipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seven runs of one agent are no measurement of a user's agent: without a file, nothing is measured."""
    monkeypatch.delenv(CALIBRATION_ENV, raising=False)
    shipped = ProxyVerifierConfig().calibration
    assert shipped.counts == {} and all(
        shipped.measured(b, verifier="combined", model="qwen2.5-coder-1.5b-instruct") is None for b in BASES
    )
