"""``reflect-otel demo``: the table-QA demo agent on bundled WikiTableQuestions questions, through the online
path (``observe`` + ``expect``), with attributions of its failures written to the store."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

import reflect_otel
from reflect_otel.config import GateMode, LLMConfig, ReflectConfig
from reflect_otel.errors import ConfigError
from reflect_otel.llm.factory import make_llm
from reflect_otel.record import AttributionStatus
from reflect_otel.store import store_path

__all__ = ["add_demo_command"]


def add_demo_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the table-QA demo agent and attribute its failures",
        description=(
            "Run the LangGraph table-QA demo agent on bundled WikiTableQuestions questions with the configured LLM "
            "(REFLECT_LLM_* / OPENAI_*; else the local SmolLM2 server). Every run goes through reflect_otel.observe; "
            "wrong answers are attributed with replay (LangGraph checkpoints) and written to the store."
        ),
    )
    parser.add_argument("--limit", type=int, default=5, help="questions to run (default 5, at most 100)")
    parser.add_argument("--store", help="DuckDB file (default: REFLECT_STORE, then ./reflect.duckdb)")
    parser.add_argument(
        "--phoenix",
        help="also annotate attributions in the Phoenix at this URL (default: PHOENIX_COLLECTOR_ENDPOINT if set)",
    )
    parser.add_argument("--max-steps", type=int, default=6, help="tool calls an agent run may make (default 6)")
    parser.add_argument("--rounds", type=int, default=1, help="REFLECT diagnosis rounds D (default 1 for the demo)")
    parser.add_argument("--rollback-points", type=int, default=2, help="rollback points K (default 2 for the demo)")
    parser.set_defaults(handler=_demo)


def _bar(done: int, total: int, label: str) -> str:
    width = 24
    filled = int(width * done / total) if total else width
    return f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total} {label}"


def _progress(text: str, *, final: bool = False) -> None:
    if sys.stderr.isatty():
        print(f"\r{text}", end="\n" if final else "", file=sys.stderr, flush=True)
    elif final:
        print(text, file=sys.stderr)


def _demo(args: argparse.Namespace) -> int:
    import os

    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.demo.wtq import load_questions
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    if not 1 <= args.limit <= 100:
        raise ConfigError("--limit must be from 1 to 100")
    phoenix = args.phoenix or os.environ.get("PHOENIX_COLLECTOR_ENDPOINT")
    if phoenix:
        os.environ["PHOENIX_COLLECTOR_ENDPOINT"] = phoenix
    started = time.monotonic()
    llm = make_llm(LLMConfig.from_env())
    print(f"model: {llm.model_name}", file=sys.stderr)
    runtime = reflect_otel.configure(
        store=args.store,
        llm=llm,
        reflect_config=ReflectConfig(rounds=args.rounds, rollback_points=args.rollback_points, gate=GateMode.SOFT),
        proxy=False,  # the answers are known: the oracle regime
        exporters=["phoenix"] if phoenix else (),
    )
    questions = load_questions(args.limit)
    answers: dict[str, str] = {}
    failures = 0
    for number, question in enumerate(questions, start=1):
        _progress(_bar(number - 1, len(questions), f"running {question.id}"))
        agent = TableQAAgent(question, llm, max_steps=args.max_steps)
        adapter = LangGraphReplayAdapter(
            agent.graph, tracer_provider=runtime.provider, recursion_limit=agent.recursion_limit
        )

        def ask(text: str, agent: TableQAAgent = agent, thread: str = f"demo-{question.id}") -> str:
            return agent.answer(thread_id=thread)  # the agent holds its question; ``text`` makes it the run's input

        run = reflect_otel.observe(replay=adapter, name="table_qa")(ask)
        with reflect_otel.expect(question.expected):
            try:
                answers[question.id] = run(question.question)
            except Exception as error:  # the model endpoint failed: report it and go on
                failures += 1
                print(f"\n{question.id}: the agent failed: {error}", file=sys.stderr)
    _progress(_bar(len(questions), len(questions), "runs done"), final=True)
    while not runtime.drain(timeout_s=2):
        stats = runtime.stats
        _progress(_bar(stats.traces_verified, len(questions), f"verified; {stats.traces_attributed} attributed"))
    stats = runtime.stats
    records = list(runtime.records)
    reflect_otel.shutdown()
    _progress(_bar(stats.traces_verified, len(questions), "verified and attributed"), final=True)
    _summary(stats, records, len(questions), failures, time.monotonic() - started, args, phoenix)
    return 0


def _summary(
    stats: Any,
    records: list[Any],
    questions: int,
    failures: int,
    seconds: float,
    args: argparse.Namespace,
    phoenix: str | None,
) -> None:
    types = Counter(r.error_type.value for r in records if r.error_type is not None)
    verified = sum(1 for r in records if r.status is AttributionStatus.VERIFIED)
    rows = [
        ("questions", questions),
        ("correct", stats.traces_verified - stats.traces_flagged),
        ("flagged (wrong answers)", stats.traces_flagged),
        ("attributed", stats.traces_attributed),
        ("verified by replay", verified),
        ("agent failures", failures),
        ("top error types", ", ".join(f"{t} ({n})" for t, n in types.most_common(3)) or "-"),
        ("auditor tokens", stats.tokens),
        ("seconds", f"{seconds:.0f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print()
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}")
    store = store_path(args.store)
    example = next((r.trace_id for r in records if r.step_index), None)
    print(f"\nEverything is in {store}. Next:")
    print(f"  reflect-otel stats --store {store}")
    print(f'  reflect-otel sql "SELECT trace_id, status, step_index, error_type FROM attributions" --store {store}')
    if example:
        print(f"  reflect-otel report {example[:12]} -o report.html --store {store}")
    if phoenix:
        print(f"  open {phoenix} to see the decisive_error annotations on the spans")
