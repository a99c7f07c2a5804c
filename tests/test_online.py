"""Online mode: the decorator on a LangGraph agent and an OpenAI-loop agent, verification, attribution and the
store; the agent's results and exceptions untouched; a saturated worker drops and counts; budgets."""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

import reflect_otel
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.errors import LLMError
from reflect_otel.online import Runtime
from reflect_otel.record import AttributionStatus
from reflect_otel.testing import ScriptedLLM, ScriptedRequest
from tests import replay_agents
from tests.conftest import Instrumented


@pytest.fixture
def online(instrumented: Instrumented, tmp_path: Path) -> Iterator[Runtime]:
    rt = reflect_otel.configure(
        store=str(tmp_path / "online.duckdb"),
        llm=replay_agents.scripted_auditor(),
        tracer_provider=instrumented.provider,
        reflect_config=ReflectConfig(gate=GateMode.HARD),
        proxy=False,
    )
    yield rt
    reflect_otel.shutdown()


def _store_rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(path), read_only=True) as db:
        return db.execute(sql).fetchall()


def test_langgraph_agent_is_traced_verified_attributed_and_stored(
    online: Runtime, instrumented: Instrumented, tmp_path: Path
) -> None:
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    graph = replay_agents.build_graph()
    answer = reflect_otel.observe(replay=LangGraphReplayAdapter(graph, tracer_provider=instrumented.provider))(
        lambda question: replay_agents.run_graph(graph, "online-thread")
    )
    with reflect_otel.expect("2101000"):
        assert answer(replay_agents.QUESTION) == replay_agents.WRONG  # the agent's own result, untouched
    assert online.force_flush(60_000)
    (record,) = online.records
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 1, (record.reason, record.corrections)
    assert online.stats.as_dict() | {"tokens": 0} == {
        "runs": 1,
        "traces_received": 1,
        "traces_dropped": 0,
        "traces_verified": 1,
        "traces_flagged": 1,
        "traces_attributed": 1,
        "traces_verified_attributions": 1,
        "budget_skips": 0,
        "export_errors": 0,
        "worker_errors": 0,
        "tokens": 0,
    }
    online.store.force_flush()  # type: ignore[union-attr]
    reflect_otel.shutdown()
    store = tmp_path / "online.duckdb"
    assert _store_rows(store, "SELECT agent, question FROM traces")[0][1] == replay_agents.QUESTION
    assert _store_rows(store, "SELECT is_correct FROM verdicts") == [(False,)]
    assert _store_rows(store, "SELECT status, step_index FROM attributions") == [("verified", 1)]


def test_openai_loop_agent_and_correct_runs_are_not_attributed(online: Runtime, instrumented: Instrumented) -> None:
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    client = replay_agents.openai_client()
    tracer = instrumented.provider.get_tracer("tests.online")
    adapter = OpenAIToolLoopReplayAdapter(
        lambda messages, guard: replay_agents.tool_loop(client, tracer, messages, guard),
        tracer_provider=instrumented.provider,
    )

    @reflect_otel.observe(replay=adapter)
    def agent(question: str) -> str:
        return replay_agents.tool_loop(client, tracer, [{"role": "user", "content": question}])

    with reflect_otel.expect("2101000"):
        assert agent(replay_agents.QUESTION) == replay_agents.WRONG
    with reflect_otel.expect("517000"):  # this time the answer is right: verified, not flagged
        assert agent(replay_agents.QUESTION) == replay_agents.WRONG
    assert online.force_flush(60_000)
    (record,) = online.records
    assert record.status is AttributionStatus.VERIFIED and record.mode == "replay", (record.reason, record.errors)
    assert online.stats.traces_verified == 2 and online.stats.traces_flagged == 1


def test_exceptions_pass_through_and_async_agents_work(online: Runtime) -> None:
    @reflect_otel.observe
    def broken(question: str) -> str:
        raise ValueError("agent bug")

    with pytest.raises(ValueError, match="agent bug"):
        broken("q")

    @reflect_otel.observe(name="async_agent", session_id=lambda question: f"session-{question}")
    async def answer(question: str) -> str:
        await asyncio.sleep(0)
        return "42"

    with reflect_otel.expect("41"):
        assert asyncio.run(answer("q")) == "42"
    assert online.force_flush(30_000)
    assert online.stats.runs == 2 and online.stats.traces_verified == 2
    # the async run was flagged; with no steps to blame, the record says so instead of raising
    assert [r.status for r in online.records] == [AttributionStatus.SKIPPED]
    online.store.force_flush()  # type: ignore[union-attr]
    rows = online.store._db.execute("SELECT agent, session_id, question FROM traces ORDER BY agent").fetchall()  # type: ignore[union-attr]
    assert rows == [("async_agent", "session-q", "q"), ("broken", None, "q")]


def test_failing_llm_and_exporter_never_reach_the_agent(
    instrumented: Instrumented, tmp_path: Path, monkeypatch: Any
) -> None:
    failing = ScriptedLLM(respond=lambda request: LLMError("endpoint down"))
    rt = reflect_otel.configure(
        store=str(tmp_path / "s.duckdb"), llm=failing, tracer_provider=instrumented.provider, proxy=False
    )

    class Broken:
        def export(self, record: Any) -> None:
            raise RuntimeError("exporter exploded")

        def close(self) -> None:
            pass

    rt.exporters["broken"] = Broken()  # type: ignore[assignment]
    graph = replay_agents.build_graph()
    agent = reflect_otel.observe(lambda q: replay_agents.run_graph(graph, "t-fail"))
    with reflect_otel.expect("2101000"):
        assert agent(replay_agents.QUESTION) == replay_agents.WRONG
    assert rt.force_flush(30_000)
    (record,) = rt.records
    assert record.status is AttributionStatus.UNVERIFIED and {e.stage for e in record.errors} == {"localize", "export"}
    assert "broken: RuntimeError: exporter exploded" in {e.message for e in record.errors}
    assert rt.stats.export_errors == 1 and rt.stats.worker_errors == 0  # logged and counted
    reflect_otel.shutdown()


def test_saturated_worker_drops_and_counts_without_deadlock(instrumented: Instrumented, tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(request: ScriptedRequest) -> Any:
        entered.set()
        release.wait(30)
        return LLMError("stop here")

    rt = reflect_otel.configure(
        store=str(tmp_path / "s.duckdb"),
        llm=ScriptedLLM(respond=slow),
        tracer_provider=instrumented.provider,
        proxy=False,
        max_queue=1,
    )
    graph = replay_agents.build_graph()  # a run of several steps, so its attribution asks the auditor
    runs = iter(range(6))
    agent = reflect_otel.observe(lambda q: replay_agents.run_graph(graph, f"t-saturated-{next(runs)}"))
    with reflect_otel.expect("right"):
        agent(replay_agents.QUESTION)
        rt.processor.force_flush(10_000)
        # wait until the worker holds the first trace, so the drop count does not depend on thread timing
        assert entered.wait(10)
        for _ in range(5):
            agent(replay_agents.QUESTION)  # each returns at once, whatever the worker is doing
    rt.processor.force_flush(10_000)
    # one trace held by the worker, one in the queue (max_queue=1): the other four were dropped
    assert rt.stats.traces_received == 6 and rt.stats.traces_dropped == 4
    release.set()
    assert rt.force_flush(30_000)
    assert rt.stats.traces_verified + rt.stats.traces_dropped == 6
    reflect_otel.shutdown()


def test_budgets_stop_attribution_and_say_so(instrumented: Instrumented, tmp_path: Path) -> None:
    rt = reflect_otel.configure(
        store=str(tmp_path / "s.duckdb"),
        llm=replay_agents.scripted_auditor(),
        tracer_provider=instrumented.provider,
        proxy=False,
        max_tokens_per_trace=1,
        max_tokens_per_hour=10**9,
    )
    graph = replay_agents.build_graph()
    agent = reflect_otel.observe(lambda q: replay_agents.run_graph(graph, "t-budget"))
    with reflect_otel.expect("2101000"):
        agent(replay_agents.QUESTION)
    assert rt.force_flush(30_000)
    (per_trace,) = rt.records
    assert any("token budget for one trace (1) is spent" in e.message for e in per_trace.errors)
    rt.budget.per_hour = 0  # the hourly budget is gone: stored and flagged, not attributed
    with reflect_otel.expect("2101000"):
        agent(replay_agents.QUESTION)
    assert rt.force_flush(30_000)
    skipped = rt.records[-1]
    assert skipped.status is AttributionStatus.SKIPPED and "hourly LLM token budget" in skipped.reason
    assert rt.stats.budget_skips == 1
    reflect_otel.shutdown()


def test_observe_context_reaches_the_auditor_as_delimited_data(instrumented: Instrumented, tmp_path: Path) -> None:
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    auditor = replay_agents.scripted_auditor()
    rt = reflect_otel.configure(
        store=str(tmp_path / "context.duckdb"), llm=auditor, tracer_provider=instrumented.provider, proxy=False
    )
    try:
        graph = replay_agents.build_graph()
        answer = reflect_otel.observe(
            replay=LangGraphReplayAdapter(graph, tracer_provider=instrumented.provider),
            context=lambda question: f"Populations table, for: {question}",
        )(lambda question: replay_agents.run_graph(graph, "context-thread"))
        with reflect_otel.expect("2101000"):
            answer(replay_agents.QUESTION)
        assert rt.force_flush(60_000)
    finally:
        reflect_otel.shutdown()
    localize = next(r for r in auditor.requests if r.stage == "localize")
    prompt = "\n".join(m.content for m in localize.messages)
    assert f"Populations table, for: {replay_agents.QUESTION}" in prompt
    assert prompt.index("CONTEXT") < prompt.index("Populations table")  # inside its data block


def test_a_demo_agent_run_that_ends_without_an_answer_is_flagged_online_without_an_llm_call(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    """The proxy regime (no expected answer): the evidence checks flag the run before any audit is asked for."""
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.demo.wtq import load_questions

    question = next(q for q in load_questions() if q.id == "nt-1")

    def decide(request: ScriptedRequest) -> dict[str, Any]:
        if request.stage != "agent":
            raise LLMError("the auditor is down")  # the flag must not depend on it
        if len(request.messages) <= 2:
            return {"thought": "look at the table", "action": {"tool": "describe", "table": "t0"}}
        return {"thought": "nothing to say", "action": {"tool": "final_answer", "answer": ""}}

    llm = ScriptedLLM(respond=decide)
    store = tmp_path / "flag.duckdb"
    rt = reflect_otel.configure(store=str(store), llm=llm, tracer_provider=instrumented.provider, proxy=True)
    try:
        agent = TableQAAgent(question, llm, max_steps=3)
        run = reflect_otel.observe()(lambda text: agent.answer(thread_id="no-answer"))
        assert run(question.question) == ""
        assert rt.force_flush(60_000)
    finally:
        reflect_otel.shutdown()
    ((label, reasoning),) = _store_rows(store, "SELECT label, reasoning FROM verdicts")
    assert label == "HIGH_ERROR_SIGNAL" and "no_final_answer" in reasoning
    assert not [r for r in llm.requests if r.stage.startswith("proxy")]


def test_without_an_expected_answer_configure_combined_flags_a_run_its_own_resamples_do_not_repeat(
    instrumented: Instrumented, tmp_path: Path
) -> None:
    """Issue 43 in process: ``configure(verifier="combined")`` and ``observe(replay=...)``, no answer known
    anywhere. The agent's sampled runs find Paris where the run looked Lyon up: the run is flagged through its
    resamples, attributed, and its replays judged by that consensus; a run its resamples repeat is left alone."""
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    rt = reflect_otel.configure(
        store=str(tmp_path / "combined.duckdb"),
        llm=replay_agents.scripted_auditor(),
        tracer_provider=instrumented.provider,
        reflect_config=ReflectConfig(gate=GateMode.HARD),
        verifier="combined",
    )
    client = replay_agents.openai_client()
    tracer = instrumented.provider.get_tracer("tests.online")

    def resume(messages: list[dict[str, Any]], guard: Any, temperature: float | None = None) -> str:
        if temperature is not None:  # this agent, sampled, reads the question right
            messages.insert(0, {"role": "system", "content": replay_agents.FIX})
        return replay_agents.tool_loop(client, tracer, messages, guard)

    adapter = OpenAIToolLoopReplayAdapter(resume, tracer_provider=instrumented.provider)

    @reflect_otel.observe(replay=adapter)
    def agent(question: str) -> str:
        return replay_agents.tool_loop(client, tracer, [{"role": "user", "content": question}])

    try:
        assert agent(replay_agents.QUESTION) == replay_agents.WRONG  # no expect(): nothing known
        assert agent(f"{replay_agents.QUESTION} ({replay_agents.FIX})") == replay_agents.CORRECT
        assert rt.force_flush(120_000)
        (record,) = rt.records  # the right run is not attributed
        assert record.status is AttributionStatus.VERIFIED and record.step_index == 1
        assert record.original_verdict is not None and record.original_verdict.basis == "consistency_disagree"
        assert {r.verdict.basis for r in record.replays if r.verdict is not None} == {"consistency_majority"}
        assert rt.stats.traces_verified == 2 and rt.stats.traces_flagged == 1
        rt.store.force_flush()  # type: ignore[union-attr]
    finally:
        reflect_otel.shutdown()
    rows = _store_rows(
        tmp_path / "combined.duckdb", "SELECT verifier, basis, resamples, resamples_agreeing, score FROM verdicts"
    )
    # two resamples alike stop each check (REFLECT_FLAG_STOP_LEAD); the store keeps each run's score
    assert sorted(rows) == [
        ("combined", "consistency_agree", 2, 2, 0.0),
        ("combined", "consistency_disagree", 2, 0, 1.0),
    ]


def test_the_process_keeps_its_latest_records_and_a_reader_reads_each_once(
    instrumented: Instrumented, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived process keeps only its latest records in memory (the store keeps all); a reader that passes back
    the count it was given reads each kept record once and learns how many it missed."""
    runtime_module = importlib.import_module("reflect_otel.online.runtime")  # the package names a function so
    monkeypatch.setattr(runtime_module, "MAX_RECENT_RECORDS", 2)
    rt = reflect_otel.configure(
        store=str(tmp_path / "recent.duckdb"),
        llm=replay_agents.scripted_auditor(),
        tracer_provider=instrumented.provider,
        proxy=False,
    )
    try:

        @reflect_otel.observe()
        def agent(question: str) -> str:
            return replay_agents.WRONG

        seen_first, made = rt.records_after(0)
        assert (seen_first, made) == ([], 0)
        for _ in range(3):
            with reflect_otel.expect("2101000"):  # the agent answers otherwise: flagged, attributed
                agent(replay_agents.QUESTION)
        assert rt.force_flush(60_000)
        kept, made = rt.records_after(0)
        assert made == 3 and len(kept) == 2 and list(rt.records) == kept  # the first was let go
        assert rt.records_after(made) == ([], 3)
    finally:
        reflect_otel.shutdown()
    assert _store_rows(tmp_path / "recent.duckdb", "SELECT count(*) FROM attributions") == [(3,)]


def test_worker_failures_are_said_once_each_and_the_memory_of_them_is_bounded(
    online: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from reflect_otel.errors import ReflectError
    from reflect_otel.testing import make_trace

    monkeypatch.setattr(importlib.import_module("reflect_otel.online.runtime"), "MAX_SAID", 2)
    trace = make_trace("q", [{"reasoning": "8", "is_final_answer": True}])
    with caplog.at_level(logging.ERROR, logger="reflect_otel.online"):
        for message in ("store refused run 1", "store refused run 1", "store refused run 2", "store refused run 3"):
            online._failed([(trace, 0)], ReflectError(message))
        online._failed([(trace, 0)], ReflectError("store refused run 1"))  # forgotten once the memory filled
    said = [r.getMessage() for r in caplog.records if "could not process" in r.getMessage()]
    assert [s.count("run 1") for s in said] == [1, 0, 0, 1] and online.stats.worker_errors == 5
