"""The flagging score: a run's features, the map fitted from them on labelled runs, the threshold that reaches a
recall, the area under the ROC curve, and a calibration that refuses the runs it was fitted on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reflect_otel.errors import ConfigError
from reflect_otel.flagging._stats import auroc
from reflect_otel.flagging.calibration import CalibrationSample, ConfidenceCalibration, Resampling
from reflect_otel.flagging.flag_score import fit_score_map, recall_threshold, uncalibrated_score
from reflect_otel.flagging.run_features import RunFeatures, is_value, run_features
from reflect_otel.testing import make_trace
from reflect_otel.verdict import ConsistencyCheck, Resample

SEED_2475 = Path(__file__).parent.parent / "benchmarks" / "results" / "wtq-live-runs-seed2475"


def _features(disagreement: float | None, **cheap: float) -> RunFeatures:
    base = {"critical_evidence": 0.0, "tool_errors": 0.0, "empty_results": 0.0, "not_a_value": 0.0}
    return RunFeatures(**(base | {"answer_words": 1.0, "steps": 1.5} | cheap), disagreement=disagreement)


def test_the_area_under_the_roc_curve_of_the_resample_counts_is_the_issues_074() -> None:
    """Seed 2475's wrong runs had 40, 14, 5, 1 runs with 0-3 resamples reproducing their answer, its right runs 6, 4,
    5, 5: read as a score, the count ranks a wrong run above a right one with AUROC 0.74."""
    wrong = [3.0] * 40 + [2.0] * 14 + [1.0] * 5 + [0.0] * 1
    right = [3.0] * 6 + [2.0] * 4 + [1.0] * 5 + [0.0] * 5
    area, low, high = auroc(wrong, right)
    assert round(area, 2) == 0.74 and low < area < high
    assert auroc([1.0], [0.0])[0] == 1.0 and auroc([0.5], [0.5])[0] == 0.5
    with pytest.raises(ValueError, match="at least one positive and one negative"):
        auroc([1.0], [])


def test_a_fitted_map_ranks_by_the_features_that_separate_the_runs() -> None:
    runs = [_features(d) for d in (0.0, 0.0, 0.33, 0.67, 1.0, 1.0, 0.33, 1.0, 0.0, 0.67)]
    wrong = [False, False, False, True, True, True, True, True, False, False]
    fitted = fit_score_map(runs, wrong, features=("disagreement", "tool_errors", "answer_logprob"))
    assert fitted.features == ("disagreement",)  # tool_errors never varies; no run gives a logprob
    assert fitted.weights[0] > 0 and (fitted.fitted_on, fitted.wrong) == (10, 5)
    assert fitted.score(_features(1.0)) > 0.5 > fitted.score(_features(0.0))
    # a feature the run lacks reads as its mean on the fitting runs: it moves the score not at all
    assert fitted.score(_features(None)) == pytest.approx(
        fitted.score(_features(sum(r.disagreement or 0 for r in runs) / 10))
    )
    with pytest.raises(ValueError, match="both right and wrong runs"):
        fit_score_map(runs, [True] * 10, features=("disagreement",))
    with pytest.raises(ValueError, match="none of the features"):
        fit_score_map(runs, wrong, features=("tool_errors",))


def test_a_feature_that_separates_the_runs_perfectly_takes_a_bounded_weight() -> None:
    runs = [_features(float(w)) for w in (0, 0, 0, 1, 1, 1)]
    fitted = fit_score_map(runs, [False, False, False, True, True, True], features=("disagreement",))
    assert 0 < fitted.weights[0] < 5 and fitted.score(_features(1.0)) < 1.0


def test_the_threshold_that_reaches_a_recall_flags_the_fewest_right_runs() -> None:
    scores = [0.9, 0.8, 0.6, 0.4, 0.2, 0.7, 0.1]
    wrong = [True, True, True, True, True, False, False]
    assert recall_threshold(scores, wrong, recall=0.8) == 0.4  # 4 of 5 wrong runs reach it
    assert recall_threshold(scores, wrong, recall=0.6) == 0.6  # 3 of 5: the right run at 0.7 is flagged either way
    assert recall_threshold(scores, wrong, recall=1.0) == 0.2
    assert recall_threshold(scores, [False] * 7, recall=0.8) is None


def test_an_answer_is_a_value_unless_it_is_none_an_error_or_a_text_in_lines() -> None:
    assert is_value("22 laps") and is_value("Kimi Raikkonen, Fernando Alonso") and is_value("12,467")
    assert not is_value(None) and not is_value("  ")
    assert not is_value("error: t0 has fewer than 23 rows")
    advice = "To fix the error, you need to use the correct column name. The corrected query:\n\n```sql\nSELECT 1\n```"
    assert not is_value(advice)


def test_the_features_of_a_run_and_of_its_resamples() -> None:
    steps = [
        {"tool": "query", "args": {"sql": "SELECT x"}, "result": "error: no column x"},
        {"tool": "query", "args": {"sql": "SELECT y FROM t WHERE z = 1"}, "result": "[]"},
        {"reasoning": "The answer is 3", "is_final_answer": True, "logprob": -0.25},
    ]
    trace = make_trace("how many?", steps, final_answer="The answer is 3")
    check = ConsistencyCheck(
        original_answer="3",
        runs=(
            Resample(answer="3", agrees=True),
            Resample(answer="error: no column x", agrees=False),
            Resample(answer=None, agrees=False, error="the agent's endpoint timed out"),
        ),
        temperature=0.7,
        samples=3,
    )
    features = run_features(trace, check)
    assert features.tool_errors > 0 and features.empty_results > 0 and features.not_a_value == 0.0
    assert features.answer_logprob == -0.25 and features.steps == pytest.approx(1.386294, abs=1e-6)
    assert (features.disagreement, features.resample_not_values) == (0.5, 0.5)  # of the two that finished
    alone = run_features(trace)
    assert alone.disagreement is None and alone.resample_not_values is None
    assert uncalibrated_score("consistency", features) == 0.5 and uncalibrated_score("evidence", features) is None
    stuck = make_trace("how many?", [steps[0]] * 3, final_answer="")
    assert uncalibrated_score("combined", run_features(stuck, check)) == 1.0  # a critical finding


def test_a_calibration_refuses_to_score_the_runs_it_was_fitted_on() -> None:
    calibration = ConfidenceCalibration(
        sample=CalibrationSample(results="seed-a/results.jsonl", question_ids=("nt-1", "nt-2", "nt-3"), wrong=2)
    )
    calibration.refuse_sample(["nt-4", "nt-5"])  # drawn after it: scored
    with pytest.raises(ConfigError, match=r"fitted on 3 runs of seed-a/results.jsonl, and 1 of the runs .*\(nt-2\)"):
        calibration.refuse_sample(["nt-4", "nt-2"])
    ConfidenceCalibration().refuse_sample(["nt-1"])  # a calibration that names no sample refuses nothing


def test_a_calibration_written_before_the_score_still_loads_as_it_was_measured() -> None:
    """Seed 2475's file: per-basis precision of three fixed resamples, counted at the threshold 0.5."""
    kept = ConfidenceCalibration.load(SEED_2475 / "flagging" / "calibration.json")
    assert (kept.samples, kept.stop_lead, kept.threshold, kept.scores, kept.sample) == (3, None, 0.5, {}, None)
    measured = kept.measured("consistency_disagree", verifier="combined", resampling=Resampling(3, 0.7))
    assert measured is not None and (measured.right, measured.judged) == (45, 55)
    assert kept.measured("consistency_disagree", verifier="combined", resampling=Resampling(3, 0.7, 2)) is None
    assert json.loads((SEED_2475 / "flagging" / "calibration.json").read_text())["verifier"] == "combined"


def test_the_evidence_verifier_scores_a_run_without_critical_evidence_on_its_fitted_map() -> None:
    """No model call and no agent run: the trace's features on the map the calibration fitted for it."""
    from reflect_otel.flagging.proxy_verifier import EvidenceVerifier, ProxyVerifierConfig

    fitted = fit_score_map(
        [_features(None, empty_results=e) for e in (0.0, 0.0, 0.69, 0.69, 0.0, 1.1)],
        [False, False, True, True, False, True],
        features=("empty_results",),
    )
    config = ProxyVerifierConfig(calibration=ConfidenceCalibration(scores={"evidence": fitted}))
    empty = make_trace("how many?", [{"tool": "query", "args": {"sql": "SELECT a"}, "result": "[]"},
                                     {"reasoning": "0", "is_final_answer": True}], final_answer="0")  # fmt: skip
    clean = make_trace("how many?", [{"tool": "query", "args": {"sql": "SELECT a"}, "result": "[[3]]"},
                                     {"reasoning": "3", "is_final_answer": True}], final_answer="3")  # fmt: skip
    flagged = EvidenceVerifier(config, threshold=0.5).verify(empty, expected=None)
    cleared = EvidenceVerifier(config, threshold=0.5).verify(clean, expected=None)
    assert (flagged.basis, flagged.is_correct) == ("score_high", False) and flagged.score is not None
    assert (cleared.basis, cleared.is_correct) == ("score_low", True) and cleared.score is not None
    assert cleared.score < 0.5 <= flagged.score and "fitted on 6 labelled runs" in flagged.reasoning
    unfitted = EvidenceVerifier(ProxyVerifierConfig(calibration=ConfidenceCalibration())).verify(clean, expected=None)
    assert unfitted.is_correct is None and unfitted.score is None  # no map: it cannot tell, as before
