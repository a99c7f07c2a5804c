"""benchmarks.flagging's counting: each live run once, recall/precision/F1 with their intervals, and a resumed
measurement that runs nothing twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks._flag_report import Scored, operating_lines
from benchmarks.flagging import Bench, Journal, Labelled, Measured, cut_at_lead, live_runs, report
from reflect_otel.flagging.consistency import ConsistencyVerifier
from reflect_otel.testing import ScriptedLLM, ScriptedResampler, make_trace
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict


def _row(question: str, correct: bool | None, methods: dict[str, object]) -> str:
    trace = make_trace(f"question {question}", [{"reasoning": "x", "is_final_answer": True}], final_answer="x")
    row = {"question_id": question, "correct": correct, "methods": methods, "trace": trace.model_dump(mode="json")}
    return json.dumps(row)


def test_each_live_run_is_counted_once_whatever_rows_the_eval_appended(tmp_path: Path) -> None:
    """eval appends a question's row again after each method finishes: 2 runs, not 5."""
    results = tmp_path / "results.jsonl"
    lines = [
        _row("nt-1", False, {}),
        _row("nt-1", False, {"reflect": {}}),
        _row("nt-1", False, {"reflect": {}, "ics": {}}),
        _row("nt-2", True, {}),
        json.dumps({"question_id": "nt-3", "error": "the agent run failed"}),  # no trace: not a labelled run
    ]
    results.write_text("\n".join(lines) + "\n")
    runs = live_runs(results)
    assert [(r.question_id, r.wrong) for r in runs] == [("nt-1", True), ("nt-2", False)]


def _verdict(flagged: bool | None, basis: str | None = None) -> Measured:
    is_correct = None if flagged is None else not flagged
    return Measured(Verdict(verifier="v", is_correct=is_correct, basis=basis), calls=2, agent_runs=3, seconds=10.0)


def test_the_report_line_and_its_intervals() -> None:
    """The line the issue asks for, at the threshold: AUROC of the score, recall, precision, specificity and the
    base rate, then the intervals and flagging everything beside it."""
    trace = make_trace("q", [{"reasoning": "x"}])
    wrong = [Labelled(f"w{i}", trace, wrong=True) for i in range(4)]
    right = [Labelled(f"r{i}", trace, wrong=False) for i in range(3)]
    results = [
        _verdict(True, "consistency_disagree"),
        _verdict(True, "consistency_disagree"),
        _verdict(None),  # uncertain: not flagged, a miss
        Measured(None),  # the verifier failed: counted apart
        _verdict(True, "consistency_disagree"),  # a right run flagged
        _verdict(False, "consistency_agree"),
        _verdict(False, "consistency_agree"),
    ]
    scored = [
        Scored(True, 1.0),
        Scored(True, 0.7),
        Scored(True, None),  # no score: ranked lowest, never flagged
        Scored(True, None, failed=True),
        Scored(False, 0.7),
        Scored(False, 0.0),
        Scored(False, 0.3),
    ]
    text, right_per_basis, judged = report("consistency", wrong + right, results, scored, threshold=0.5)
    first, at, area, everything, cost, bases = text.splitlines()
    # AUROC: wrong (1.0, 0.7, lowest) against right (0.7, 0.0, 0.3): 5.5 of 9 pairs
    assert first == (
        "flagging verifier=consistency runs=7 auroc=0.61 recall=0.67 precision=0.67 specificity=0.67 base_rate=0.50"
    )
    assert "recall 95% [0.21, 0.94] (2 of 3)" in at and "specificity 95% [0.21, 0.94] (2 of 3)" in at
    assert "failed on 1 runs" in at and "AUROC 95% [" in area and "1 without a score ranked lowest" in area
    assert everything == "  flagging everything: recall 1.00, precision 0.50 (the base rate), specificity 0.00"
    assert cost == "  per run (each run's last measurement): 1.71 model calls, 2.57 agent runs, 8.6 s"
    assert judged == {"consistency_disagree": 3, "consistency_agree": 2}
    assert right_per_basis == {"consistency_disagree": 2, "consistency_agree": 2}
    assert "consistency_disagree 2 of 3 right" in bases
    assert operating_lines(scored, recall=0.6, calibrated=0.8, calibration_name="the calibration") == [
        "  at the calibration's recall-0.6 threshold 0.8: recall 0.33, specificity 1.00 [0.44, 1.00] (3 of 3), "
        "precision 1.00",
        "  at the highest threshold reaching recall 0.6 on these runs (0.7, chosen on them): recall 0.67, "
        "specificity 0.67 [0.21, 0.94] (2 of 3), precision 0.67",
    ]


SETTINGS = {"runs": "results.jsonl", "samples": 3, "temperature": 0.7, "model": "m"}


def test_a_resumed_measurement_runs_nothing_twice_but_what_failed(tmp_path: Path) -> None:
    calls: list[str] = []

    def measure() -> Measured:
        calls.append("measured")
        return _verdict(True, "audit_high")

    def fail() -> Measured:
        calls.append("failed")
        return Measured(Verdict(verifier="v", is_correct=None, error="the model server is down"))

    path = tmp_path / "flagging.jsonl"
    first = Journal(path, SETTINGS).get("nt-1", "proxy", measure)
    assert Journal(path, SETTINGS).get("nt-2", "proxy", fail).failed
    with path.open("a") as out:
        out.write('{"key": "nt-3", "verif')  # a stop mid-write
    resumed = Journal(path, SETTINGS)
    again = resumed.get("nt-1", "proxy", measure)
    retried = resumed.get("nt-2", "proxy", measure)  # a failure is measured again
    assert calls == ["measured", "failed", "measured"] and again.verdict == first.verdict and again.calls == 2
    assert not retried.failed
    with pytest.raises(SystemExit, match="give another --out"):
        Journal(path, SETTINGS | {"samples": 5})


def test_the_combined_verdict_reuses_the_consistency_checks_agent_runs(tmp_path: Path) -> None:
    """Measuring consistency and combined on a run costs its resamples once; a split check is decided by its score,
    with no audit (the journal keeps the combined verifier's audits only)."""
    runs = ScriptedResampler(lambda _t, sample, _temp: [{"reasoning": "Paris" if sample < 2 else "Lyon"}])
    trace = make_trace("capital?", [{"reasoning": "Paris", "is_final_answer": True}], final_answer="Paris")
    run = Labelled("q1", trace, wrong=False)
    auditor = ScriptedLLM([])
    bench = Bench(auditor, lambda _r: runs, Journal(tmp_path / "j.jsonl", SETTINGS), 3, 0.7)
    consistency = bench.measure("consistency", run)
    assert consistency.agent_runs == 3 and consistency.verdict is not None
    assert consistency.verdict.basis == "consistency_partial"
    combined = bench.measure("combined", run)
    assert len(runs.resampled) == 3  # not resampled again
    assert combined.agent_runs == 3 and combined.verdict is not None and combined.verdict.verifier == "combined"
    assert combined.verdict.basis == "consistency_partial" and combined.calls == 0 and auditor.requests == []
    assert {key[1] for key in bench.journal.done} == {"consistency"}


def test_a_journal_of_every_resample_is_reported_as_a_stopping_rule_would_have_drawn_it() -> None:
    """Resamples are drawn one at a time, in order: a check of three holds the check that stops at a lead of 2."""
    runs = ScriptedResampler(lambda _t, sample, _temp: [{"reasoning": ("Paris", "Paris", "Lyon")[sample]}])
    trace = make_trace("capital?", [{"reasoning": "Paris", "is_final_answer": True}], final_answer="Paris")
    full = ConsistencyVerifier(runs, samples=3).verify(trace, expected=None).consistency
    assert full is not None and full.agreeing == 2 and full.finished == 3
    cut = cut_at_lead(full, 2)
    assert (cut.finished, cut.agreeing, cut.stop_lead, cut.agent_runs) == (2, 2, 2, 2)
    split = ScriptedResampler(lambda _t, sample, _temp: [{"reasoning": ("Paris", "Lyon", "Lyon")[sample]}])
    whole = ConsistencyVerifier(split, samples=3).verify(trace, expected=None).consistency
    assert whole is not None and cut_at_lead(whole, 2).finished == 3  # 1-1, then the third


def test_a_failed_check_is_journaled_with_its_cost_and_measured_again_by_the_next_session_only(
    tmp_path: Path,
) -> None:
    """When no resample finished, the check failed: it is journaled (its cost re-derives from the journal), not
    measured again by this session's combined pass, which fails with it, and measured again by the next session."""
    from reflect_otel.errors import ReplayError

    def down(_t: object, _sample: int, _temp: float) -> list[dict[str, str]]:
        raise ReplayError("the agent's endpoint is down")

    trace = make_trace("capital?", [{"reasoning": "Paris", "is_final_answer": True}], final_answer="Paris")
    run = Labelled("q1", trace, wrong=False)
    anchors = {
        "hard": {"entities": [], "filters": [], "target_property": "capital", "operation": "lookup", "output_form": ""},
        "plans": [{"subgoals": ["name it"]}],
    }
    audit = {
        "steps": [{"macro_step": 1, "category": "Aligned", "severity": "minor", "anchor": "none", "rationale": "ok"}]
    }
    auditor = ScriptedLLM(by_stage={"proxy_anchors": [anchors], "proxy_audit": [audit]})
    path = tmp_path / "j.jsonl"
    bench = Bench(auditor, lambda _r: ScriptedResampler(down), Journal(path, SETTINGS), 3, 0.7)
    combined = bench.measure("combined", run)
    assert combined.failed and combined.calls == 0  # no audit alone: a report from the journal reads it so too
    assert combined.verdict is not None and "its consistency check failed" in str(combined.verdict.error)
    assert bench.measure("consistency", run).failed
    rows = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert [(r["key"], r["verifier"]) for r in rows] == [("q1", "consistency")]  # once: the combined pass read it
    assert rows[0]["agent_runs"] == 0 and rows[0]["verdict"]["error"]

    def up(_t: object, _sample: int, _temp: float) -> list[dict[str, Any]]:
        return [{"reasoning": "Paris", "is_final_answer": True}]

    resumed = Bench(auditor, lambda _r: ScriptedResampler(up), Journal(path, SETTINGS), 3, 0.7)
    again = resumed.measure("consistency", run)
    assert not again.failed and again.agent_runs >= 2
    assert Journal(path, SETTINGS).done[("q1", "consistency")].agent_runs == again.agent_runs  # the last row is read


def test_a_journal_line_cut_by_a_stop_is_cut_off_and_the_next_row_starts_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    journal = Journal(path, SETTINGS)
    verdict = Verdict(verifier="proxy", is_correct=True, confidence=0.9)
    journal.get("q1", "proxy", lambda: Measured(verdict, 1, 0, 1.0))
    with path.open("a", encoding="utf-8") as out:
        out.write('{"key": "q2", "verif')  # a stop mid-write
    resumed = Journal(path, SETTINGS)
    resumed.get("q3", "proxy", lambda: Measured(verdict, 2, 0, 1.0))
    assert set(Journal(path, SETTINGS).done) == {("q1", "proxy"), ("q3", "proxy")}
    assert all(line.startswith('{"') for line in path.read_text().splitlines())
    header_cut = tmp_path / "new.jsonl"
    header_cut.write_text('{"settings": {"sam')  # stopped while the journal was being started
    assert Journal(header_cut, SETTINGS).done == {} and json.loads(header_cut.read_text()) == {"settings": SETTINGS}


def test_a_results_file_cut_mid_write_is_read_without_its_last_line(tmp_path: Path) -> None:
    """An eval stopped mid-write leaves a cut last line (its resume mends it): the runs before it are measured."""
    results = tmp_path / "results.jsonl"
    results.write_text(_row("nt-1", False, {}) + "\n" + _row("nt-2", True, {})[:40])
    assert [r.question_id for r in live_runs(results)] == ["nt-1"]
    results.write_text(_row("nt-1", False, {}) + "\nnot json\n" + _row("nt-2", True, {}) + "\n")
    with pytest.raises(SystemExit, match=":2: not a JSON line"):  # damage inside the file is still refused
        live_runs(results)


def test_live_runs_are_resampled_by_the_agent_that_made_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The consistency check re-runs the run's own agent: the table agent (runs recorded before the agent was
    recorded are its), or the SQL agent through its OpenAI tool-loop adapter, which resamples from the run's first
    recorded request; an agent the benchmark cannot rebuild is refused."""
    pytest.importorskip("langgraph")
    from opentelemetry.sdk.trace import TracerProvider

    from benchmarks.flagging import _live_resampler
    from reflect_otel.config import LLMConfig
    from reflect_otel.demo.wtq import load_questions
    from reflect_otel.llm.factory import make_llm

    monkeypatch.setattr("reflect_otel.online.setup.instrumented_provider", TracerProvider)  # no global instrumenting
    question = next(q for q in load_questions() if q.id == "nt-1")
    run = tmp_path / "run"
    run.mkdir()
    config = {"data": str(Path(question.table).parent.parent), "max_steps": 4}
    (run / "run_config.json").write_text(json.dumps(config))
    (run / "results.jsonl").write_text(_row("nt-1", False, {}) + "\n")
    llm = make_llm(LLMConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key="k"), backend="openai")
    runs_for = _live_resampler(run / "results.jsonl", None, llm)
    source = runs_for(live_runs(run / "results.jsonl")[0])
    assert type(source).__name__ == "LangGraphReplayAdapter"  # nothing called: the endpoint is never reached
    (run / "run_config.json").write_text(json.dumps(config | {"agent": "sql"}))
    sql = _live_resampler(run / "results.jsonl", None, llm)(live_runs(run / "results.jsonl")[0])
    assert type(sql).__name__ == "OpenAIToolLoopReplayAdapter"
    (run / "run_config.json").write_text(json.dumps(config | {"agent": "other"}))
    with pytest.raises(SystemExit, match="the other agent, which this benchmark cannot rebuild"):
        _live_resampler(run / "results.jsonl", None, llm)


def test_a_long_measurement_logs_each_run_and_why_a_verifier_failed_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each run measured is a line on stderr with its verdict and cost, so a log shows how far an hours-long run is
    and, early, a verifier failing on every run with the reason (the report counts failures apart)."""
    import sys

    from benchmarks import flagging
    from reflect_otel.errors import LLMError

    results = tmp_path / "results.jsonl"
    results.write_text(_row("nt-1", False, {}) + "\n" + _row("nt-2", True, {}) + "\n")
    down = ScriptedLLM(respond=lambda _r: LLMError("endpoint http://127.0.0.1:9/v1 refused the connection"))
    monkeypatch.setattr(flagging, "make_llm", lambda: down)
    argv = ["flagging", "--live", str(results), "--verifiers", "evidence,proxy", "--out", str(tmp_path / "f")]
    monkeypatch.setattr(sys, "argv", argv)
    flagging.main()
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert "[evidence 1/2] nt-1 (wrong run): uncertain (not flagged); 0 model calls, 0 agent runs, 0.0 s" in lines
    assert "[evidence 2/2] nt-2 (right run): uncertain (not flagged); 0 model calls, 0 agent runs, 0.0 s" in lines
    failed = [line for line in lines if line.startswith("[proxy ")]
    assert len(failed) == 2 and all(
        "the verifier failed:" in line and "refused the connection" in line for line in failed
    )
    assert "the verifier failed on 2 runs" in captured.out


def test_a_verifier_failing_on_five_runs_in_a_row_stops_the_measurement_with_no_calibration_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead model server fails every run in seconds: the measurement stops, says why, and writes no calibration
    (a queue that waits for calibration.json then does not go on with one made of failures)."""
    import sys

    from benchmarks import flagging
    from reflect_otel.errors import LLMError

    results = tmp_path / "results.jsonl"
    results.write_text("".join(_row(f"nt-{i}", i % 2 == 0, {}) + "\n" for i in range(1, 8)))
    down = ScriptedLLM(respond=lambda _r: LLMError("the local llama.cpp server stopped"))
    monkeypatch.setattr(flagging, "make_llm", lambda: down)
    out = tmp_path / "f"
    argv = ["flagging", "--live", str(results), "--verifiers", "proxy", "--calibrate", "proxy", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=r"proxy failed on 5 runs in a row .*server stopped.*no calibration written"):
        flagging.main()
    assert not (out / "calibration.json").exists()
    assert len((out / "flagging.jsonl").read_text().splitlines()) == 1 + 5  # the settings, then each failure


def test_the_issues_command_resumes_beside_the_results_and_writes_the_calibration_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--live RESULTS --verifiers ...`` with no other option journals into RESULTS' folder and writes the
    calibration of the ``--calibrate`` verifier there: the command a user runs leaves the file the confidence
    needs (no file, no confidence shown)."""
    import sys

    from benchmarks import flagging
    from reflect_otel.flagging.calibration import ConfidenceCalibration

    results = tmp_path / "run" / "results.jsonl"
    results.parent.mkdir()
    results.write_text(_row("nt-1", False, {}) + "\n" + _row("nt-2", True, {}) + "\n")
    anchors = {
        "hard": {"entities": [], "filters": [], "target_property": "x", "operation": "lookup", "output_form": ""},
        "plans": [{"subgoals": ["name it"]}],
    }
    audit = {
        "steps": [{"macro_step": 1, "category": "Aligned", "severity": "minor", "anchor": "none", "rationale": "ok"}]
    }
    auditor = ScriptedLLM(by_stage={"proxy_anchors": [anchors, anchors], "proxy_audit": [audit, audit]})
    monkeypatch.setattr(flagging, "make_llm", lambda: auditor)
    argv = ["flagging", "--live", str(results), "--verifiers", "evidence,proxy", "--calibrate", "proxy"]
    monkeypatch.setattr(sys, "argv", argv)
    flagging.main()
    out = capsys.readouterr().out
    folder = results.parent / "flagging"
    calibration = ConfidenceCalibration.model_validate_json((folder / "calibration.json").read_text())
    assert f"wrote {folder / 'calibration.json'}" in out
    assert calibration.verifier == "plan_anchored"
    assert calibration.source.startswith("proxy's verdicts on 2 of 2 labelled runs (1 wrong)")
    assert "--verifiers evidence,proxy --calibrate proxy" in calibration.source  # the command that ran
    assert sum(judged for _right, judged in calibration.counts.values()) == 2  # both runs judged, each once
    journaled = (folder / "flagging.jsonl").read_text().splitlines()
    assert len(journaled) == 3  # the settings, then the two audits: a second run resumes from them

    monkeypatch.setattr(sys, "argv", [*argv[:-2], "--calibrate", "combined"])  # not measured: nothing written
    (folder / "calibration.json").unlink()
    flagging.main()
    assert "no calibration written" in capsys.readouterr().out and not (folder / "calibration.json").exists()
    assert len(auditor.requests) == 4  # the resumed run asked the auditor nothing more


def test_a_run_whose_answer_was_undecided_has_no_label_to_score_a_verifier_against(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join([_row("nt-1", False, {}), _row("nt-2", None, {}), _row("nt-3", True, {})]) + "\n")
    assert [(r.question_id, r.wrong) for r in live_runs(results)] == [("nt-1", True), ("nt-3", False)]


def _sample(folder: Path, ids: range) -> Path:
    """Labelled runs of a made-up agent: a wrong run answers 'Lyon', a right one 'Paris' (even ids wrong, and every
    third right one too, so that the resamples do not separate them perfectly)."""
    folder.mkdir(parents=True)
    rows = []
    for n in ids:
        wrong = n % 2 == 0
        answer = "Lyon" if wrong else "Paris"
        trace = make_trace(f"capital {n}?", [{"reasoning": answer, "is_final_answer": True}], final_answer=answer)
        row = {"question_id": f"nt-{n}", "correct": not wrong, "methods": {}, "trace": trace.model_dump(mode="json")}
        rows.append(json.dumps(row))
    (folder / "results.jsonl").write_text("\n".join(rows) + "\n")
    return folder / "results.jsonl"


def _resampled(run: Labelled) -> ScriptedResampler:
    """A wrong run's resamples answer 'Paris' (they do not reproduce it), a right run's repeat it, except every
    third run's, which split."""
    number = int((run.question_id or "nt-0").removeprefix("nt-"))
    answer = run.trace.final_answer or ""

    def resample(_t: StructuredTrace, sample: int, _temp: float) -> list[dict[str, str]]:
        if number % 3 == 0:
            return [{"reasoning": ("Paris", "Lyon", "Rome")[sample % 3]}]
        return [{"reasoning": "Paris" if run.wrong else answer}]

    return ScriptedResampler(resample)


def test_a_calibration_is_fitted_on_one_sample_and_refuses_to_score_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The calibration seed's runs fit a score map per verifier and record their question ids; scoring another
    sample with it reports AUROC and what each feature adds; scoring the same runs with it is refused."""
    import sys

    from benchmarks import flagging
    from reflect_otel.flagging.calibration import ConfidenceCalibration

    anchors = {
        "hard": {"entities": [], "filters": [], "target_property": "capital", "operation": "lookup", "output_form": ""},
        "plans": [{"subgoals": ["name it"]}],
    }
    audit = {
        "steps": [{"macro_step": 1, "category": "Aligned", "severity": "minor", "anchor": "none", "rationale": "ok"}]
    }
    auditor = ScriptedLLM(respond=lambda request: anchors if request.stage == "proxy_anchors" else audit)
    monkeypatch.setattr(flagging, "make_llm", lambda: auditor)
    monkeypatch.setattr(flagging, "_live_resampler", lambda *_a: _resampled)
    first = _sample(tmp_path / "calibration-seed", range(1, 31))
    argv = ["flagging", "--live", str(first), "--verifiers", "evidence,proxy,consistency,combined", "--stop-lead", "0"]
    monkeypatch.setattr(sys, "argv", [*argv, "--samples", "3"])
    flagging.main()
    written = first.parent / "flagging" / "calibration.json"
    calibration = ConfidenceCalibration.model_validate_json(written.read_text())
    assert calibration.sample is not None and calibration.sample.question_ids == tuple(f"nt-{n}" for n in range(1, 31))
    assert calibration.sample.wrong == 15 and calibration.sample.journal.endswith("flagging.jsonl")
    fitted = calibration.score_map("consistency")
    assert fitted is not None and "disagreement" in fitted.features and fitted.fitted_on == 30
    # evidence: nothing varies to fit; the proxy, with no map, at its own score (an operating point out of sample)
    assert set(calibration.recall_thresholds) == {"plan_anchored", "consistency", "combined"}
    capsys.readouterr()

    second = _sample(tmp_path / "scoring-seed", range(31, 61))
    monkeypatch.setattr(sys, "argv", ["flagging", "--live", str(second), "--verifiers", "consistency", "--samples",
                                      "3", "--stop-lead", "0", "--calibration", str(written)])  # fmt: skip
    flagging.main()
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("flagging verifier=consistency"))
    assert line.startswith("flagging verifier=consistency runs=30 auroc=") and "base_rate=0.50" in line
    assert "at the calibration's recall-0.8 threshold" in out
    assert "disagreement: alone " in out and "the map without it" in out

    monkeypatch.setattr(sys, "argv", [*argv, "--calibration", str(written)])
    with pytest.raises(SystemExit, match=r"30 of the runs to score are among them .* in-sample"):
        flagging.main()


def test_a_run_whose_agent_cannot_be_rebuilt_is_a_failed_check_not_a_crash(tmp_path: Path) -> None:
    """A table-agent trace that no longer restores raised out of the measurement, and every resume raised again at
    the same run: it is that run's failure now, and the measurement goes on."""
    from reflect_otel.errors import ReplayError

    def unrestorable(_run: Labelled) -> None:
        raise ReplayError("step 2's call gave other rows than the recorded ones")

    trace = make_trace("capital?", [{"reasoning": "Paris", "is_final_answer": True}], final_answer="Paris")
    bench = Bench(ScriptedLLM([]), unrestorable, Journal(tmp_path / "j.jsonl", SETTINGS), 3, 0.7)
    measured = bench.measure("consistency", Labelled("q1", trace, wrong=False))
    assert measured.failed and measured.verdict is not None
    assert measured.verdict.error == "no resampler: step 2's call gave other rows than the recorded ones"


def test_a_report_from_the_journal_leaves_a_journal_being_written_as_it_is(tmp_path: Path) -> None:
    """``--journal-only`` beside a running measurement: a row being written is skipped, and the file not touched."""
    from benchmarks.flagging import read_journal

    path = tmp_path / "j.jsonl"
    verdict = Verdict(verifier="proxy", is_correct=True, confidence=0.9)
    Journal(path, SETTINGS).get("q1", "proxy", lambda: Measured(verdict, 1, 0, 1.0))
    with path.open("a", encoding="utf-8") as out:
        out.write('{"key": "q2", "verif')  # the measurement, mid-write
    before = path.read_bytes()
    assert set(read_journal(path).done) == {("q1", "proxy")}
    assert path.read_bytes() == before


def test_runs_whose_agent_cannot_be_rebuilt_never_stop_the_measurement_and_requests_count_repairs() -> None:
    """Such a run fails alike on every resume: five in a row are counted apart, not taken for a dead server. A
    verdict's model calls are its requests, a schema repair included."""
    from benchmarks.flagging import _requests, _stop_if_failing
    from reflect_otel.llm.recording import CallLog
    from reflect_otel.record import LLMCall

    unrebuilt = Verdict(verifier="consistency", is_correct=None, confidence=None, error="no resampler: other rows")
    _stop_if_failing("consistency", [Measured(unrebuilt)] * 5)  # returns: nothing a retry mends
    down = Verdict(verifier="consistency", is_correct=None, confidence=None, error="the server stopped")
    with pytest.raises(SystemExit, match="consistency failed on 5 runs in a row"):
        _stop_if_failing("consistency", [Measured(unrebuilt), *[Measured(down)] * 5])
    log = CallLog()
    for attempts in (1, 2):
        log.add(LLMCall(stage="proxy_audit", model="m", prompt_tokens=1, completion_tokens=1, seconds=0.1,
                        attempts=attempts, ok=True))  # fmt: skip
    assert _requests(log) == 3
