"""wtq-live's results rows are typed values: rows of every code that wrote them load, a stored row written back keeps
its own keys (those this code does not know included), and adding a method makes a new row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.evaluation.live_rows import LiveRow, MethodRow, parse_live_row, read_live_rows
from reflect_otel.errors import InputError

ROWS = Path(__file__).parent / "data" / "wtq_live_seed46_rows.jsonl"


def _stored() -> list[dict[str, object]]:
    return [json.loads(line) for line in ROWS.read_text(encoding="utf-8").splitlines()]


def test_a_stored_row_written_back_is_the_row_it_was_read_from() -> None:
    for stored in _stored():
        assert LiveRow.model_validate(stored).line() == stored


def test_an_older_row_keeps_its_unknown_keys_and_gains_no_field_it_did_not_have() -> None:
    older = {
        "question_id": "nt-7",
        "correct": False,
        "methods": {"ics": {"status": "verified", "step": 2, "corrected": True, "replays": 3, "note": "kept"}},
        "from_older_code": [1, 2],
    }
    row = LiveRow.model_validate(older)
    assert row.line() == older
    method = row.methods["ics"]
    assert method.flip is True  # the name older rows gave 'flipped'
    assert method.control_replays is None and method.record is None
    assert row.failed and row.method_order is None


def test_adding_a_method_makes_a_new_row_and_leaves_the_stored_one_as_it_was() -> None:
    stored = LiveRow.model_validate({"question_id": "nt-7", "correct": False, "method_order": ["reflect"]})
    added = stored.with_method("ics", MethodRow(status="unverified"))
    assert stored.methods == {} and stored.method_order == ("reflect",)
    assert list(added.methods) == ["ics"] and added.method_order == ("reflect", "ics")
    with pytest.raises(ValueError):
        stored.question_id = "nt-8"  # type: ignore[misc]


def test_a_row_without_an_order_gets_none_when_a_method_is_added() -> None:
    """Rows made before orders were recorded, with methods already run, stay without one."""
    ics = {"status": "unverified"}
    stored = LiveRow.model_validate({"question_id": "nt-7", "correct": False, "methods": {"ics": ics}})
    assert "method_order" not in stored.with_method("reflect", MethodRow(status="unverified")).line()


def test_a_failure_stopped_before_its_first_method_starts_its_order_on_resume() -> None:
    """The row a run stores before its first method finishes has no order; its resumed methods are the order."""
    stored = LiveRow.model_validate({"question_id": "nt-1411", "correct": False})
    resumed = stored.with_method("ics", MethodRow(status="unverified")).with_method(
        "reflect", MethodRow(status="verified")
    )
    assert resumed.line()["method_order"] == ["ics", "reflect"]


def test_the_last_row_of_each_question_wins_and_a_row_of_another_shape_is_named(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    first = {"question_id": "nt-1", "correct": False, "methods": {}}
    then = {**first, "methods": {"ics": {"status": "verified", "replays": 2}}}
    results.write_text(f"{json.dumps(first)}\n{json.dumps(then)}\n")
    rows = read_live_rows(results)
    assert list(rows) == ["nt-1"] and rows["nt-1"].methods["ics"].replays == 2
    with pytest.raises(InputError, match="results row nt-9: not a wtq-live row"):
        parse_live_row("nt-9", {"question_id": "nt-9", "correct": False, "methods": {"ics": "verified"}})
