"""eval-compare on a wtq-live folder without metrics.json reads each question's last row, as a resume does: the
harness writes a question's row again as each method finishes, so a row seen twice is one question, not two."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.evaluation.compare import load_runs

SHIPPED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "wtq-live-actions-seed25"


def _figures(folder: Path) -> dict[str, dict[str, object]]:
    return {run.label: run.metrics for run in load_runs([folder])}


def test_a_question_written_again_counts_once(tmp_path: Path) -> None:
    once, twice = tmp_path / "once", tmp_path / "twice"
    for folder in (once, twice):
        folder.mkdir()
        shutil.copy(SHIPPED / "run_config.json", folder / "run_config.json")
    lines = (SHIPPED / "results.jsonl").read_text(encoding="utf-8").splitlines()
    (once / "results.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # each row written again later, as the harness does when the next method ends (the last row wins)
    (twice / "results.jsonl").write_text("\n".join(lines + lines) + "\n", encoding="utf-8")
    questions = {json.loads(line)["question_id"] for line in lines}
    assert _figures(once) == _figures(twice)
    assert all(metrics["questions"] == len(questions) for metrics in _figures(twice).values())
