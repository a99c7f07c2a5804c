"""``reflect-otel demo``: a demo agent (the LangGraph table-QA agent, or with ``--agent sql`` the OpenAI-tool-loop
SQL agent) on bundled WikiTableQuestions questions, through the online path (``observe`` + ``expect``), with
attributions of its failures written to the store."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import reflect_otel
from reflect_otel.cli._options import (
    add_agent_determinism_option,
    add_pipeline_options,
    agent_is_deterministic,
    paragraph,
    pipeline_config,
)
from reflect_otel.cli._progress import Progress, search_logs_to
from reflect_otel.config import GateMode, LLMConfig, ReflectConfig
from reflect_otel.errors import ConfigError
from reflect_otel.llm.factory import make_llm
from reflect_otel.llm.recording import AgentCallRecorder
from reflect_otel.record import AttributionRecord, AttributionStatus
from reflect_otel.store import check_store_target, store_path

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from reflect_otel.demo.wtq import WTQQuestion
    from reflect_otel.llm.base import StructuredLLM
    from reflect_otel.online.runtime import OnlineStats, Runtime
    from reflect_otel.replay import ReplayAdapter

__all__ = ["add_demo_command"]


_DESCRIPTION = paragraph(
    """
Run a demo agent on bundled WikiTableQuestions questions with the configured LLM (REFLECT_LLM_* / OPENAI_*; else the
local llama.cpp server with REFLECT_LOCAL_MODEL, by default Qwen2.5-Coder-1.5B-Instruct): the LangGraph table-QA
agent, or with --agent sql a plain OpenAI tool loop that writes DuckDB SQL. Every run goes through
reflect_otel.observe; wrong answers are attributed by REFLECT with replay (LangGraph checkpoints, or the recorded
OpenAI requests), and everything is written to the store. Progress is printed as it happens; the summary names the
report to open.
"""
)
"""What ``reflect-otel demo --help`` says the command does."""


def add_demo_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("demo", help="run a demo agent and attribute its failures", description=_DESCRIPTION)
    parser.add_argument(
        "--agent",
        choices=("table", "sql"),
        default="table",
        help="table: the LangGraph agent with table tools (default); sql: an OpenAI tool loop with query(sql) and "
        "schema() on DuckDB",
    )
    parser.add_argument(
        "--questions", help="comma-separated question ids to run instead of the demo's set (see questions.tsv)"
    )
    parser.add_argument(
        "--limit", type=int, help="run the first N of the demo's questions (beyond its set: the next in file order)"
    )
    parser.add_argument("--store", help="DuckDB file (default: REFLECT_STORE, then ./reflect.duckdb)")
    parser.add_argument(
        "--phoenix",
        help="also annotate attributions in the Phoenix at this URL (default: PHOENIX_COLLECTOR_ENDPOINT if set)",
    )
    parser.add_argument("--max-steps", type=int, default=6, help="tool calls an agent run may make (default 6)")
    add_agent_determinism_option(parser)
    # the demo's own defaults keep it short on a 2-core CPU: one round, guidance at the localized step only, two
    # proposals; every test is controlled (a control replay from the same prefix) as everywhere
    add_pipeline_options(
        parser.add_argument_group("REFLECT's settings (the demo's defaults)"),
        defaults={"rounds": 1, "rollback_points": 1, "gate": GateMode.HARD.value, "proposal_samples": 2},
    )
    parser.set_defaults(handler=_demo)


class _PipelineProgress(logging.Handler):
    """REFLECT's progress records (``reflect_otel.attribution.search`` at INFO) as progress lines, named by question."""

    def __init__(self, progress: Progress, names: dict[str, str]) -> None:
        super().__init__(logging.INFO)
        self.progress, self.names = progress, names

    def emit(self, record: logging.LogRecord) -> None:
        trace_id = getattr(record, "reflect_trace_id", None)
        if trace_id is None or record.levelno != logging.INFO:
            logging.getLogger().handle(record)  # warnings and errors: as everywhere else
            return
        self.progress.say(f"{self.names.get(trace_id, trace_id[:12])}: {record.getMessage()}")


def _selected(args: argparse.Namespace) -> list[WTQQuestion]:
    from reflect_otel.demo.wtq import DEMO_QUESTIONS, load_questions

    everything = {q.id: q for q in load_questions()}
    ids = [i.strip() for i in args.questions.split(",") if i.strip()] if args.questions else list(DEMO_QUESTIONS)
    unknown = [i for i in ids if i not in everything]
    if unknown:
        raise ConfigError(
            f"--questions: no bundled question {', '.join(unknown)}; the ids are nt-0 to nt-99-style ids "
            "in reflect_otel/demo/data/wtq/questions.tsv"
        )
    if args.limit is not None and not 1 <= args.limit <= len(everything):
        raise ConfigError(f"--limit must be from 1 to {len(everything)}")
    if args.limit is not None and args.limit > len(ids):  # more than the demo set: continue in file order
        ids += [i for i in everything if i not in ids][: args.limit - len(ids)]
    return [everything[i] for i in ids[: args.limit]]


def _demo(args: argparse.Namespace) -> int:
    check_store_target(args.store)  # before the model starts
    questions = _selected(args)
    reflect_config = pipeline_config(args)  # before the model starts: a bad setting must not cost a model load
    phoenix = _phoenix(args)
    started = time.monotonic()
    demo = _start(args, reflect_config, Progress(started), questions=len(questions), phoenix=phoenix)
    with search_logs_to(_PipelineProgress(demo.progress, demo.names)):
        for number, question in enumerate(questions, start=1):
            demo.progress.say(f"[{number}/{len(questions)}] {question.id}: {question.question}")
            demo.ask(question)
    stats, records = demo.runtime.stats, list(demo.runtime.records)
    reflect_otel.shutdown()
    _summary(
        _Summary(
            stats=stats,
            records=records,
            names=demo.names,
            questions=len(questions),
            failures=demo.failures,
            seconds=time.monotonic() - started,
            store=store_path(args.store),
            phoenix=phoenix,
        )
    )
    if demo.failures == len(questions):  # nothing was judged: the demo did not do its job, and says why
        print(f"reflect-otel demo: every agent run failed; the last: {demo.last_failure}", file=sys.stderr)
        return 1
    return 0


def _phoenix(args: argparse.Namespace) -> str | None:
    """The Phoenix to annotate: ``--phoenix``, else ``PHOENIX_COLLECTOR_ENDPOINT``; the exporter reads the variable,
    so ``--phoenix`` sets it."""
    phoenix = args.phoenix or os.environ.get("PHOENIX_COLLECTOR_ENDPOINT")
    if phoenix:
        os.environ["PHOENIX_COLLECTOR_ENDPOINT"] = phoenix
    return phoenix


def _start(
    args: argparse.Namespace, reflect_config: ReflectConfig, progress: Progress, *, questions: int, phoenix: str | None
) -> _DemoRun:
    """The model started and the online path configured on it (the store, REFLECT, Phoenix when given), said."""
    progress.say("starting the model (the first run assembles the local model once)")
    llm = make_llm(LLMConfig.from_env())
    deterministic = agent_is_deterministic(args, llm)
    per_arm = 1 if deterministic else reflect_config.verify_samples
    progress.say(
        f"model: {llm.model_name}; {questions} question(s); REFLECT with D={reflect_config.rounds}, "
        f"K={reflect_config.rollback_points}, M={reflect_config.max_corrections}, {reflect_config.gate.value} gate, "
        f"{reflect_config.proposal_samples} proposals per step; every test controlled, {per_arm} replay(s) per arm "
        f"({'the agent replays deterministically' if deterministic else 'the agent replays are sampled'})"
    )
    runtime = reflect_otel.configure(
        store=args.store,
        llm=llm,
        reflect_config=reflect_config,
        proxy=False,  # the answers are known: the oracle regime
        exporters=["phoenix"] if phoenix else (),
    )
    return _DemoRun(args, progress, runtime, llm, deterministic)


@dataclasses.dataclass
class _DemoRun:
    """The demo as it runs: each question asked through ``observe`` and ``expect``, its attribution waited for and
    said; which question each trace answered, and how many agent runs failed."""

    args: argparse.Namespace
    progress: Progress
    runtime: Runtime
    llm: StructuredLLM
    deterministic: bool
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # trace id -> question id
    failures: int = 0
    last_failure: str = ""
    reported: int = 0

    def ask(self, question: WTQQuestion) -> None:
        from reflect_otel.flagging.verifiers import judged_correct

        run = self._observed(question)
        with reflect_otel.expect(question.expected):
            try:
                answer = run(question.question)
            except Exception as error:  # the model endpoint failed: report it and go on
                self.failures += 1
                self.last_failure = " ".join(str(error).split())[:500]
                self.progress.say(f"{question.id}: the agent failed: {error}")
                return
        wrong = not judged_correct(answer, question.expected, question=question.question)
        verdict = "wrong: REFLECT attributes it now" if wrong else "right"
        self.progress.say(f"{question.id}: answered {answer!r} (expected {question.expected!r}): {verdict}")
        # one model on one CPU: the attribution runs before the next question, so that neither evicts the other's
        # prompt from the server's cache
        while not self.runtime.drain(timeout_s=5):
            self._report_new_records()
        self._report_new_records()

    def _observed(self, question: WTQQuestion) -> Callable[[str], str]:
        """The demo agent on ``question``, run through ``observe`` with its replay adapter; each run's trace id is
        named by the question."""
        from opentelemetry import trace as otel_trace
        from opentelemetry.trace import format_trace_id

        ask, adapter, context, name = _agent(
            self.args.agent,
            question,
            self.llm,
            self.runtime.provider,
            self.args.max_steps,
            deterministic=self.deterministic,
        )

        def traced(text: str) -> str:
            self.names[format_trace_id(otel_trace.get_current_span().get_span_context().trace_id)] = question.id
            return ask()  # the agent holds its question; ``text`` is the run's input

        observed: Callable[[str], str] = reflect_otel.observe(replay=adapter, name=name, context=context)(traced)
        return observed

    def _report_new_records(self) -> None:
        fresh, self.reported = self.runtime.records_after(self.reported)
        for record in fresh:
            where = f"step {record.step_index}" if record.step_index else "no step"
            kind = f", {record.error_type.value}" if record.error_type else ""
            self.progress.say(
                f"{self.names.get(record.trace_id, record.trace_id[:12])}: attribution {record.status.value} at "
                f"{where}{kind} ({record.auditor_calls} auditor requests)"
                + (f"; {record.reason}" if record.reason else "")
            )


def _agent(
    kind: str,
    question: WTQQuestion,
    llm: StructuredLLM,
    provider: TracerProvider,
    max_steps: int,
    *,
    deterministic: bool,
) -> tuple[Callable[[], str], ReplayAdapter, str, str]:
    """The demo agent on ``question``: how to run it, the adapter that replays it (``deterministic``: its replays
    repeat, so one control replay per rollback point decides), what it was given besides its question, and its run's
    name."""
    if kind == "sql":
        from reflect_otel.demo.sql_agent import SQLAgent, chat_client
        from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

        client, model = chat_client(llm)
        sql = SQLAgent(question, client, model=model, tracer_provider=provider, max_steps=max_steps)
        adapter = OpenAIToolLoopReplayAdapter(
            sql.resume,
            tracer_provider=provider,
            execute_tool=sql.execute_tool,
            client=client,
            deterministic=deterministic,
        )
        return sql.answer, adapter, sql.table_context, "sql_agent"
    from reflect_otel.cli._demo_runs import table_adapter
    from reflect_otel.demo.table_agent import TableQAAgent

    table = TableQAAgent(question, AgentCallRecorder(llm), max_steps=max_steps)  # replays' calls: the record's
    graph_adapter = table_adapter(table, provider, deterministic=deterministic)
    return lambda: table.answer(thread_id=f"demo-{question.id}"), graph_adapter, table.table_context, "table_qa"


def _proved(record: AttributionRecord) -> str:
    """A verified record in one sentence: the step, the three arms' answers from the same prefix, and the claim."""
    effect = record.effect
    control = effect.control.answers[0] if effect and effect.control.answers else None
    sensitivity = (
        effect.sensitivity.answers[0] if effect and effect.sensitivity and effect.sensitivity.answers else None
    )
    did = "caused" if record.claim == "localized" else "decided"
    text = (
        f"step {record.step_index} {did} the wrong answer {record.original_answer!r}; replayed from there with the "
        f"correction, the agent answered {record.corrected_answer!r}; from the same point without it (the control), "
        f"{control!r}"
    )
    if sensitivity is not None:
        text += f"; with the step changed in text only (the sensitivity arm), {sensitivity!r}"
    test = record.localization_test
    if record.claim != "localized" and test is not None:
        text += f". Decisive, not shown to be the only decisive step: {test.reason}"
    return text + "."


@dataclasses.dataclass(frozen=True)
class _Summary:
    """What the demo did, for its summary: the runtime's counts, its records, which question each trace answered,
    the questions asked, the agent runs that failed, the seconds it took, the store and the Phoenix it wrote to."""

    stats: OnlineStats
    records: list[AttributionRecord]
    names: dict[str, str]
    questions: int
    failures: int
    seconds: float
    store: Path
    phoenix: str | None


def _summary(run: _Summary) -> None:
    verified = [r for r in run.records if r.status is AttributionStatus.VERIFIED]
    rows = _counts(run, verified)
    width = max(len(name) for name, _ in rows)
    print()
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}")
    for record in verified:
        print(f"\n  {run.names.get(record.trace_id, record.trace_id[:12])}: {_proved(record)}")
    example = next(iter(verified or [r for r in run.records if r.step_index]), None)
    print(f"\nEverything is in {run.store}. Next:")
    if example is not None:
        print(f"  reflect-otel report {example.trace_id[:12]} -o report.html --store {run.store}")
    print(f"  reflect-otel stats --store {run.store}")
    print(f'  reflect-otel sql "SELECT trace_id, status, step_index, error_type FROM attributions" --store {run.store}')
    if run.phoenix:
        print(f"  open {run.phoenix} to see the decisive_error annotations on the spans")


def _counts(run: _Summary, verified: list[AttributionRecord]) -> list[tuple[str, object]]:
    """The summary's table: each count with its name."""
    types = Counter(r.error_type.value for r in run.records if r.error_type is not None)
    return [
        ("questions", run.questions),
        ("correct", run.stats.traces_verified - run.stats.traces_flagged),
        ("flagged (wrong answers)", run.stats.traces_flagged),
        ("attributed", run.stats.traces_attributed),
        ("verified (controlled replay)", len(verified)),
        ("agent failures", run.failures),
        ("top error types", ", ".join(f"{t} ({n})" for t, n in types.most_common(3)) or "-"),
        ("auditor tokens", run.stats.tokens),
        ("seconds", f"{run.seconds:.0f}"),
    ]
