"""The demo agents wired for attribution: a run of the table-QA agent (LangGraph) or the SQL agent (an OpenAI tool
loop) on a bundled question with the replay adapter that replays it in this process, and the same agent rebuilt from
a stored run's trace. Used by ``reflect-otel replay`` (a stored demo run) and by the evaluation harness in the
checkout's ``benchmarks/evaluation``."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from reflect_otel.demo.runs import AgentRun, RebuildRun, RunAgent
from reflect_otel.demo.wtq import WTQQuestion
from reflect_otel.errors import InputError
from reflect_otel.llm.recording import AgentCallRecorder
from reflect_otel.trace import StructuredTrace

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.llm.base import StructuredLLM
    from reflect_otel.replay import ReplayAdapter

__all__ = ["sql_agent_runs", "table_agent_rebuilt", "table_agent_runs"]

THREAD_PREFIX = "wtq-live"
"""The table agent's LangGraph thread ids start with this, then the question id."""


def table_agent_runs(llm: StructuredLLM, provider: TracerProvider, *, max_steps: int, deterministic: bool) -> RunAgent:
    """Runs the table-QA demo agent on a question, captures its trace from ``provider`` (which must carry the
    LangChain instrumentation) and gives the LangGraph adapter that replays it from the run's checkpoints, its
    proposals sampled. ``deterministic``: the agent's model repeats itself (greedy on one slot: the embedded local
    server), so one replay per arm decides (``reflect_otel.cli._options.agent_is_deterministic``)."""
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.reading.capture import recorded_run

    agent_llm = AgentCallRecorder(llm)  # its calls for an attribution (replays, proposals) are counted there

    def run(question: WTQQuestion) -> AgentRun:
        agent = TableQAAgent(question, agent_llm, max_steps=max_steps)
        with recorded_run(provider, "table_qa") as capture:
            answer = agent.answer(thread_id=f"{THREAD_PREFIX}-{question.id}-{uuid.uuid4().hex[:8]}")
        trace = capture.trace
        if trace is None:
            raise InputError(capture.error)
        if not trace.question:
            trace = trace.model_copy(update={"question": question.question})
        # the answer the run is judged by is the one the methods see: a run stopped at its step limit has none
        # (as its replays have), though its spans may end on a model turn that reads like one
        trace = trace.model_copy(update={"final_answer": answer or None})
        adapter = table_adapter(agent, provider, deterministic=deterministic)
        return AgentRun(answer=answer, trace=trace, replay=adapter, context=agent.table_context)

    return run


def table_agent_rebuilt(
    llm: StructuredLLM, provider: TracerProvider, *, max_steps: int, deterministic: bool
) -> RebuildRun:
    """An earlier run of the table-QA demo agent from its stored trace: the same agent on the same question, its
    workspace rebuilt before each replay by re-running the kept steps' tool calls (checked once on the whole trace
    first), its LangGraph adapter seeding the replay from the trace's spans (this process holds no checkpoints of
    it)."""
    from reflect_otel.demo.table_agent import TableQAAgent

    agent_llm = AgentCallRecorder(llm)  # its calls for an attribution (replays, proposals) are counted there

    def rebuilt(question: WTQQuestion, trace: StructuredTrace) -> AgentRun:
        agent = TableQAAgent(question, agent_llm, max_steps=max_steps)
        agent.restore(trace)  # a trace whose calls no longer give its results fails here, not in every replay
        adapter = table_adapter(agent, provider, deterministic=deterministic)
        return AgentRun(answer=trace.final_answer or "", trace=trace, replay=adapter, context=agent.table_context)

    return rebuilt


def sql_agent_runs(
    client: Any, model: str, provider: TracerProvider, *, max_steps: int, deterministic: bool
) -> tuple[RunAgent, RebuildRun]:
    """Runs of the SQL demo agent (a plain OpenAI tool loop with ``client`` and ``model``; ``provider`` must carry
    the OpenAI instrumentation), each with the OpenAI tool-loop adapter that replays it from its recorded requests,
    proposing with the agent's own client; and the same for a stored run (the agent's tools are read-only: a fresh
    agent on the question is the one that ran). ``deterministic`` as for :func:`table_agent_runs`."""
    from reflect_otel.demo.sql_agent import SQLAgent
    from reflect_otel.reading.capture import recorded_run
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    def adapter(agent: SQLAgent) -> OpenAIToolLoopReplayAdapter:
        return OpenAIToolLoopReplayAdapter(
            agent.resume,
            tracer_provider=provider,
            execute_tool=agent.execute_tool,
            client=client,
            deterministic=deterministic,
            pure_tools=("schema", "query"),  # reads of one fixed table: a replacement's result is previewed
        )

    def run(question: WTQQuestion) -> AgentRun:
        agent = SQLAgent(question, client, model=model, tracer_provider=provider, max_steps=max_steps)
        with recorded_run(provider, "sql_agent") as capture:
            answer = agent.answer()
        if capture.trace is None:
            raise InputError(capture.error)
        return AgentRun(answer=answer, trace=capture.trace, replay=adapter(agent), context=agent.table_context)

    def rebuilt(question: WTQQuestion, trace: StructuredTrace) -> AgentRun:
        agent = SQLAgent(question, client, model=model, tracer_provider=provider, max_steps=max_steps)
        return AgentRun(
            answer=trace.final_answer or "", trace=trace, replay=adapter(agent), context=agent.table_context
        )

    return run, rebuilt


def table_adapter(agent: TableQAAgent, provider: TracerProvider, *, deterministic: bool = False) -> ReplayAdapter:
    """The LangGraph adapter that replays a table-QA demo agent's runs, with what that agent knows of itself: its
    correction rule (for its runs only), its pure tools (its table operations read fixed data: a repeated call adds
    nothing) and its rewind (each replay reads the tables its kept steps made)."""
    from reflect_otel.demo import table_rules
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter, LangGraphReplayOptions

    options = LangGraphReplayOptions(
        recursion_limit=agent.recursion_limit,
        deterministic=deterministic,
        correction_rules=table_rules.RULES,
        pure_tools=tuple(agent.tools),
        restore_state=agent.rewind,
    )
    return LangGraphReplayAdapter(agent.graph, tracer_provider=provider, options=options)
