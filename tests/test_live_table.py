"""The wtq-live table reads the records as the measurement wrote them. The rows are three real ones of the seed-46
measurement (``tests/data/wtq_live_seed46_rows.jsonl``: nt-1273, nt-104 and nt-977, all five methods, written by the
frozen code 1daae3b; only the steps' ``model_input`` and ``tool_result_raw`` are emptied, which no report reads).
Every number asserted here was counted by hand from those records."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.evaluation.live_metrics import live_metrics
from benchmarks.evaluation.live_rows import LiveRow
from benchmarks.evaluation.live_table import live_metrics_markdown
from benchmarks.results_tables import wtq_table

ROWS = Path(__file__).parent / "data" / "wtq_live_seed46_rows.jsonl"
METHODS = ("reflect", "reflect-guidance", "ics", "control-placebo", "control-wrong-step")


def _live_metrics(rows: list[dict[str, Any]], methods: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """The metrics of rows given as the JSON lines a results file holds."""
    return live_metrics([LiveRow.model_validate(row) for row in rows], methods)


def _rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in ROWS.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def metrics() -> dict[str, Any]:
    return _live_metrics(_rows(), METHODS)


@pytest.fixture(scope="module")
def table(metrics: dict[str, Any]) -> str:
    return live_metrics_markdown(metrics, "qwen2.5-coder-1.5b-instruct")


def _row(table: str, method: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {method} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def _column(table: str, method: str, header: str) -> str:
    headers = _row(table, "method")
    return _row(table, method)[headers.index(header)]


def test_verified_is_the_attributions_rule_and_the_strict_reading_has_its_own_column(
    metrics: dict[str, Any], table: str
) -> None:
    ics, placebo = metrics["methods"]["ics"], metrics["methods"]["control-placebo"]
    # ICS nt-1273: verified; its three controls at rollback point 0 all answered 'Charles Zwolsman', not the run's
    assert ics["verified"]["mean"] == pytest.approx(1 / 3)
    assert ics["verified_reproducing"]["mean"] == 0
    # the placebo's nt-104 verification at step 2: its control at rollback point 1 gave the run's answer
    assert placebo["verified"]["mean"] == placebo["verified_reproducing"]["mean"] == 0.5
    assert _column(table, "ics", "verified") == "33.3% ± 33.3"
    assert _column(table, "ics", "verified, control gave the run's answer") == "0.0% ± 0.0"
    assert _column(table, "control-wrong-step", "verified, control gave the run's answer") == "33.3% ± 33.3"
    assert "reproduced the run)" not in table  # the old header's definition, which ICS nt-1273 contradicts
    assert "did not answer right; where that control gave another answer than the run's, more controls" in table


def test_a_record_from_before_controls_has_no_strict_reading(metrics: dict[str, Any]) -> None:
    rows = _rows()
    for row in rows:
        for method in row["methods"].values():
            for replay in method["record"]["replays"]:
                del replay["arm"]
    old = _live_metrics(rows, METHODS)
    assert old["methods"]["ics"]["verified_reproducing"] is None
    assert _column(live_metrics_markdown(old, "m"), "ics", "verified, control gave the run's answer") == "-"


def test_trajectory_fidelity_counts_controls_that_repeated_the_runs_calls(metrics: dict[str, Any], table: str) -> None:
    reflect, wrong_step = metrics["methods"]["reflect"], metrics["methods"]["control-wrong-step"]
    # reflect: only nt-1273's control from step 1 (no call, the run's answer) repeated the run; nt-104's controls
    # answered without the run's count_rows; nt-977's called lookup where the run filtered
    assert reflect["fidelity"] == {"reproduced": 5, "controls": 6}
    assert reflect["trajectory_fidelity"] == {"repeated": 1, "controls": 6}
    # wrong-step nt-977, rollback point 0: the run's three calls, then '9' worded as a sentence (answer not reproduced)
    assert wrong_step["fidelity"] == {"reproduced": 3, "controls": 5}
    assert wrong_step["trajectory_fidelity"] == {"repeated": 2, "controls": 5}
    assert _column(table, "ics", "answer fidelity") == "4 of 7"
    assert _column(table, "ics", "trajectory fidelity") == "1 of 7"
    assert "trajectory fidelity: control replays that repeated the run's steps after the prefix" in table


def test_trajectory_fidelity_needs_the_same_arguments_and_no_other_call() -> None:
    rows = _rows()
    nt977 = rows[2]["methods"]["ics"]["record"]
    repeated = next(a for a in nt977["replays"] if a["arm"] == "control" and a["rollback_point"] == 0)
    assert _live_metrics([rows[2]], ["ics"])["methods"]["ics"]["trajectory_fidelity"]["repeated"] == 1

    changed = copy.deepcopy(rows[2])
    control = next(a for a in changed["methods"]["ics"]["record"]["replays"] if a["sample"] == repeated["sample"]
                   and a["arm"] == "control" and a["rollback_point"] == 0)  # fmt: skip
    control["continuation"][1]["tool_args"]["op"] = ">"
    assert _live_metrics([changed], ["ics"])["methods"]["ics"]["trajectory_fidelity"]["repeated"] == 0

    longer = copy.deepcopy(rows[2])
    control = next(a for a in longer["methods"]["ics"]["record"]["replays"] if a["arm"] == "control"
                   and a["rollback_point"] == 0)  # fmt: skip
    control["continuation"].insert(-1, copy.deepcopy(control["continuation"][-2]))
    assert _live_metrics([longer], ["ics"])["methods"]["ics"]["trajectory_fidelity"]["repeated"] == 0


def test_calls_are_model_requests_and_proposals_are_the_decisions_sampled(metrics: dict[str, Any], table: str) -> None:
    reflect, ics = metrics["methods"]["reflect"], metrics["methods"]["ics"]
    # reflect: 6, 7 and 10 calls, each record with one localize call repaired (2 attempts): 7, 8 and 11 requests
    assert reflect["llm_calls"]["mean"] == pytest.approx(23 / 3)
    assert reflect["model_requests"]["mean"] == pytest.approx(26 / 3)
    # two batches of 3 decisions per record; the records list 2, 4 and 5 of them (repeats dropped)
    assert reflect["proposals"]["mean"] == 6 and reflect["proposals_kept"]["mean"] == pytest.approx(11 / 3)
    assert reflect["agent_proposal_requests"]["mean"] == 6
    # ICS nt-977: 'proposal 1 of 3, 2 of 3' at step 1, then the same at step 2: two batches, 6 decisions
    assert ics["proposals"]["mean"] == 5 and ics["model_requests"]["mean"] == pytest.approx(7 / 3)
    assert _column(table, "reflect", "proposals sampled") == "6.0 ± 0.0"
    assert (
        _column(table, "reflect", "model requests: auditor, agent (proposals), agent (all)")
        == "8.7 ± 1.2, 6.0 ± 0.0, -"
    )
    assert "outside the replay budget" in table


def test_the_agents_own_requests_are_shown_only_where_the_rows_code_recorded_them() -> None:
    rows = _rows()
    newer = copy.deepcopy(rows)
    for row in newer:  # as the code from schema 8 on writes them: the agent's requests in the row and its stage cost
        for index, method in enumerate(row["methods"].values()):
            method["agent_calls"] = 4 + index
    assert _live_metrics(rows, METHODS)["methods"]["reflect"]["agent_requests"] is None  # 1daae3b: not recorded
    recorded = _live_metrics(newer, METHODS)
    assert recorded["methods"]["reflect"]["agent_requests"]["mean"] == 4
    assert recorded["methods"]["ics"]["agent_requests"]["mean"] == 6
    column = "model requests: auditor, agent (proposals), agent (all)"
    table = live_metrics_markdown(recorded, "m")
    assert _column(table, "reflect", column) == "8.7 ± 1.2, 6.0 ± 0.0, 4.0 ± 0.0"
    mixed = copy.deepcopy(rows)
    mixed[0]["methods"]["reflect"]["agent_calls"] = 9  # one row knows, the others do not: no mean of a part
    assert _live_metrics(mixed, METHODS)["methods"]["reflect"]["agent_requests"] is None


def test_a_skipped_placebo_is_not_scored_but_its_cost_is_reported_and_the_denominators_differ(
    metrics: dict[str, Any], table: str
) -> None:
    placebo = metrics["methods"]["control-placebo"]
    assert (placebo["runs"], placebo["scored"], placebo["skipped"]) == (3, 2, 1)
    assert placebo["unscored"] == [
        {
            "question_id": "nt-1273",
            "status": "skipped",
            "failed": False,
            "reason": placebo["unscored"][0]["reason"],
            "llm_calls": 6,
            "model_requests": 7,
            "proposals": 0,
            "replays": 0,
            "tokens": 10667,
            "seconds": 140.362,
        }
    ]
    assert placebo["unscored"][0]["reason"].startswith("no plan written for another failure yet")
    assert "The denominators differ: scored runs reflect 3, reflect-guidance 3, ics 3, control-placebo 2" in table
    assert (
        "- control-placebo nt-1273: skipped (no plan written for another failure yet): 6 auditor calls "
        "(7 model requests), 0 agent decisions sampled, 0 replays, 10667 tokens, 140 s" in table
    )
    assert "- control-placebo: verified 1 of the 3 runs given, a run not scored counted as not verified" in table


def test_wrong_step_targets_that_a_round_localized_are_counted(metrics: dict[str, Any], table: str) -> None:
    targets = metrics["methods"]["control-wrong-step"]["targets"]
    # nt-1273: step 1; nt-104: steps 2 and 1; nt-977: steps 3 and 1. REFLECT localized 1 and 2 on each question;
    # step 3 of nt-977 only the wrong-step record's own round 2 did
    assert (targets["targets"], targets["reflect_localized"], targets["own_round_localized"]) == (5, 4, 5)
    assert [(r["question_id"], r["verified_step"]) for r in targets["records"]] == [
        ("nt-1273", None),
        ("nt-104", 1),
        ("nt-977", None),
    ]
    assert "Wrong-step targets that REFLECT also localized: 4 of 5" in table
    assert (
        "- nt-104: step 2 (localized by REFLECT and its other round), step 1 (localized by REFLECT and its other "
        "round); verified at step 1" in table
    )
    assert "- nt-977: step 3 (localized by its other round), step 1" in table


def test_the_results_tables_command_prints_the_table_of_a_measurement_folder(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    right = {"question_id": "nt-0", "correct": True, "methods": {}}
    lines = [json.dumps(right), *ROWS.read_text(encoding="utf-8").splitlines()]
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "run_config.json").write_text(json.dumps({"methods": list(METHODS), "model": "m"}))
    printed = wtq_table(folder)
    assert printed.startswith("wtq-live, model m: 4 questions, 1 answered right, 3 failed runs")
    assert _column(printed, "ics", "verified, control gave the run's answer") == "0.0% ± 0.0"


def test_seconds_are_given_over_the_runs_measured_alone_and_a_running_measurement_is_read_untouched(
    tmp_path: Path,
) -> None:
    """A window of ``contention.tsv`` inside REFLECT's nt-1273 run (13:42:42 to 13:49:14 by its record) leaves that
    run out of REFLECT's seconds alone: (291.185 + 376.833) / 2 over nt-104 and nt-977. The results file, its last
    line cut as a run in progress leaves it, is read without being mended (only the run that appends may cut it)."""
    folder = tmp_path / "run"
    folder.mkdir()
    cut = ROWS.read_text(encoding="utf-8") + '{"question_id": "nt-5", "corr'
    (folder / "results.jsonl").write_text(cut, encoding="utf-8")
    (folder / "run_config.json").write_text(json.dumps({"methods": list(METHODS), "model": "m"}))
    assert "No contention.tsv in the folder" in wtq_table(folder)
    (folder / "contention.tsv").write_text(
        "# start\tend\twhat ran\n2026-11-26T13:45Z\t2026-11-26T13:46Z\tpytest at nice 19\n", encoding="utf-8"
    )
    printed = wtq_table(folder)
    assert "- reflect: 334 ± 43 s over 2 runs measured alone (1 contended, left out)" in printed
    assert (folder / "results.jsonl").read_text(encoding="utf-8") == cut
    (folder / "contention.tsv").write_text("2026-11-26 13:45\t13:46\n", encoding="utf-8")
    printed = wtq_table(folder)  # a bad line costs the seconds alone, not the table
    assert printed.startswith("wtq-live, model m: 3 questions")
    assert (
        "Seconds measured alone not given:" in printed
        and "contention.tsv:1: '2026-11-26 13:45' is not an ISO" in printed
    )


def test_windows_written_to_the_minute_cover_the_minute_and_an_open_window_everything_after(tmp_path: Path) -> None:
    from benchmarks._contention import contended, read_windows

    rows = _rows()
    reflect = {r["question_id"]: r["methods"]["reflect"] for r in rows}  # nt-1273 ends 13:49:14.66
    windows_file = tmp_path / "contention.tsv"
    windows_file.write_text("2026-11-26T13:40Z\t2026-11-26T13:42Z\tended 13:42:59\n", encoding="utf-8")
    # nt-1273 began at 13:42:42: inside the minute the window's end names
    assert contended(reflect["nt-1273"], read_windows(windows_file)) is True
    windows_file.write_text("2026-11-26T14:10Z\t-\tstill open\n", encoding="utf-8")
    open_window = read_windows(windows_file)
    assert [contended(reflect[q], open_window) for q in ("nt-1273", "nt-104", "nt-977")] == [False, False, True]
    no_time = {"seconds": 3.0, "record": {}}
    assert contended(no_time, open_window) is None


def test_each_correction_considered_is_counted_as_replayed_or_by_the_general_reason_it_was_refused(
    metrics: dict[str, Any], table: str
) -> None:
    # reflect: nt-1273's two auditor calls and nt-104's one were replayed, and three proposals repeated those calls;
    # five proposals of nt-104 and nt-977 were judged unfaithful by the gate (in other words each: counted together)
    reflect = metrics["methods"]["reflect"]["corrections"]
    assert reflect == {
        "refused: the gate judged it unfaithful to the plan": 5,
        "replayed": 3,
        "refused: the same call was already replayed at this step": 3,
        "refused: the replacement repeats the original step": 2,
        "refused: the agent answered at once": 1,
    }
    assert metrics["methods"]["control-placebo"]["corrections"] == {"replayed": 4}
    assert (
        "- reflect: 14 considered: refused: the gate judged it unfaithful to the plan 5; replayed 3; refused: the same "
        "call was already replayed at this step 3;" in table
    )


def test_the_auditors_requests_leave_out_the_agents_which_the_record_lists_too() -> None:
    rows = _rows()
    record = rows[0]["methods"]["ics"]["record"]
    auditor = _live_metrics(rows[:1], ["ics"])["methods"]["ics"]["model_requests"]["mean"]
    record["llm_calls"] = [*record["llm_calls"], *({"stage": "agent_replay", "attempts": 1} for _ in range(5))]
    assert _live_metrics(rows[:1], ["ics"])["methods"]["ics"]["model_requests"]["mean"] == auditor


def _evidence(rule: str, *, refused: str | None = None, replays: int = 1) -> dict[str, Any]:
    return {"source": f"evidence:{rule}", "kind": "action", "step_index": 2, "refused": refused, "replays": replays}


def test_the_results_tables_count_what_each_evidence_rule_did_per_method(tmp_path: Path) -> None:
    """The three real rows with evidence corrections written into their records: nt-1273's REFLECT proposed two
    unquoted_name corrections and replayed them (one failure: fired 1, tried 1), unverified; nt-104's wrong-step
    control was verified by one; nt-977's REFLECT had a last_row correction refused, and a plugin's rule tried. A
    run answered right counts for nothing, whatever its records hold."""
    rows = copy.deepcopy(_rows())
    by_id = {r["question_id"]: r for r in rows}
    reflect = by_id["nt-1273"]["methods"]["reflect"]["record"]
    reflect["corrections"] += [_evidence("unquoted_name"), _evidence("unquoted_name")]
    wrong_step = by_id["nt-104"]["methods"]["control-wrong-step"]["record"]
    assert wrong_step["status"] == "verified"
    wrong_step["corrections"].append(_evidence("unquoted_name"))
    wrong_step["intervention"]["correction"] = _evidence("unquoted_name")
    refused = by_id["nt-977"]["methods"]["reflect"]["record"]
    refused["corrections"] += [_evidence("last_row", refused="the replacement is a final answer", replays=0)]
    refused["corrections"] += [_evidence("my_rule")]
    right = copy.deepcopy(by_id["nt-977"]) | {"question_id": "nt-0", "correct": True}
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [right, *rows]), encoding="utf-8")
    (folder / "run_config.json").write_text(json.dumps({"methods": list(METHODS), "model": "m"}))
    printed = wtq_table(folder)
    assert "Evidence rules over the 3 failed runs, fired / tried / verified" in printed
    rules = {
        cells[0]: dict(zip(METHODS, cells[1:], strict=True))
        for line in printed.split("Evidence rules over", 1)[1].splitlines()
        if line.startswith("| ") and not line.startswith("| rule")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert list(rules)[:3] == ["listed_values", "valid_options", "unquoted_name"]  # the built-in rules, in order
    assert rules["unquoted_name"] == {
        "reflect": "1 / 1 / 0",
        "reflect-guidance": "0 / 0 / 0",
        "ics": "0 / 0 / 0",
        "control-placebo": "0 / 0 / 0",
        "control-wrong-step": "1 / 1 / 1",
    }
    assert rules["last_row"]["reflect"] == "1 / 0 / 0"  # proposed and refused: fired, never tried
    assert rules["my_rule"]["reflect"] == "1 / 1 / 0"  # a rule no built-in names, after them
    assert all(v == "0 / 0 / 0" for v in rules["valid_options"].values())


def test_an_undecided_run_is_counted_apart_never_right_and_never_a_failure_given_to_the_methods() -> None:
    rows = _rows()
    undecided = {**copy.deepcopy(rows[0]), "question_id": "nt-hedged", "correct": None, "methods": {}}
    right = {**copy.deepcopy(rows[0]), "question_id": "nt-right", "correct": True, "methods": {}}
    metrics = _live_metrics([*rows, undecided, right], METHODS)
    assert (metrics["questions"], metrics["agent_correct"], metrics["agent_undecided"], metrics["failed_runs"]) == (
        5,
        1,
        1,
        3,
    )
    assert metrics["methods"]["ics"]["runs"] == 3
    header = live_metrics_markdown(metrics, "m").splitlines()[0]
    assert "5 questions, 1 answered right, 1 undecided (" in header and ": not a failed run), 3 failed runs" in header
    # the undecided run's stored attributions (if any) are not scored as a failure's
    attributed = {**copy.deepcopy(rows[1]), "question_id": "nt-hedged-attributed", "correct": None}
    assert _live_metrics([*rows, attributed], METHODS)["methods"]["ics"]["runs"] == 3
    assert "undecided" not in live_metrics_markdown(_live_metrics(rows, METHODS), "m").splitlines()[0]
