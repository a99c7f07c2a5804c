"""The questions a fresh sample must exclude: every wtq-live folder's rows and its own --exclude, whichever way an
older run kept it, a running measurement's cut last line skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks._used_questions import main, used_questions


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


def test_the_printed_list_is_what_evals_exclude_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from benchmarks.evaluation.command import excluded_ids

    (tmp_path / "wtq-live-a").mkdir()
    (tmp_path / "wtq-live-a" / "results.jsonl").write_text('{"question_id": "nt-10"}\n{"question_id": "nt-2"}\n')
    monkeypatch.setattr(sys, "argv", ["_used_questions", "--results", str(tmp_path)])
    main()
    printed = capsys.readouterr().out
    assert printed == "nt-2,nt-10\n" and excluded_ids(printed) == ("nt-2", "nt-10")
