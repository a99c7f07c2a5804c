"""``reflect-otel demo`` with a scripted model standing in for the endpoint: the online path end to end."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reflect_otel.cli import main
from reflect_otel.testing import ScriptedLLM, ScriptedRequest
from tests.conftest import Instrumented


def test_demo_runs_the_questions_through_observe(
    tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str], instrumented: Instrumented
) -> None:
    def respond(request: ScriptedRequest) -> Any:
        if request.stage == "agent" and request.temperature:  # a proposal for step 1: another call
            return {"thought": "count", "action": {"tool": "count_rows", "table": "t0"}}
        if request.stage == "agent" and "Result of describe" not in request.text:  # the table agent: a look, then
            return {"thought": "look", "action": {"tool": "describe", "table": "t0"}}
        if request.stage == "agent":  # a wrong answer
            return {"thought": "guess", "action": {"tool": "final_answer", "answer": "Paris"}}
        return {
            "localize": {
                "error_step": 1,
                "confidence": 0.6,
                "reasoning": "guessed",
                "what_should_have_been_done": "look",
            },
            "classify": {
                "error_type": "hallucination",
                "confidence": 0.6,
                "explanation": "no lookup",
                "suggested_correction": "look",
            },
            "diagnose": {
                "root_cause": "guessed",
                "correction_instruction": "look it up",
                "forbidden_actions": [],
                "expected_next_tool": None,
                "confidence": 0.5,
            },
            "gate": {"is_faithful": True, "violation_reason": None, "violation_type": None},
            "explain": {"reasoning": "r", "error_type": "hallucination", "explanation": "e"},
        }[request.stage]

    monkeypatch.setattr("reflect_otel.cli.demo.make_llm", lambda config: ScriptedLLM(respond=respond))
    monkeypatch.delenv("PHOENIX_COLLECTOR_ENDPOINT", raising=False)
    # in this test process LangChain is already instrumented onto the session's provider: let the demo attach to it,
    # as it attaches to an application's global provider
    monkeypatch.setattr("reflect_otel.online.setup.otel_trace.get_tracer_provider", lambda: instrumented.provider)
    store = tmp_path / "demo.duckdb"
    assert main(["demo", "--questions", "nt-1,nt-3", "--store", str(store)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    # progress while REFLECT works, named by question (stderr, plain lines)
    assert "nt-1: round 1: step 1 localized (hallucination)" in captured.err
    # the agent's own step resampled first (its sampled call changes the step and answers wrong still), then the
    # plan, under which it proposes the same call again: refused, replayed there already
    assert "nt-3: testing resampling (resample) at step 1" in captured.err
    assert "nt-3: resampling (resample) at step 1: no_flip (no intervention flipped the outcome)" in captured.err
    assert "nt-3: guidance (llm) at step 1: not_tested (no proposal changed the step as the plan says)" in captured.err
    assert re.search(r"flagged \(wrong answers\) +2\n", out) and re.search(r"attributed +2\n", out)
    assert f"reflect-otel stats --store {store}" in out
    with duckdb.connect(str(store), read_only=True) as db:
        assert db.execute("SELECT count(*), count(*) FILTER (WHERE agent = 'table_qa') FROM traces").fetchone() == (
            2,
            2,
        )
        assert db.execute("SELECT count(*) FROM attributions WHERE error_type = 'hallucination'").fetchone() == (2,)
        questions = [q for (q,) in db.execute("SELECT question FROM traces ORDER BY question").fetchall()]
    assert questions[1].startswith("in what city did piotr")  # the run's input is the question


def test_bad_settings_are_refused_before_the_model_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rounds", "0", "--proposal-samples", "20"]) == 2
    err = capsys.readouterr().err
    assert "--rounds 0: Input should be greater than or equal to 1" in err and "--proposal-samples 20" in err
    assert "starting the model" not in err


def test_a_demo_whose_every_agent_run_failed_says_so_and_exits_nonzero(
    tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str], instrumented: Instrumented
) -> None:
    from reflect_otel.errors import LLMError

    def respond(request: ScriptedRequest) -> Any:
        raise LLMError("LLM endpoint (model m) failed after 0 retries: Request timed out. No answer within 120 s")

    monkeypatch.setattr("reflect_otel.cli.demo.make_llm", lambda config: ScriptedLLM(respond=respond))
    monkeypatch.delenv("PHOENIX_COLLECTOR_ENDPOINT", raising=False)
    monkeypatch.setattr("reflect_otel.online.setup.otel_trace.get_tracer_provider", lambda: instrumented.provider)
    assert main(["demo", "--questions", "nt-1", "--store", str(tmp_path / "demo.duckdb")]) == 1
    captured = capsys.readouterr()
    assert re.search(r"agent failures +1\n", captured.out)  # the summary still shows what happened
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("reflect-otel demo: every agent run failed; the last: ") and "No answer within 120 s" in last
