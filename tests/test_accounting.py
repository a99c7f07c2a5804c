"""Every model call made for a trace is counted once, in the record and in the token budget: the triage audit, the
method's stages and the audits of its replays; and every method builds its prompt context the same way."""

from __future__ import annotations

import contextvars
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.attribution import stages
from reflect_otel.attribution.methods import METHODS
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import ReflectConfig
from reflect_otel.flagging.proxy_verifier import PlanAnchoredVerifier
from reflect_otel.flagging.verifiers import OracleVerifier, SelfVerifier
from reflect_otel.llm.base import ChatMessage
from reflect_otel.llm.budget import TokenBudget
from reflect_otel.llm.recording import CallLog, RecordingLLM
from reflect_otel.prompts import PromptContext, ReasoningContinuation
from reflect_otel.record import AGENT_REPLAY_STAGE
from reflect_otel.replay import find_replay_adapter
from reflect_otel.testing import ScriptedLLM, ScriptedProposingAdapter, ScriptedRequest, make_trace
from reflect_otel.trace import StructuredTrace

ANCHORS = {
    "hard": {"entities": ["rivers"], "filters": [], "target_property": "length", "operation": "compare",
             "output_form": "a river name"},
    "plans": [{"subgoals": ["find lengths", "compare"]}],
}  # fmt: skip


def failed_run() -> StructuredTrace:
    steps = [
        {"tool": "search", "args": {"q": f"river {i}"}, "result": f"river {i} is long", "reasoning": f"search {i}"}
        for i in (1, 2, 3)
    ]
    return make_trace("Which river is longest?", [*steps, {"reasoning": "Danube", "is_final_answer": True}])


def auditor() -> ScriptedLLM:
    """Anchors; an audit that calls the original run's steps a drift and a replay's aligned; a localization."""

    def respond(request: ScriptedRequest) -> Any:
        if request.stage == "proxy_anchors":
            return ANCHORS
        if request.stage == "proxy_audit":
            shown = [int(line.split()[1]) for line in request.text.splitlines() if line.startswith("Macro-step ")]
            replayed = "Nile" in request.text
            category, severity = ("Aligned", "minor") if replayed else ("Output_Drift", "critical")
            return {
                "steps": [
                    {"macro_step": i, "category": category, "severity": severity, "anchor": "hard",
                     "rationale": f"step {i} checked"}
                    for i in shown
                ]
            }  # fmt: skip
        if request.stage == "localize":
            return {"error_step": 2, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": "w"}
        if request.stage == "verify":
            return {"is_correct": "Nile" in request.text, "confidence": 0.9, "reasoning": "judged"}
        raise AssertionError(request.stage)

    return ScriptedLLM(respond=respond)


def fixed_agent() -> ScriptedProposingAdapter:
    """A greedy agent: left alone it answers Danube again; its resampled step 2 (a search for the Nile) fixes it."""

    def continue_with(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        found = any(s.tool_args.get("q") == "nile" for s in trace.steps[:point])
        return [{"reasoning": "Nile" if found else "Danube", "is_final_answer": True}]

    return ScriptedProposingAdapter(
        continue_with,
        lambda trace, point, injection, sample, temperature: {"tool": "search", "args": {"q": "nile"}},
        tools={"search": lambda q: f"{q} is the longest" if q == "nile" else f"{q} is long"},
        deterministic=True,
    )


def online(llm: ScriptedLLM, budget: TokenBudget) -> AttributionService:
    """Online mode as ``configure`` sets it up: triage by the proxy verifier, then ICS (one round) on flagged runs."""
    return AttributionService(
        llm,
        METHODS["ics"],
        verifier=OracleVerifier(),
        proxy=PlanAnchoredVerifier(llm),
        config=ReflectConfig(rounds=1),
        budget=budget,
        triage=True,
    )


def test_online_the_triage_audit_and_every_replay_audit_are_in_the_record_and_the_budget() -> None:
    llm = auditor()
    budget = TokenBudget(per_trace=1_000_000, per_hour=10_000_000)
    service = online(llm, budget)
    outcome = service.process(failed_run(), replay=fixed_agent())
    record = outcome.record
    assert outcome.flagged and record is not None and record.corrected_answer == "Nile"
    asked = [r.stage for r in llm.requests]
    # the original run is audited once (triage), not again by the method; each replay once: the test's control,
    # intervention and sensitivity arm, then the localization test's control and intervention at another step
    audit = ["proxy_anchors", "proxy_audit"]
    assert [(a.arm.value, a.rollback_point) for a in record.replays] == [
        ("control", 1),
        ("intervention", 1),
        ("sensitivity", 1),
        ("control", 0),
        ("localization", 0),
    ]
    assert asked == [*audit, "localize", *audit * len(record.replays)]
    assert [c.stage for c in record.llm_calls] == asked
    assert {c.stage: c.calls for c in record.cost} == {"proxy_anchors": 6, "proxy_audit": 6, "localize": 1}
    assert record.original_verdict is not None and record.original_verdict.verifier == "plan_anchored"
    assert outcome.tokens == record.total_tokens == budget.spent_last_hour() > 0


def test_a_run_triage_clears_still_spends_its_audit_from_the_hourly_budget() -> None:
    llm = auditor()
    budget = TokenBudget(per_trace=1_000_000, per_hour=10_000_000)
    service = AttributionService(
        llm, METHODS["ics"], verifier=OracleVerifier(), proxy=PlanAnchoredVerifier(llm), budget=budget, triage=True
    )
    cleared = failed_run().model_copy(update={"final_answer": "Nile"})
    steps = [s.model_copy(update={"tool_result": "Nile " + (s.tool_result or "")}) for s in cleared.steps]
    outcome = service.process(cleared.model_copy(update={"steps": tuple(steps)}))
    assert not outcome.flagged and outcome.record is None
    assert outcome.tokens == budget.spent_last_hour() > 0 and len(llm.requests) == 2


def test_the_per_trace_budget_stops_the_audits_of_replays_too() -> None:
    llm = auditor()
    service = online(llm, TokenBudget(per_trace=1, per_hour=10_000_000))  # spent by the first call
    outcome = service.process(failed_run(), replay=fixed_agent())
    assert [r.stage for r in llm.requests] == ["proxy_anchors"]  # the triage's first call spends it all
    # the audit could not finish: uncertain, so stored and counted, not attributed
    assert outcome.record is None and outcome.verdict is not None and outcome.verdict.is_correct is None
    assert "token budget for one trace" in outcome.verdict.reasoning


def test_attribute_with_a_model_verifier_counts_its_verdicts_on_replays() -> None:
    """The ``attribute`` command's path: no triage; ``--verifier self`` judges every replay with the model."""
    llm = auditor()
    budget = TokenBudget(per_trace=1_000_000, per_hour=10_000_000)
    service = AttributionService(
        llm, METHODS["ics"], verifier=SelfVerifier(llm), config=ReflectConfig(rounds=1), budget=budget
    )
    outcome = service.process(failed_run(), expected="Nile", replay=fixed_agent())
    record = outcome.record
    assert record is not None and record.corrected_answer == "Nile"
    # the run judged (a right run is not attributed), localize, then each replay judged: the control, the
    # intervention, the sensitivity arm, and the localization test's control and intervention
    assert len(record.replays) == 5
    assert (
        [c.stage for c in record.llm_calls]
        == [r.stage for r in llm.requests]
        == ["verify", "localize", *["verify"] * 5]
    )
    assert outcome.tokens == record.total_tokens == budget.spent_last_hour()


@pytest.mark.parametrize("layout", ["shared_prefix", "per_stage"])
def test_ics_and_reflect_build_the_same_prompt_context(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, PromptContext] = {}
    method = ""

    def capture(llm: Any, ctx: PromptContext, trace: StructuredTrace, **_: Any) -> Any:
        seen[method] = ctx
        raise RuntimeError("captured")  # stop here: only the context is compared

    monkeypatch.setattr(stages, "localize", capture)
    config = ReflectConfig(
        include_expected_answer=False,  # ICS never sees the answer; REFLECT under the same setting
        evidence_in_prompts=True,
        prompt_layout=layout,  # type: ignore[arg-type]
        domain_context_label="About the table",
    )
    empty = {"tool": "filter_rows", "args": {"column": "Position", "value": "1"},
             "result": "t1: 0 rows (no row matched; values of Position include: '1st', '2nd')"}  # fmt: skip
    trace = make_trace("Who came first?", [empty, {"reasoning": "nobody", "is_final_answer": True}])
    for method in ("reflect", "ics"):
        attributor = METHODS[method].build(ScriptedLLM([]), OracleVerifier(), config)
        attributor.attribute(trace, expected="Bangkok", replay=fixed_agent(), domain_context="a table of races")
    assert seen["reflect"] == seen["ics"]
    assert "values of Position" in seen["ics"].evidence and seen["ics"].domain_context_label == "About the table"


def test_a_found_adapters_agent_on_our_model_is_counted_as_the_agents_cost() -> None:
    """A chain-of-thought replay runs the agent on the attributor's own model: those calls are in the record and the
    budget once, under ``agent_replay``, apart from the auditor's; the demo's "auditor calls" leave them out."""

    def respond(request: ScriptedRequest) -> Any:
        if request.stage == "localize":
            return {"error_step": 1, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": "w"}
        if request.stage == "agent_replay" and request.temperature:  # a proposal, sampled
            return {"steps": ["3 + 4 = 7."], "answer": "7"}
        if request.stage == "agent_replay":  # a replay, greedy: the control redoes the run, the action fixes it
            fixed = "3 + 4 = 7." in request.text
            return {"steps": ["So it is 7."] if fixed else ["3 + 4 is 8."], "answer": "7" if fixed else "8"}
        raise AssertionError(request.stage)

    llm = ScriptedLLM(respond=respond)
    budget = TokenBudget(per_trace=1_000_000, per_hour=10_000_000)
    service = AttributionService(
        llm,
        METHODS["ics"],
        verifier=OracleVerifier(),
        config=ReflectConfig(rounds=1, proposal_samples=1),
        budget=budget,
        replay_finder=find_replay_adapter,
    )
    chain = make_trace("What is 3 + 4?", [{"reasoning": "3 + 4 is 8."}, {"reasoning": "So the answer is 8"}])
    outcome = service.process(chain, expected="7")
    record = outcome.record
    assert record is not None and record.corrected_answer is not None and "7" in record.corrected_answer
    asked = [r.stage for r in llm.requests]
    # control, proposal, intervention, sensitivity; then the localization test's control, proposal, intervention
    assert asked == ["localize", *["agent_replay"] * 7]
    assert [c.stage for c in record.llm_calls] == asked  # the method's calls, then its agent's
    agent = record.agent_replay_cost
    assert agent is not None and agent.calls == 7 and agent.prompt_tokens > 0
    assert record.auditor_calls == 1 and record.total_calls == 8 and record.annotator_kind == "LLM"
    assert record.total_tokens == record.auditor_tokens + agent.prompt_tokens + agent.completion_tokens
    assert outcome.tokens == record.total_tokens == budget.spent_last_hour()


def test_the_agents_calls_are_counted_under_its_stage_whatever_it_names() -> None:
    log = CallLog()
    recorder = RecordingLLM(
        ScriptedLLM(respond=lambda _r: {"steps": ["7."], "answer": "7"}), log, stage=AGENT_REPLAY_STAGE
    )
    recorder.complete([ChatMessage(role="user", content="go on")], ReasoningContinuation, stage="localize")
    assert [c.stage for c in log.calls] == [AGENT_REPLAY_STAGE]


AAO = {"error_step": 2, "responsible_agent": None, "reason": "r", "error_type": "tool_error", "confidence": 0.6}


def test_a_repair_retry_is_a_model_request_and_the_record_and_the_store_count_it(tmp_path: Path) -> None:
    """The model's first reply is not JSON, the repair retry's is: one call of the stage, two requests, both
    counted wherever calls are (the record's cost, its total, the store's columns and ``stats`` view)."""
    import duckdb

    from reflect_otel.exporters.duckdb_store import DuckDBStore

    llm = ScriptedLLM(by_stage={"aao": ["the second step, I think", AAO]})
    path = tmp_path / "s.duckdb"
    with DuckDBStore(path) as store:
        service = AttributionService(llm, METHODS["aao"], verifier=OracleVerifier(), store=store)
        record = service.process(failed_run(), expected="Nile").record
    assert record is not None and record.step_index == 2 and len(llm.requests) == 2
    assert [(c.stage, c.attempts) for c in record.llm_calls] == [("aao", 2)]
    assert [(c.stage, c.calls, c.requests) for c in record.cost] == [("aao", 1, 2)]
    assert record.total_calls == record.auditor_calls == 2 and record.agent_calls == 0
    with duckdb.connect(str(path), read_only=True) as db:
        assert db.execute("SELECT llm_calls, agent_calls FROM attributions").fetchall() == [(2, 0)]
        assert db.execute("SELECT stage, calls, requests FROM cost_per_stage").fetchall() == [("aao", 1, 2)]


def test_a_record_written_before_requests_were_counted_reads_them_from_its_calls_attempts() -> None:
    """An earlier version's cost held stage calls only; its ``llm_calls`` hold the attempts, so reading it counts
    the requests it made."""
    from reflect_otel.record import AttributionRecord

    llm = ScriptedLLM(by_stage={"aao": ["not JSON", AAO]})
    record = METHODS["aao"].build(llm, OracleVerifier(), ReflectConfig(), None).attribute(failed_run(), expected="Nile")
    old = record.model_dump(mode="json")
    for cost in old["cost"]:
        del cost["requests"]  # as an earlier version wrote it
    assert AttributionRecord.model_validate(old).total_calls == 2 == record.total_calls
    old["llm_calls"] = []  # a record stored without its calls: each call one request
    assert AttributionRecord.model_validate(old).total_calls == 1


def test_the_stored_live_results_still_load_and_count_their_repair_retries() -> None:
    """The rows of an earlier measurement (benchmarks/results) load as records, each request counted: the repair
    retries the audit of seed 46 found (more requests than calls in most records) are counted now."""
    from reflect_otel.record import AttributionRecord

    path = Path(__file__).parents[1] / "benchmarks" / "results" / "wtq-live-controlled-seed46" / "results.jsonl"
    records = [
        AttributionRecord.model_validate(method["record"])
        for row in map(json.loads, path.read_text().splitlines())
        for method in row["methods"].values()
    ]
    assert records
    for record in records:
        assert record.total_calls == sum(c.attempts for c in record.llm_calls)
    assert sum(1 for r in records if r.total_calls > len(r.llm_calls)) > len(records) / 2


def test_an_agent_models_calls_are_recorded_only_inside_an_attribution_each_request_once() -> None:
    from reflect_otel.llm.recording import AgentCallRecorder, recording_agent_calls

    scripted = ScriptedLLM(
        by_stage={"agent": ["{", {"steps": ["7."], "answer": "7"}, {"steps": ["8."], "answer": "8"}]}
    )
    agent = AgentCallRecorder(AgentCallRecorder(scripted))  # wrapped twice: still counted once
    ask = [ChatMessage(role="user", content="go on")]
    agent.complete(ask, ReasoningContinuation, stage="agent")  # the agent's own run: not an attribution's cost
    log = CallLog()
    with recording_agent_calls(log):
        pool = ThreadPoolExecutor(1)
        context = contextvars.copy_context()  # as LangGraph hands its context to the thread running a node
        pool.submit(context.run, agent.complete, ask, ReasoningContinuation, stage="agent").result()
        pool.shutdown()
    assert [(c.stage, c.attempts) for c in log.calls] == [(AGENT_REPLAY_STAGE, 1)]
    assert len(scripted.requests) == 3  # the run's repair retry and its reply, then the replay's
