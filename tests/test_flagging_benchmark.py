"""benchmarks.flagging's counting: each live run once, recall/precision/F1 with their intervals, and a resumed
measurement that runs nothing twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.flagging import Bench, Journal, Labelled, Measured, live_runs, report
from reflect_otel.testing import ScriptedLLM, ScriptedResampler, make_trace
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
    text, right_per_basis, judged = report("consistency", wrong + right, results)
    first, intervals, cost, bases = text.splitlines()
    assert first == "flagging verifier=consistency runs=7 recall=0.67 precision=0.67 f1=0.67"
    assert "recall 95% [0.21, 0.94] (2 of 3)" in intervals and "failed on 1 runs" in intervals
    assert cost == "  per run: 1.71 model calls, 2.57 agent runs, 8.6 s"
    assert judged == {"consistency_disagree": 3, "consistency_agree": 2}
    assert right_per_basis == {"consistency_disagree": 2, "consistency_agree": 2}
    assert "consistency_disagree 2 of 3 right" in bases


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
    """Measuring consistency and combined on a run costs its resamples once; a split check goes to an audit that
    is journaled as the combined verifier's, apart from the plain proxy's."""
    runs = ScriptedResampler(lambda _t, sample, _temp: [{"reasoning": "Paris" if sample < 2 else "Lyon"}])
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
    bench = Bench(auditor, lambda _r: runs, Journal(tmp_path / "j.jsonl", SETTINGS), 3, 0.7)
    consistency = bench.measure("consistency", run)
    assert consistency.agent_runs == 3 and consistency.verdict is not None
    assert consistency.verdict.basis == "consistency_partial"
    combined = bench.measure("combined", run)
    assert len(runs.resampled) == 3  # not resampled again
    assert combined.agent_runs == 3 and combined.verdict is not None and combined.verdict.verifier == "combined"
    assert {key[1] for key in bench.journal.done} == {"consistency", "combined"}
    assert combined.calls == 2 and "2 of 3 resamples reproduced" in auditor.requests[-1].text


def test_a_combined_verdict_made_on_a_failed_check_is_not_journaled(tmp_path: Path) -> None:
    """When no resample finished, the combined verdict is the audit alone; a resume measures the check again, so
    that verdict must not be reused beside a check that then succeeds."""
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
    assert combined.verdict is not None and combined.verdict.basis == "audit_low_clean"  # the audit alone decided
    assert bench.measure("consistency", run).failed
    assert bench.journal.done == {} and len(path.read_text().splitlines()) == 1  # the settings line only


def test_a_results_file_cut_mid_write_is_read_without_its_last_line(tmp_path: Path) -> None:
    """An eval stopped mid-write leaves a cut last line (its resume mends it): the runs before it are measured."""
    results = tmp_path / "results.jsonl"
    results.write_text(_row("nt-1", False, {}) + "\n" + _row("nt-2", True, {})[:40])
    assert [r.question_id for r in live_runs(results)] == ["nt-1"]
    results.write_text(_row("nt-1", False, {}) + "\nnot json\n" + _row("nt-2", True, {}) + "\n")
    with pytest.raises(SystemExit, match=":2: not a JSON line"):  # damage inside the file is still refused
        live_runs(results)


def test_live_runs_are_resampled_by_the_table_agent_and_sql_runs_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consistency check re-runs the table agent (runs recorded before the agent was recorded are its); the
    benchmark rebuilds only the table agent, so the SQL agent's runs are refused with the fix rather than re-run
    as the table agent's."""
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
    with pytest.raises(SystemExit, match="sql agent; this benchmark rebuilds only the table agent"):
        _live_resampler(run / "results.jsonl", None, llm)


def test_a_long_measurement_logs_each_run_and_why_a_verifier_failed_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each run measured is a line on stderr with its verdict and cost, so a log shows how far an hours-long run is
    and, early, a verifier failing on every run with the reason (the journal keeps no failure; the report only
    counts them)."""
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


def test_the_issues_command_resumes_beside_the_results_and_writes_the_calibration_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--live RESULTS --verifiers ...`` with no other option journals into RESULTS' folder and writes the
    calibration of the ``--calibrate`` verifier there: the command a user runs leaves the file the confidence
    needs (no file, no confidence shown)."""
    import sys

    from benchmarks import flagging
    from reflect_otel.calibration import ConfidenceCalibration

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
