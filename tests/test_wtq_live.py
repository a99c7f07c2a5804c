"""``eval --benchmark wtq-live``: the real LangGraph table agent (real instrumentation, real tools) driven by a
scripted model; its wrong run is attributed by each method from the same run, REFLECT's correction flips it by a
LangGraph replay while the control replay from the same prefix does not, the table says so, and a re-run resumes
without running anything again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.config import ReflectConfig
from reflect_otel.demo.wtq import load_questions
from reflect_otel.errors import InputError
from reflect_otel.replay import ReplayRequest
from reflect_otel.testing import ScriptedLLM, ScriptedRequest
from reflect_otel.testing.examples import scripted_auditor
from tests.conftest import Instrumented

WRONG = "Debrecen, Hungary"  # the earliest 1st place; nt-1 asks for the last one


def _wtq_folder(tmp_path: Path) -> Path:
    """Two questions on one table, laid out as WikiTableQuestions ships them (``csv/...csv`` with a ``.tsv`` twin):
    nt-1 (the scripted agent gets it wrong) and a twin whose expected answer is what the agent says."""
    nt1 = next(q for q in load_questions() if q.id == "nt-1")
    folder = tmp_path / "data" / "wtq"
    (folder / "csv" / "204-csv").mkdir(parents=True)
    shutil.copy(nt1.table, folder / "csv" / "204-csv" / "622.tsv")
    (folder / "questions.tsv").write_text(
        "id\tutterance\tcontext\ttargetValue\n"
        f"nt-1\t{nt1.question}\tcsv/204-csv/622.csv\t{nt1.expected}\n"
        f"nt-1-first\tin what city did piotr's first 1st place finish occur?\tcsv/204-csv/622.csv\t{WRONG}\n",
        encoding="utf-8",
    )
    return tmp_path / "data"


def _agent(
    request: ScriptedRequest, *, sampled_descending: bool = False, sampled_filter: bool = False
) -> dict[str, Any]:
    """Filters 1st places, sorts by year (descending only when a system message says "sort descending", or, with
    ``sampled_descending``, when the decision is sampled: the order a sampling agent may pick), reads the venue and
    answers it. With ``sampled_filter``, a sampled first decision filters out 2nd places instead (other rows, the
    same wrong answer)."""
    results = [m.content for m in request.messages if m.content.startswith("Result of ")]
    sampled = sampled_descending and bool(request.temperature)
    corrected = sampled or any("sort descending" in m.content for m in request.messages if m.role == "system")
    if not results and sampled_filter and request.temperature:
        return {
            "thought": "not 2nd places",
            "action": {"tool": "filter_rows", "table": "t0", "column": "Position", "op": "!=", "value": "2nd"},
        }
    if not results:
        return {
            "thought": "first 1st places",
            "action": {"tool": "filter_rows", "table": "t0", "column": "Position", "op": "=", "value": "1st"},
        }
    last = results[-1].split("\n", 1)
    if last[0].startswith("Result of filter_rows"):
        table = last[1].split(":")[0]
        sort = {"tool": "sort_rows", "table": table, "column": "Year", "descending": corrected, "limit": 1}
        return {"thought": "by year", "action": sort}
    if last[0].startswith("Result of sort_rows"):
        table = last[1].split(":")[0]
        return {"thought": "read", "action": {"tool": "lookup", "table": table, "column": "Venue", "row": 1}}
    return {"thought": "done", "action": {"tool": "final_answer", "answer": last[1]}}


def _model(*, sampled_descending: bool = False, sampled_filter: bool = False) -> ScriptedLLM:
    auditor = scripted_auditor(
        localize=(2,),
        plan={
            "root_cause": "it sorted ascending, so it read the first 1st place",
            "correction_instruction": "sort descending by Year to get the last one",
            "forbidden_actions": [],
            "expected_next_tool": "sort_rows",
            "confidence": 0.9,
        },
    )
    assert auditor._respond is not None

    def respond(request: ScriptedRequest) -> Any:
        if request.stage == "agent":
            return _agent(request, sampled_descending=sampled_descending, sampled_filter=sampled_filter)
        return auditor._respond(request)  # type: ignore[misc]

    return ScriptedLLM(respond=respond)


def test_wtq_live_attributes_the_same_failed_run_with_each_method_and_resumes(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    from benchmarks.evaluation.live import AgentRun, LiveOptions, run_live_eval
    from reflect_otel.cli.evaluate import table_agent_runs
    from reflect_otel.demo.wtq import WTQQuestion

    llm = _model()
    out = tmp_path / "out"
    options = LiveOptions(
        ("reflect", "ics"),
        _wtq_folder(tmp_path),
        out,
        config=ReflectConfig(rounds=1, rollback_points=2),
    )
    runs = table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True)
    in_runs = 0  # the model requests of the agent's own runs

    def run(question: WTQQuestion) -> AgentRun:
        nonlocal in_runs
        before = len(llm.requests)
        try:
            return runs(question)
        finally:
            in_runs += len(llm.requests) - before

    said: list[str] = []
    metrics = run_live_eval(options, llm, run, progress=said.append)

    assert (metrics["questions"], metrics["agent_correct"], metrics["failed_runs"]) == (2, 1, 1)
    reflect, ics = metrics["methods"]["reflect"], metrics["methods"]["ics"]
    assert (reflect["runs"], reflect["failed"], reflect["flipped"]["mean"], reflect["verified"]["mean"]) == (
        1,
        0,
        1,
        1,
    )
    # this agent decides the same sampled or not: its resampled step repeats the run's, and is never replayed
    assert (ics["runs"], ics["flipped"]["mean"], ics["verified"]["mean"]) == (1, 0, 0)
    assert reflect["fidelity"] == {"reproduced": 1, "controls": 1}
    rows = {r["question_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    failed = rows["nt-1"]
    assert failed["answer"] == WRONG and not failed["correct"] and failed["trace"]["question"]
    assert failed["method_order"] == ["reflect", "ics"]  # no seed: the questions and methods in the order given
    assert failed["methods"]["reflect"]["corrected_answer"] == "Bangkok, Thailand"
    assert failed["methods"]["reflect"]["step"] == 2  # the sort, redone as the correction says
    assert failed["methods"]["reflect"]["effect"] == {"step": 2, "intervention": [1, 1], "control": [0, 1],
                                                      "p_value": None}  # fmt: skip
    record = failed["methods"]["reflect"]["record"]
    control = next(a for a in record["replays"] if a["arm"] == "control")
    assert control["final_answer"] == WRONG and control["reproduced"]  # the greedy agent redid its run
    assert rows["nt-1-first"]["correct"] and rows["nt-1-first"]["methods"] == {}
    table = (out / "metrics.md").read_text()
    assert (
        "| reflect | 1 | 1 | 0 | 1 | 100.0% ± 0.0 | 100.0% ± 0.0 |" in table
        and "| ics | 1 | 1 | 0 | 0 | 0.0% ± 0.0 |" in table
    )
    assert any("reflect: verified at step 2, flipped" in line for line in said)
    _every_request_counted_once(llm, in_runs, failed["methods"])

    calls = len(llm.requests)
    again = run_live_eval(options, llm, table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True))
    assert len(llm.requests) == calls and again == metrics  # resumed: nothing ran twice


PINNED_ORDER_47_NT_1 = ["control-placebo", "control-wrong-step", "reflect", "reflect-guidance", "ics"]


def test_each_failure_runs_its_methods_in_an_order_drawn_from_the_seed_and_its_id() -> None:
    from benchmarks.evaluation.live import method_order

    methods = ("reflect", "reflect-guidance", "ics", "control-placebo", "control-wrong-step")
    orders = {q: method_order(methods, 47, q) for q in (f"nt-{i}" for i in range(40))}
    assert all(sorted(order) == sorted(methods) for order in orders.values())
    assert orders == {q: method_order(methods, 47, q) for q in orders}  # a resume runs them in the same order
    assert {order[0] for order in orders.values()} == set(methods)  # no method is always first
    assert method_order(tuple(reversed(methods)), 47, "nt-1") == orders["nt-1"]  # however --method listed them
    # pinned: the same draw in every process and Python run (random.Random seeded by a string hashes it with sha512)
    assert orders["nt-1"] == PINNED_ORDER_47_NT_1
    assert method_order(methods, None, "nt-1") == list(methods)  # no seed: the order given


def test_a_method_added_later_gets_the_stored_failures_replayed_from_their_traces_within_the_replay_budget(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    from benchmarks.evaluation.live import LiveOptions, run_live_eval
    from reflect_otel.cli.evaluate import table_agent_rebuilt, table_agent_runs

    llm = _model()
    out, data = tmp_path / "out", _wtq_folder(tmp_path)
    config = ReflectConfig(rounds=1, rollback_points=2)
    first = LiveOptions(("ics",), data, out, config=config, max_replays=3)
    run_live_eval(first, llm, table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True))
    agent_calls = sum(1 for r in llm.requests if r.stage == "agent")

    later = LiveOptions(("ics", "reflect-guidance"), data, out, config=config, max_replays=3)
    said: list[str] = []
    metrics = run_live_eval(
        later,
        llm,
        table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True),
        rebuild=table_agent_rebuilt(llm, instrumented.provider, max_steps=6, deterministic=True),
        progress=said.append,
    )
    assert "nt-1: stored failure; adding reflect-guidance" in said
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    # the run, then the run with ics, then the other question; the row updated with the added method appended
    assert [(r["question_id"], sorted(r["methods"])) for r in rows] == [
        ("nt-1", []),
        ("nt-1", ["ics"]),
        ("nt-1-first", []),
        ("nt-1", ["ics", "reflect-guidance"]),
    ]
    added = rows[-1]["methods"]["reflect-guidance"]
    # the same failure, replayed in a new process-state from its spans: the guidance flips it, the control and the
    # sensitivity arm do not
    assert added["corrected_answer"] == "Bangkok, Thailand" and added["replays"] == 3
    assert added["control_replays"] == 1 and added["status"] == "verified"
    assert rows[-1]["methods"]["ics"] == rows[1]["methods"]["ics"]  # what was measured stays as measured
    assert metrics["methods"]["reflect-guidance"]["verified_steps"] == [{"question_id": "nt-1", "step": 2}]
    # its resample repeated the step, so nothing was tested there, nor its control run (it would compare nothing)
    assert metrics["methods"]["ics"]["replays"]["mean"] == 0
    # no agent run again: the stored failure was replayed (the agent model asked only for its continuation)
    assert not [line for line in said if "answered" in line]
    assert sum(1 for r in llm.requests if r.stage == "agent") > agent_calls
    assert json.loads((out / "run_config.json").read_text())["max_replays"] == 3
    assert added["record"]["config"]["max_replays"] == 3  # the record says the cap it ran under


def test_a_stop_during_a_method_keeps_the_methods_finished_before_it(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    from benchmarks.evaluation.live import LiveOptions, run_live_eval
    from reflect_otel.cli.evaluate import table_agent_rebuilt, table_agent_runs

    llm = _model()
    options = LiveOptions(("ics", "reflect"), _wtq_folder(tmp_path), tmp_path / "out", config=ReflectConfig(rounds=1))

    def stop_after_ics(line: str) -> None:
        if line == "nt-1: reflect: attributing":
            raise KeyboardInterrupt  # as a kill would, once ics is measured and reflect has started

    with pytest.raises(KeyboardInterrupt):
        run_live_eval(
            options,
            llm,
            table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True),
            progress=stop_after_ics,
        )
    kept = [json.loads(line) for line in (options.out / "results.jsonl").read_text().splitlines()]
    assert sorted(kept[-1]["methods"]) == ["ics"] and kept[-1]["question_id"] == "nt-1"
    assert kept[-1]["method_order"] == ["ics"]  # what ran, not what was planned

    said: list[str] = []
    metrics = run_live_eval(
        options,
        llm,
        table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True),
        rebuild=table_agent_rebuilt(llm, instrumented.provider, max_steps=6, deterministic=True),
        progress=said.append,
    )
    assert "nt-1: stored failure; adding reflect" in said  # ics is not run again
    rows = [json.loads(line) for line in (options.out / "results.jsonl").read_text().splitlines()]
    resumed = [r for r in rows if r["question_id"] == "nt-1"][-1]
    assert resumed["method_order"] == ["ics", "reflect"]  # the resume appended the method it ran
    assert metrics["methods"]["ics"]["runs"] == metrics["methods"]["reflect"]["runs"] == 1


def test_proposals_are_sampled_so_a_bare_resample_can_differ_from_the_run_and_is_tested_under_control(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    from benchmarks.evaluation.live import LiveOptions, run_live_eval
    from reflect_otel.cli.evaluate import table_agent_runs

    llm = _model(sampled_descending=True)  # greedy: sorts ascending; a sampled decision sorts descending
    out, data = tmp_path / "out", _wtq_folder(tmp_path)
    options = LiveOptions(("ics",), data, out, config=ReflectConfig(rounds=1, rollback_points=1, proposal_samples=1))
    metrics = run_live_eval(options, llm, table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True))

    row = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()][1]
    assert row["question_id"] == "nt-1" and row["answer"] == WRONG  # the run itself stayed greedy
    ics = row["methods"]["ics"]
    assert ics["corrected_answer"] == "Bangkok, Thailand" and ics["status"] == "verified"
    assert ics["replays"] == 3 and ics["control_replays"] == 1 and ics["proposals"] == 1
    assert ics["sensitivity_replays"] == 1 and ics["claim"] == "decisive"
    assert ics["verified_by"] == {"source": "proposal:resample", "kind": "action"}
    # the sampled decision was asked at the configured temperature; every replay decided greedily
    sampled = [r.temperature for r in llm.requests if r.stage == "agent" and r.temperature is not None]
    assert sampled == [1.0, 1.0]  # the resample at the step proved, then at the localization test's step
    assert metrics["methods"]["ics"]["verified"]["mean"] == 1


def test_a_resample_localized_elsewhere_records_the_call_it_executed_there(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    """Seed 7811's nt-1194: the localization test of a resampled proof recorded the empty frame of its proposals (no
    replacement, no replays) instead of the resampled call it executed at the other step."""
    from benchmarks.evaluation.live import LiveOptions, run_live_eval
    from reflect_otel.cli.evaluate import table_agent_runs

    llm = _model(sampled_descending=True, sampled_filter=True)
    out, data = tmp_path / "out", _wtq_folder(tmp_path)
    options = LiveOptions(("ics",), data, out, config=ReflectConfig(rounds=1, rollback_points=1, proposal_samples=1))
    run_live_eval(options, llm, table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True))

    row = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()][1]
    ics = row["methods"]["ics"]
    assert ics["status"] == "verified" and ics["claim"] == "localized"
    test = ics["record"]["localization_test"]
    assert (test["outcome"], test["step_index"], test["source"]) == ("localized", 1, "resample")
    executed = test["correction"]
    assert executed["replacement"]["arguments"]["op"] == "!=" and executed["replays"] >= 1, executed
    assert executed["kind"] == "action"


def test_a_run_resumed_with_other_settings_or_made_before_controlled_verification_is_refused(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    from benchmarks.evaluation.live import LiveOptions, run_live_eval
    from reflect_otel.cli.evaluate import table_agent_runs

    llm = _model()
    out, data = tmp_path / "out", _wtq_folder(tmp_path)
    made = LiveOptions(("ics",), data, out, config=ReflectConfig(rounds=1))
    run_live_eval(made, llm, table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True))
    other = LiveOptions(("ics",), data, out, config=ReflectConfig(rounds=1, proposal_temperature=0.2))
    with pytest.raises(InputError, match=r"proposal_temperature: 1\.0 -> 0\.2.*a new --out folder"):
        run_live_eval(other, llm, table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True))
    config_file = out / "run_config.json"
    older = json.loads(config_file.read_text())
    del older["verification"]  # as the runs written before controlled verification
    config_file.write_text(json.dumps(older))
    with pytest.raises(InputError, match=r"verification: 'uncontrolled' -> 'controlled, change of effect"):
        run_live_eval(made, llm, table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True))
    assert json.loads(config_file.read_text())["code"]["commit"]  # the code's commit is recorded


def test_runs_recorded_without_a_method_count_each_run_right_or_wrong_and_grow_on_resume(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    """No method: the agent's runs alone, labelled (benchmarks.flagging's input); ``max_runs`` counts every run, so
    a right run stops it as a wrong one does, and a resume with more runs adds only the new ones."""
    from benchmarks.evaluation.live import LiveOptions, run_live_eval
    from reflect_otel.cli.evaluate import table_agent_runs

    llm = _model()
    out, data = tmp_path / "out", _wtq_folder(tmp_path)
    metrics = run_live_eval(
        LiveOptions((), data, out, max_runs=1),
        llm,
        table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True),
    )
    assert (metrics["questions"], metrics["failed_runs"], metrics["methods"]) == (1, 1, {})
    assert {r.stage for r in llm.requests} == {"agent"}  # the failure was not attributed: no auditor call
    assert "the agent's runs recorded only" in (out / "metrics.md").read_text()
    grown = run_live_eval(
        LiveOptions((), data, out, max_runs=5),
        llm,
        table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True),
    )
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["question_id"], r["correct"], r["methods"]) for r in rows] == [
        ("nt-1", False, {}),
        ("nt-1-first", True, {}),  # the right run recorded too, its trace kept
    ]
    assert rows[1]["trace"]["final_answer"] and grown["agent_correct"] == 1
    config = json.loads((out / "run_config.json").read_text())
    assert (config["methods"], config["limit_runs"], config["max_steps"]) == ([], 5, 6)
    assert len(config["sessions"]) == 2 and config["code"]["commit"]
    # the table says the code that made its rows (a measurement's commit is frozen before its seed is drawn)
    assert f"\nCode: commit {config['code']['commit']} (all 2 sessions)" in (out / "metrics.md").read_text()


def test_the_results_table_of_a_run_names_each_commit_its_sessions_ran(tmp_path: Path) -> None:
    """A run resumed on other code, or on uncommitted changes, says so under its table: the rows are not one
    commit's."""
    from benchmarks.results_tables import wtq_table

    config = {"methods": ["reflect"], "model": "m", "code": {"commit": "aaa", "uncommitted_code_changes": False}}
    sessions = [
        {"code": {"commit": "aaa", "uncommitted_code_changes": False}},
        {"code": {"commit": "bbb", "uncommitted_code_changes": True}},
        {"code": {"commit": "aaa", "uncommitted_code_changes": False}},
    ]
    (tmp_path / "run_config.json").write_text(json.dumps(config | {"sessions": sessions}))
    (tmp_path / "results.jsonl").write_text(json.dumps({"question_id": "nt-1", "correct": True, "methods": {}}) + "\n")
    assert "Code: commit aaa (session 1, 3); commit bbb (session 2); uncommitted code changes in session 2." in (
        wtq_table(tmp_path)
    )
    (tmp_path / "run_config.json").write_text(json.dumps(config | {"sessions": sessions[:1]}))
    assert "Code: commit aaa.\n" in wtq_table(tmp_path)


def test_reflect_proxy_on_stored_failures_is_judged_by_the_oracle_it_never_saw(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    """reflect-proxy, added to recorded runs, flags each failure by the agent's own resamples and verifies the
    replay that gives their consensus; only then is the expected answer read: on nt-1 the consensus is the expected
    answer (confirmed), on a twin question expecting another city it is not (a verified record the oracle refuses).
    ``limit`` gives the added method the first failures only."""
    from benchmarks.evaluation.live import LiveOptions, run_live_eval
    from reflect_otel.cli.evaluate import table_agent_rebuilt, table_agent_runs

    data = _wtq_folder(tmp_path)
    questions = data / "wtq" / "questions.tsv"
    nt1 = questions.read_text().splitlines()[1].split("\t")
    questions.write_text(questions.read_text() + "\t".join(["nt-1-elsewhere", nt1[1], nt1[2], "Moscow, Russia"]) + "\n")
    llm = _model(sampled_descending=True)  # greedy: the first 1st place; sampled: the last, the right one for nt-1
    out, config = tmp_path / "out", ReflectConfig(rounds=1, rollback_points=1, proposal_samples=1)
    run_agent = table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True)
    # the budget: the run's three resamples (its consistency check), then one test's three arms
    run_live_eval(LiveOptions((), data, out, config=config, max_replays=6), llm, run_agent)

    def proxy(limit: int) -> dict[str, Any]:
        return run_live_eval(
            LiveOptions(("reflect-proxy",), data, out, limit=limit, config=config, max_replays=6),
            llm,
            run_agent,
            rebuild=table_agent_rebuilt(llm, instrumented.provider, max_steps=6, deterministic=True),
        )

    first = proxy(1)["methods"]["reflect-proxy"]
    assert (first["runs"], first["oracle"]) == (1, {"confirmed": 1, "judged": 1})
    metrics = proxy(2)
    method = metrics["methods"]["reflect-proxy"]
    assert (method["runs"], method["verified"]["mean"], method["oracle"]) == (2, 1, {"confirmed": 1, "judged": 2})
    rows = {r["question_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    elsewhere = rows["nt-1-elsewhere"]["methods"]["reflect-proxy"]
    assert elsewhere["corrected_answer"] == "Bangkok, Thailand" and elsewhere["oracle_confirms"] is False
    assert elsewhere["record"]["original_verdict"]["basis"] == "consistency_disagree"  # flagged without the answer
    assert "Moscow" not in json.dumps([r.text for r in llm.requests])  # never shown to the model
    table = (out / "metrics.md").read_text()
    assert "- reflect-proxy oracle_confirmed=1 verified=2 share=0.50 (95% [0.09, 0.91]); given 2 failures" in table


def test_the_replay_budget_refuses_past_its_count() -> None:
    from reflect_otel.errors import ReplayError
    from reflect_otel.replay import BudgetedReplay
    from reflect_otel.testing import ScriptedReplayAdapter, make_trace

    inner = ScriptedReplayAdapter(lambda trace, point, injection: [{"reasoning": "x", "is_final_answer": True}])
    budget = BudgetedReplay(inner, 2)
    trace = make_trace("q", [{"reasoning": "a"}, {"reasoning": "b", "is_final_answer": True}])
    for _ in range(2):
        budget.replay(ReplayRequest.intervention(trace, 1, "fix"))
    with pytest.raises(ReplayError, match="replay budget of this failure \\(2\\) is spent"):
        budget.replay(ReplayRequest.intervention(trace, 1, "fix"))
    assert len(inner.calls) == 2


def test_wtq_live_refuses_unknown_methods_and_a_missing_folder(tmp_path: Path) -> None:
    from benchmarks.evaluation.live import LiveOptions, run_live_eval

    def never(_question: Any) -> Any:
        raise AssertionError("no agent run expected")

    with pytest.raises(InputError, match="unknown method"):
        run_live_eval(LiveOptions(("nope",), tmp_path, tmp_path / "o"), ScriptedLLM(), never)
    with pytest.raises(InputError, match=r"questions\.tsv"):
        run_live_eval(LiveOptions(("reflect",), tmp_path, tmp_path / "o"), ScriptedLLM(), never)


def test_wtq_live_stops_after_three_agent_failures_in_a_row(tmp_path: Path) -> None:
    from benchmarks.evaluation.live import LiveOptions, run_live_eval

    data = tmp_path / "data"
    shutil.copytree(Path(load_questions()[0].table).parent.parent, data / "wtq")  # the shipped sample's layout
    attempts: list[str] = []

    def broken(question: Any) -> Any:
        attempts.append(question.id)
        raise ConnectionError("endpoint down")

    with pytest.raises(InputError, match="3 agent runs in a row failed"):
        run_live_eval(LiveOptions(("reflect",), data, tmp_path / "o"), ScriptedLLM(), broken)
    assert len(attempts) == 3 and not (tmp_path / "o" / "results.jsonl").read_text()  # nothing recorded


def test_the_langgraph_agent_resamples_its_run_with_every_decision_sampled(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    from reflect_otel.cli.evaluate import table_agent_runs
    from reflect_otel.demo.wtq import load_questions

    llm = _model(sampled_descending=True)
    question = next(q for q in load_questions(data=_wtq_folder(tmp_path) / "wtq") if q.id == "nt-1")
    run = table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True)(question)
    assert run.answer == WRONG
    before = len(llm.requests)
    runs = run.replay.resample(ReplayRequest.resampling(run.trace, 0.5), samples=2)  # type: ignore[attr-defined]
    assert [r.final_answer for r in runs] == ["Bangkok, Thailand"] * 2  # sampled, it sorts descending
    asked = [r.temperature for r in llm.requests[before:] if r.stage == "agent"]
    assert asked and set(asked) == {0.5}  # every decision of the resampled runs, none greedy


def test_the_table_agents_runs_and_resamples_say_what_their_model_calls_cost(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    """Its LLM spans carry the tokens of the calls each decision made (the OpenInference LangChain instrumentation
    reads them from the message's usage), so a run's trace says what it cost, and a consistency check counts each
    resample's own tokens (the hourly budget spends them); without them every resample of this agent cost 0."""
    from reflect_otel.cli.evaluate import table_agent_runs
    from reflect_otel.demo.wtq import load_questions
    from reflect_otel.flagging.consistency import check_consistency

    def prompt_tokens(requests: list[ScriptedRequest]) -> int:  # ScriptedLLM's usage: a token per four characters
        return sum(sum(len(m.content) for m in r.messages) // 4 for r in requests if r.stage == "agent")

    llm = _model(sampled_descending=True)
    question = next(q for q in load_questions(data=_wtq_folder(tmp_path) / "wtq") if q.id == "nt-1")
    run = table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True)(question)
    steps = run.trace.steps
    assert sum(s.prompt_tokens or 0 for s in steps) == prompt_tokens(llm.requests) > 0
    assert all(s.completion_tokens for s in steps if s.prompt_tokens)
    before = len(llm.requests)
    check = check_consistency(run.trace, run.replay, samples=2, temperature=0.5)  # type: ignore[arg-type]
    assert check.finished == 2 and all(r.agent_tokens for r in check.runs)
    resampled = [r for r in llm.requests[before:] if r.stage == "agent"]
    completion = sum(r.agent_tokens for r in check.runs) - prompt_tokens(resampled)
    assert 0 < completion < prompt_tokens(resampled)  # each resample's prompt tokens counted once, its replies too


def test_only_the_table_agents_wiring_gives_its_adapter_the_table_rule(instrumented: Instrumented) -> None:
    """The table rule runs for the table agent's runs because its wiring (the demo's and wtq-live's, for a run and
    for a stored one) gives it to the agent's adapter; nothing installs it for anyone else's traces."""
    from reflect_otel.cli.demo import _agent
    from reflect_otel.cli.evaluate import table_agent_rebuilt, table_agent_runs
    from reflect_otel.demo import table_rules
    from reflect_otel.replay import agent_rules

    llm = _model()
    nt1 = next(q for q in load_questions() if q.id == "nt-1")
    run = table_agent_runs(llm, instrumented.provider, max_steps=6, deterministic=True)(nt1)
    assert agent_rules(run.replay) == table_rules.RULES
    rebuilt = table_agent_rebuilt(llm, instrumented.provider, max_steps=6, deterministic=True)(nt1, run.trace)
    assert agent_rules(rebuilt.replay) == table_rules.RULES
    _, demo_adapter, _, name = _agent("table", nt1, llm, instrumented.provider, 6, deterministic=True)
    assert name == "table_qa" and agent_rules(demo_adapter) == table_rules.RULES


def _every_request_counted_once(llm: ScriptedLLM, in_runs: int, methods: dict[str, Any]) -> None:
    """Here the agent runs on the auditor's model: each request made for an attribution is counted in its record
    once, the agent's (its replays and its proposals) under ``agent_replay``, apart from the auditor's (the row's
    ``llm_calls``); the ``in_runs`` requests of the agent's own runs are in no record."""
    from reflect_otel.record import AGENT_REPLAY_STAGE, AttributionRecord

    records = {name: AttributionRecord.model_validate(m["record"]) for name, m in methods.items()}
    assert sorted(records) == ["ics", "reflect"] and in_runs > 0
    agent = sum(1 for r in llm.requests if r.stage == "agent") - in_runs
    auditor = sum(1 for r in llm.requests if r.stage != "agent")
    assert sum(r.agent_calls for r in records.values()) == agent
    assert sum(r.auditor_calls for r in records.values()) == auditor
    assert sum(r.total_calls for r in records.values()) == len(llm.requests) - in_runs
    for name, record in records.items():
        assert record.agent_calls >= len(record.replays)  # a replay asks the agent's model at least once
        assert record.agent_calls == sum(c.attempts for c in record.llm_calls if c.stage == AGENT_REPLAY_STAGE)
        assert methods[name]["llm_calls"] == record.auditor_calls == record.total_calls - record.agent_calls
    assert records["reflect"].replays  # (ics's resample repeated the step: it replayed nothing, its control neither)
