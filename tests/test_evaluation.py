"""Evaluation: metrics on hand-made predictions, the loaders on the shared data, resume without duplicates,
comparison, and a 3-trace run of reflect and aao on BIG-Bench Mistake with the local backend."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.evaluation.loaders import load_benchmark
from benchmarks.evaluation.metrics import Prediction, compute_metrics, mean_se
from benchmarks.evaluation.runner import EvalOptions, run_eval
from reflect_otel.cli import main
from reflect_otel.config import ReflectConfig
from reflect_otel.errors import InputError
from reflect_otel.testing import ScriptedLLM, ScriptedRequest


def test_metrics_on_hand_made_predictions() -> None:
    predictions = [
        Prediction("a", 3, frozenset({3}), status="verified", corrected=True, llm_calls=4, tokens=100),
        Prediction("b", 4, frozenset({2, 6}), llm_calls=2, tokens=50),  # distance 2
        Prediction("c", 5, frozenset({6})),  # off by one
        Prediction("d", None, frozenset({1})),  # no prediction: a miss
    ]
    m = compute_metrics(predictions)
    assert m["traces"] == 4
    assert m["exact_match"]["mean"] == 0.25
    # values 1,0,0,0: sample sd = 0.5, se = 0.25
    assert m["exact_match"]["se"] == pytest.approx(0.25)
    assert m["off_by_one"]["mean"] == 0.5 and m["off_by_one"]["se"] == pytest.approx(math.sqrt(1 / 3) / 2)
    assert m["mean_distance"]["mean"] == 1.0 and m["mean_distance"]["n"] == 3  # 0, 2, 1
    assert m["correction_rate"]["mean"] == 0.25 and m["verified_share"]["mean"] == 0.25
    assert m["exact_match_verified"]["mean"] == 1.0 and m["exact_match_unverified"]["mean"] == 0.0
    assert m["llm_calls_per_trace"]["mean"] == 1.5 and m["tokens_per_trace"]["mean"] == 37.5
    assert mean_se([])["n"] == 0 and mean_se([5.0]) == {"mean": 5.0, "se": 0.0, "n": 1}


def test_loaders_on_the_shared_data(shared_data: Path) -> None:
    bbm = load_benchmark("bbm", shared_data)
    assert bbm and all(item.gold_steps and item.expected for item in bbm)
    first = json.loads(
        next(
            line
            for line in (shared_data / "bbm" / "dyck_languages.jsonl").open()
            if json.loads(line)["answer"] != json.loads(line)["target"]
            and json.loads(line)["mistake_index"] is not None
        )
    )
    match = next(i for i in bbm if i.trace.question == first["input"])
    assert match.gold_steps == {first["mistake_index"] + 1}  # 0-based in the data, 1-based here
    gaia = load_benchmark("trail-gaia", shared_data)
    swe = load_benchmark("trail-swe", shared_data)
    assert gaia and swe and all(min(i.gold_steps) >= 1 for i in gaia + swe)
    assert any(i.earliest_high is not None for i in gaia) and all(i.descriptions for i in gaia)
    ww = load_benchmark("who-and-when", shared_data)
    assert len(ww) == len(list((shared_data / "who_and_when").glob("*/*.json")))
    row = json.loads((shared_data / "who_and_when" / "Hand-Crafted").glob("*.json").__next__().read_text())
    item = next(i for i in ww if i.trace.question == row["question"] and i.descriptions == (row["mistake_reason"],))
    assert item.gold_steps == {int(row["mistake_step"]) + 1}
    assert item.trace.steps[int(row["mistake_step"])].reasoning == row["history"][int(row["mistake_step"])]["content"]
    assert len(load_benchmark("bbm", shared_data, limit=3)) == 3


def test_resume_after_an_interrupted_run_writes_no_duplicates(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "eval",
        "--benchmark",
        "who-and-when",
        "--method",
        "first-step",
        "--data",
        str(shared_data),
        "--out",
        str(out),
        "--limit",
        "5",
    ]
    assert main(args) == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 5
    # simulate a crash: two finished lines and half of a third
    (out / "results.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])
    assert main(args) == 0
    again = (out / "results.jsonl").read_text().splitlines()
    assert len(again) == 5 and len({json.loads(line)["trace_id"] for line in again}) == 5
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["traces"] == 5 and metrics["llm_calls_per_trace"]["mean"] == 0
    config = json.loads((out / "run_config.json").read_text())
    assert config["method"] == "first-step" and "versions" in config and config["replay_environment"].startswith("none")
    # the resumed session is added to the first one, which keeps its start
    assert len(config["sessions"]) == 2 and config["started_at"] == config["sessions"][0]["started_at"]
    assert all(s["versions"]["python"] for s in config["sessions"])


def test_resuming_with_other_settings_is_refused_naming_the_setting(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["eval", "--benchmark", "bbm", "--method", "first-step", "--data", str(shared_data), "--out", str(out)]
    assert main([*args, "--limit", "2", "--seed", "0", "--rounds", "2"]) == 0
    rows = (out / "results.jsonl").read_text()
    with pytest.raises(InputError, match=r"reflect_config\.rounds: 2 -> 1.*new --out"):
        run_eval(
            EvalOptions(benchmark="bbm", method="first-step", data=shared_data, out=out, limit=3, seed=0,
                        config=ReflectConfig(rounds=1)),
            ScriptedLLM(respond=lambda _r: {}),
        )  # fmt: skip
    assert (out / "results.jsonl").read_text() == rows  # nothing added to the other measurement
    assert main([*args, "--limit", "3", "--seed", "0", "--rounds", "2"]) == 0  # a larger sample resumes
    assert len((out / "results.jsonl").read_text().splitlines()) == 3


def test_compare_writes_a_table_and_a_chart(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for method in ("first-step", "last-step"):
        assert (
            main(
                [
                    "eval",
                    "--benchmark",
                    "bbm",
                    "--method",
                    method,
                    "--data",
                    str(shared_data),
                    "--out",
                    str(tmp_path / method),
                    "--limit",
                    "20",
                    "--seed",
                    "7",
                ]
            )
            == 0
        )
    capsys.readouterr()
    chart = tmp_path / "chart.svg"
    assert main(["eval-compare", str(tmp_path / "first-step"), str(tmp_path / "last-step"), "--chart", str(chart)]) == 0
    table = capsys.readouterr().out
    assert "| bbm / first-step | 20 |" in table and "| bbm / last-step | 20 |" in table
    svg = chart.read_text()
    assert svg.startswith("<svg") and svg.count("<rect") >= 4 + 2 and "bbm / last-step" in svg


def test_compare_refuses_a_run_whose_files_are_not_json_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run_config.json").write_text('{"benchmark": "bbm", "method": "aao"}')
    (run / "metrics.json").write_text('{"traces": 3, "exact_')  # cut off mid-write
    assert main(["eval-compare", str(run)]) != 0
    assert "metrics.json is not valid JSON" in capsys.readouterr().err
    (run / "metrics.json").write_text("[1, 2]")
    assert main(["eval-compare", str(run)]) != 0
    assert "metrics.json is not a JSON object" in capsys.readouterr().err


@pytest.mark.local_llm
def test_aao_on_three_bbm_traces_with_the_local_backend(shared_data: Path, tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        if os.environ.get("CI"):
            pytest.fail("the local backend is not installed: pip install 'reflect-otel[local]'")
        pytest.skip("the local backend is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "REFLECT_LLM_"))}
    # the command with the real model end to end; REFLECT with it is tests/test_demo_default_model.py's attribute
    # test (on one trace: each replay costs minutes on a CPU)
    out = tmp_path / "aao"
    command = ["eval", "--benchmark", "bbm", "--method", "aao", "--data", str(shared_data), "--out", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "reflect_otel", *command, "--limit", "3", "--seed", "1"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["method"] == "aao" for r in rows)
    assert all(r["llm_calls"] >= 1 for r in rows)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["traces"] == 3 and 0 <= metrics["exact_match"]["mean"] <= 1


def test_bbm_replays_tell_the_agent_its_task_and_keep_to_the_replay_budget(shared_data: Path, tmp_path: Path) -> None:
    """A chain of thought's trace holds the question (a bracket string, for dyck_languages), not the task: the
    replayed agent must be told the task, or it answers another one. And --max-replays holds for bbm too."""
    items = load_benchmark("bbm", shared_data, limit=2)
    llm = ScriptedLLM(
        respond=lambda r: (
            {"steps": ["Again."], "answer": "no"}
            if r.stage == "agent_replay"
            else {"error_step": 1, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": "w"}
        )
    )
    options = EvalOptions(
        benchmark="bbm", method="ics", data=shared_data, out=tmp_path / "ics", limit=2, config=ReflectConfig(rounds=2),
        max_replays=3,
    )  # fmt: skip
    run_eval(options, llm)
    replays = [r for r in llm.requests if r.stage == "agent_replay" and r.temperature is None]
    proposals = [r for r in llm.requests if r.stage == "agent_replay" and r.temperature is not None]
    # per trace, two replays: the control, then the one proposed step that is not an answer ("Again.") executed in
    # place of step 1 (it did not flip, so no sensitivity arm ran); the next test would need three, and one is left.
    # The three proposals are one-step samples, not replays
    assert len(replays) == 4 and len(proposals) == 6
    assert sum("Again." in r.text for r in replays) == 2
    for request, item in zip(replays[::2], items, strict=True):
        assert item.domain_context and f"Task: {item.domain_context}" in request.text
    config = json.loads((tmp_path / "ics" / "run_config.json").read_text())
    assert config["max_replays"] == 3


def test_bbm_rows_count_the_replayed_agents_calls_apart_from_the_auditors(shared_data: Path, tmp_path: Path) -> None:
    def respond(request: ScriptedRequest) -> object:
        if request.stage == "agent_replay":
            return {"steps": ["Working it out again."], "answer": "no answer here"}
        return {"error_step": 1, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": "w"}

    options = EvalOptions(
        benchmark="bbm", method="ics", data=shared_data, out=tmp_path / "ics", limit=2, config=ReflectConfig(rounds=1)
    )
    metrics = run_eval(options, ScriptedLLM(respond=respond))
    rows = [json.loads(line) for line in (tmp_path / "ics" / "results.jsonl").read_text().splitlines()]
    assert [r["llm_calls"] for r in rows] == [1, 1]  # the localization
    # the agent's own: the control replay, three proposals of step 1, the replay of the one that is not an answer
    assert [r["agent_calls"] for r in rows] == [5, 5] and all(r["agent_tokens"] > 0 for r in rows)
    assert metrics["agent_calls_per_trace"]["mean"] == 5.0 and metrics["llm_calls_per_trace"]["mean"] == 1.0
    table = (tmp_path / "ics" / "metrics.md").read_text()
    agent_tokens = metrics["agent_tokens_per_trace"]
    row = f"| 5.0 (0.0) | {agent_tokens['mean']:.1f} ({agent_tokens['se']:.1f}) |"
    assert "| agent calls | agent tokens |" in table and table.splitlines()[2].endswith(row)
    assert table.count("mode: replay through the chain-of-thought adapter\n") == 1
    # a method that never replays says so, on a benchmark that could
    aao = EvalOptions(
        benchmark="bbm", method="aao", data=shared_data, out=tmp_path / "aao", limit=2, config=ReflectConfig(rounds=1)
    )
    run_eval(aao, ScriptedLLM(respond=respond))
    assert "\nmode: localization-only: aao does not replay\n" in (tmp_path / "aao" / "metrics.md").read_text()


def test_explanations_are_judged_only_where_the_step_matches(shared_data: Path, tmp_path: Path) -> None:
    from benchmarks.evaluation.loaders import load_benchmark
    from benchmarks.evaluation.runner import EvalOptions, run_eval
    from reflect_otel.config import ReflectConfig
    from reflect_otel.testing import ScriptedLLM

    items = load_benchmark("who-and-when", shared_data, limit=4)
    gold = {item.trace.question: min(item.gold_steps) for item in items}

    def respond(request: ScriptedRequest) -> object:
        if request.stage == "judge":
            return {"similarity": 0.8, "reasoning": "close"}
        question = next(q for q in gold if q[:200] in request.text)
        hit = list(gold).index(question) % 2 == 0  # right on items 0 and 2, one step off on 1 and 3
        return {
            "error_step": gold[question] if hit else gold[question] + 1,
            "responsible_agent": None,
            "reason": "the agent erred",
            "error_type": "goal_deviation",
            "confidence": 0.5,
        }

    options = EvalOptions(
        "who-and-when",
        "aao",
        shared_data,
        tmp_path / "judged",
        limit=4,
        judge_explanations=True,
        config=ReflectConfig(),
    )
    metrics = run_eval(options, ScriptedLLM(respond=respond))
    assert metrics["exact_match"]["mean"] == 0.5 and metrics["off_by_one"]["mean"] == 1.0
    assert metrics["explanation_similarity"] == {"mean": pytest.approx(0.8), "se": 0.0, "n": 2}  # matched only
    assert metrics["explanation_high"]["mean"] == 1.0
    assert metrics["explanation_similarity_coverage"]["mean"] == pytest.approx(0.8 * 2 / 4)


def test_ablation_flags_reach_the_run_config(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "ablation"
    assert (
        main(
            [
                "eval",
                "--benchmark",
                "bbm",
                "--method",
                "first-step",
                "--data",
                str(shared_data),
                "--out",
                str(out),
                "--limit",
                "2",
                "--no-diagnostician",
                "--gate",
                "soft",
                "--rollback-points",
                "1",
                "--rounds",
                "2",
                "--no-relocalize",
            ]
        )
        == 0
    )
    config = json.loads((out / "run_config.json").read_text())["reflect_config"]
    assert (
        config["use_diagnostician"],
        config["gate"],
        config["rollback_points"],
        config["rounds"],
        config["relocalize"],
    ) == (False, "soft", 1, 2, False)


def test_eval_over_failed_calls_is_no_measurement_and_exits_non_zero(
    shared_data: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """An endpoint that fails every call must not produce an EM of 0.0 that looks measured."""
    from reflect_otel.cli import main
    from reflect_otel.errors import LLMError
    from reflect_otel.testing import ScriptedLLM

    down = ScriptedLLM(respond=lambda request: LLMError("endpoint down"))
    monkeypatch.setattr("benchmarks.evaluation.command.llm_for", lambda spec, config: down)
    out = tmp_path / "run"
    code = main(
        ["eval", "--benchmark", "bbm", "--method", "aao", "--data", str(shared_data), "--out", str(out), "--limit", "3"]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "3 traces, 3 failed" in err and "every trace failed, so nothing was measured" in err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["failed"] == 3 and metrics["exact_match"]["n"] == 0
    row = (out / "metrics.md").read_text().splitlines()[2]
    assert row.startswith("| bbm / aao | 3 | 3 | - | - |")


def test_eval_scores_only_the_traces_that_did_not_fail(shared_data: Path, tmp_path: Path) -> None:
    from benchmarks.evaluation.runner import EvalOptions, run_eval
    from reflect_otel.errors import LLMError
    from reflect_otel.testing import ScriptedLLM

    calls = iter(range(100))

    def respond(request: Any) -> Any:  # the first trace's call fails, the others name step 1
        if next(calls) == 0:
            return LLMError("endpoint hiccup")
        return {
            "error_step": 1,
            "responsible_agent": None,
            "reason": "first",
            "error_type": "tool_error",
            "confidence": 0.5,
        }

    options = EvalOptions("bbm", "aao", shared_data, tmp_path / "run", limit=3)
    metrics = run_eval(options, ScriptedLLM(respond=respond))
    assert metrics["traces"] == 3 and metrics["failed"] == 1 and metrics["exact_match"]["n"] == 2


def test_attribute_exits_non_zero_when_every_attribution_failed(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    from reflect_otel.cli import main
    from reflect_otel.errors import LLMError
    from reflect_otel.testing import ScriptedLLM

    traces = tmp_path / "t.jsonl"
    assert main(["import", "--example", "-o", str(traces)]) == 0
    down = ScriptedLLM(respond=lambda request: LLMError("endpoint down"))
    monkeypatch.setattr("reflect_otel.cli.attribute.llm_for", lambda spec, config: down)
    code = main(["attribute", str(traces), "--method", "aao", "-o", str(tmp_path / "r.jsonl"), "--no-store"])
    assert code == 1
    err = capsys.readouterr().err
    assert "failed: stage errors, no attribution" in err and "every attribution failed" in err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--benchmark", "who-and-when", "--max-replays", "3"], "who-and-when is localization-only"),
        (["--benchmark", "bbm", "--replay-temperature", "0.2"], "--replay-temperature was removed"),
        (["--benchmark", "bbm", "--deterministic-agent"], "--deterministic-agent is about the agent of wtq-live"),
        (["--benchmark", "bbm", "--runs", "3"], "--runs counts the agent runs of wtq-live"),
    ],
)
def test_eval_refuses_an_option_its_benchmark_would_ignore(
    options: list[str], message: str, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["eval", *options, "--method", "aao", "--data", str(shared_data), "--out", str(tmp_path / "run")]
    assert main(args) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("method", "message"),
    [
        ("first-step", "the position floors replay nothing); to record the agent's runs alone, give no method"),
        (",", "--method names no method; give none to record the agent's runs only"),
    ],
)
def test_wtq_live_refuses_a_method_it_cannot_compare_before_any_model_starts(
    method: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_model(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("no model may start for a refused command")

    monkeypatch.setattr("benchmarks.evaluation.command.make_llm", no_model)
    args = [
        "eval",
        "--benchmark",
        "wtq-live",
        "--method",
        method,
        "--data",
        str(tmp_path),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(args) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_bbm_table_sets_verified_em_against_unverified_em_with_counts(shared_data: Path, tmp_path: Path) -> None:
    """Issue 41 asks BIG-Bench-Mistake for the EM of verified records against the EM of the others under the
    controlled rule: metrics.md says both with their counts, and the commit that made the rows."""
    items = load_benchmark("bbm", shared_data, limit=3)
    fixable = {items[0].trace.question: items[0], items[1].trace.question: items[1]}

    def respond(request: ScriptedRequest) -> object:
        if request.stage == "agent_replay":
            item = next((i for q, i in fixable.items() if q in request.text), None)
            # the corrected step (the proposal "Again." executed at step p) fixes the first two; no control does
            if item is not None and request.temperature is None and "Again." in request.text:
                return {"steps": ["Done."], "answer": item.expected}
            return {"steps": ["Again."], "answer": "no answer here"}
        # the first trace localized at its gold step, the others at a step after every gold one
        item = next(i for i in items if i.trace.question in request.text)
        step = min(item.gold_steps) if item is items[0] else min(max(item.gold_steps) + 1, len(item.trace.steps))
        return {"error_step": step, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": "w"}

    options = EvalOptions(
        benchmark="bbm", method="ics", data=shared_data, out=tmp_path / "ics", limit=3, config=ReflectConfig(rounds=1)
    )
    metrics = run_eval(options, ScriptedLLM(respond=respond))
    rows = [json.loads(line) for line in (tmp_path / "ics" / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows][:2] == ["verified", "verified"] and rows[2]["status"] != "verified"
    assert metrics["exact_match_by_status"]["verified"] == {"hits": 1, "n": 2}
    table = (tmp_path / "ics" / "metrics.md").read_text()
    assert f"verified 1 of 2 (50.0%), unverified 0 of 1 (0.0%) ({rows[2]['status'].replace('_', ' ')} 0 of 1)" in table
    commit = json.loads((tmp_path / "ics" / "run_config.json").read_text())["code"]["commit"]
    assert f"\nCode: commit {commit}" in table
    # and the results tables of a folder of bbm runs, per method
    from benchmarks.results_tables import bbm_tables

    tables, common = bbm_tables(tmp_path)
    assert (
        common == 3
        and "\n- ics: EM under the controlled rule (scored records naming a gold step): verified 1 of 2" in tables
    )


def test_the_bbm_tables_say_each_rounds_localization_beside_the_step_an_unverified_record_names() -> None:
    from benchmarks.results_tables import localization_by_round

    def row(status: str, gold: int, named: int, *rounds: int) -> dict[str, Any]:
        localizations = [{"step_index": step, "confidence": 0.5} for step in rounds]
        return {"status": status, "gold": [gold], "predicted": named, "record": {"localizations": localizations}}

    rows = [
        row("verified", 2, 2, 2, 3),  # proved: not a fallback
        row("unverified", 4, 5, 4, 5),  # round 1 was right, the record names round 2's
        row("unverified", 3, 3, 1, 3),
        row("unverified", 6, 6, 6),  # one round: nothing to compare
    ]
    assert localization_by_round(rows) == (
        "records not verified (unverified or not attributable) with two or more rounds (2): the step named matches gold in 1, round 1's localization "
        "in 1, the last round's in 1"
    )
    assert localization_by_round(rows[3:]) == ""


def test_a_dataset_sample_leaves_the_excluded_traces_out_and_a_resume_keeps_the_list(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(out: Path, *extra: str) -> int:
        args = ["eval", "--benchmark", "bbm", "--method", "first-step", "--data", str(shared_data)]
        return main([*args, "--out", str(out), "--limit", "3", "--seed", "5", *extra])

    def traces(out: Path) -> list[str]:
        return [json.loads(line)["trace_id"] for line in (out / "results.jsonl").read_text().splitlines()]

    assert run(tmp_path / "first") == 0
    read = traces(tmp_path / "first")
    assert run(tmp_path / "fresh", "--exclude", ",".join(read)) == 0
    fresh = traces(tmp_path / "fresh")
    assert len(fresh) == 3 and not set(fresh) & set(read)  # another sample of the same size
    assert json.loads((tmp_path / "fresh" / "run_config.json").read_text())["exclude"] == read
    capsys.readouterr()
    assert run(tmp_path / "fresh", "--exclude", read[0]) != 0  # a resume under another list is another sample
    assert "exclude" in capsys.readouterr().err
