"""benchmarks.flagging's counting: each live run once, recall/precision/F1 with their intervals, and a resumed
measurement that runs nothing twice."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.flagging import Journal, Labelled, Measured, live_runs, report
from reflect_otel.testing import make_trace
from reflect_otel.verdict import Verdict


def _row(question: str, correct: bool, methods: dict[str, object]) -> str:
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


def test_a_resumed_measurement_runs_nothing_twice(tmp_path: Path) -> None:
    calls: list[str] = []

    def measure() -> Measured:
        calls.append("measured")
        return _verdict(True, "audit_high")

    first = Journal(tmp_path / "flagging.jsonl").get("nt-1", "proxy", measure)
    again = Journal(tmp_path / "flagging.jsonl").get("nt-1", "proxy", measure)
    assert calls == ["measured"] and again.verdict == first.verdict and again.calls == 2
