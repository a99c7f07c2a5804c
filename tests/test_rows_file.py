"""A results file replaced under a running evaluation (a git stash did it to seed 48's) loses no row: the run stops
with an error naming the file that holds everything it wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.evaluation.rows_file import RowsFile
from reflect_otel.errors import InputError


def test_rows_are_appended_and_flushed_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"question_id": "nt-0"}\n')
    with RowsFile(path) as rows:
        rows.append({"question_id": "nt-1"})
        assert path.read_text().splitlines() == ['{"question_id": "nt-0"}', '{"question_id": "nt-1"}']  # flushed


def test_a_file_replaced_under_the_run_stops_it_and_keeps_every_row_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"question_id": "nt-0"}\n')
    with RowsFile(path) as rows:
        rows.append({"question_id": "nt-1"})
        older = tmp_path / "older.jsonl"
        shutil.copy(path, older)
        rows.append({"question_id": "nt-2"})
        older.replace(path)  # as git stash pop writes the file: a new file renamed over the path
        with pytest.raises(InputError, match="was replaced or removed while this run appended") as raised:
            rows.append({"question_id": "nt-3"})
    (orphaned,) = tmp_path.glob("results.jsonl.orphaned-*")
    kept = [json.loads(line)["question_id"] for line in orphaned.read_text().splitlines()]
    assert kept == ["nt-0", "nt-1", "nt-2", "nt-3"] and str(orphaned) in str(raised.value)
    assert orphaned.read_text().startswith(path.read_text())  # the file now at the path is a prefix: mv restores


def test_a_file_removed_under_the_run_stops_it_too(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with RowsFile(path) as rows:
        rows.append({"trace_id": "a"})
        path.unlink()
        with pytest.raises(InputError, match="mv "):
            rows.append({"trace_id": "b"})
    (orphaned,) = tmp_path.glob("results.jsonl.orphaned-*")
    assert len(orphaned.read_text().splitlines()) == 2
