"""The questions a fresh sample must exclude: every wtq-live folder's rows and its own --exclude, whichever way an
older run kept it, a running measurement's cut last line skipped."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks._used_questions import used_questions


def test_every_wtq_live_folders_questions_and_exclusions_are_used(tmp_path: Path) -> None:
    old, running, other = tmp_path / "wtq-live-seed24", tmp_path / "wtq-live-controlled-seed48", tmp_path / "bbm-x"
    for folder in (old, running, other):
        folder.mkdir()
    (old / "run_config.json").write_text(json.dumps({"exclude": "nt-1, nt-3"}))
    (old / "results.jsonl").write_text('{"question_id": "nt-24"}\n')
    (running / "run_config.json").write_text(json.dumps({"exclude": ["nt-1", "nt-437"]}))
    (running / "results.jsonl").write_text('{"question_id": "nt-48"}\n{"question_id": "nt-4')
    (other / "results.jsonl").write_text('{"question_id": "nt-9"}\n')
    assert used_questions(tmp_path) == {"nt-1", "nt-3", "nt-24", "nt-437", "nt-48"}
    assert used_questions(tmp_path, skip=("wtq-live-controlled-seed48",)) == {"nt-1", "nt-3", "nt-24"}
