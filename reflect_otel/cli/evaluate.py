"""``reflect-otel eval`` and ``reflect-otel eval-compare``."""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reflect_otel.attribution.methods import METHODS, llm_for, method_spec
from reflect_otel.cli._options import (
    add_agent_determinism_option,
    add_pipeline_options,
    agent_is_deterministic,
    pipeline_config,
    positive_int,
    temperature,
)
from reflect_otel.config import LLMConfig, ReflectConfig
from reflect_otel.errors import ConfigError, EndpointDownError, InputError
from reflect_otel.evaluation.compare import chart_svg, compare_markdown, load_runs
from reflect_otel.evaluation.loaders import BENCHMARKS
from reflect_otel.evaluation.runner import REPLAYABLE, EvalOptions, run_eval
from reflect_otel.llm.factory import make_llm
from reflect_otel.llm.openai_compat import endpoint_down
from reflect_otel.llm.recording import AgentCallRecorder
from reflect_otel.reading._files import check_output_file, write_text_atomically

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from reflect_otel.evaluation.live import RebuildRun, RunAgent
    from reflect_otel.llm.base import StructuredLLM
    from reflect_otel.trace import StructuredTrace

LIVE = "wtq-live"
LIVE_METHODS = ("reflect", "ics", "reflexion")
NO_METHOD = "none"
AGENTS = ("table", "sql")

__all__ = ["add_eval_command", "add_eval_compare_command"]


def add_eval_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a method on a public benchmark (resumable)",
        description="Attribute every failing trace of a benchmark with a gold step and score the predictions. "
        "Results are appended to OUT/results.jsonl as they finish; re-running skips what is done. Writes "
        "run_config.json, metrics.json and metrics.md. BIG-Bench Mistake replays through the chain-of-thought "
        "adapter; TRAIL and Who&When are localization-only (there is no environment to replay). "
        f"{LIVE} runs a demo agent (--agent: the LangGraph table-QA agent, or the OpenAI-tool-loop SQL agent) with "
        "the configured model on WikiTableQuestions questions (DATA/wtq), keeps the runs whose answer is wrong, and "
        "applies each method to the same failed runs with the same model (replays through LangGraph, or the OpenAI "
        "tool-loop adapter); it reports, per method, the failures corrected and verified.",
    )
    parser.add_argument(
        "--benchmark",
        required=True,
        choices=(*BENCHMARKS, LIVE),
        help="the dataset (in --data, as its repository lays it out) or, for wtq-live, a demo agent answering live",
    )
    parser.add_argument(
        "--method",
        help=f"one of {', '.join(METHODS)}; for {LIVE}, a comma-separated list (default {','.join(LIVE_METHODS)}), "
        f"or {NO_METHOD} to record the agent's runs only (labelled runs for benchmarks.flagging --live)",
    )
    parser.add_argument("--data", required=True, type=Path, help="the dataset folder, e.g. ../shared/data")
    parser.add_argument("-o", "--out", required=True, type=Path, help="folder for this run (new, or one to resume)")
    parser.add_argument("--limit", type=positive_int, help=f"at most N traces (for {LIVE}: stop after N failed runs)")
    parser.add_argument(
        "--runs",
        type=positive_int,
        metavar="N",
        help=f"{LIVE}: stop after N agent runs, right or wrong (with --limit, at whichever comes first)",
    )
    parser.add_argument(
        "--max-steps", type=int, default=6, help=f"{LIVE}: tool calls an agent run may make (default 6, as the demo)"
    )
    parser.add_argument(
        "--agent",
        choices=AGENTS,
        default="table",
        help=f"{LIVE}: the agent that answers: table (LangGraph, table tools; the default) or sql (a plain OpenAI tool "
        "loop writing DuckDB SQL, its results JSON and DuckDB's own errors)",
    )
    add_agent_determinism_option(parser)
    parser.add_argument("--seed", type=int, help="shuffle the traces with this seed before --limit")
    parser.add_argument(
        "--exclude",
        help=f"comma-separated ids never to run: {LIVE}'s question ids (e.g. the demo's, to measure on others), or a "
        "dataset benchmark's trace ids (the traces an earlier sample was read on), left out before --seed's shuffle",
    )
    parser.add_argument(
        "--max-replays",
        type=positive_int,
        help=f"{LIVE} and the replayable benchmarks ({', '.join(REPLAYABLE)}): replays each method may run per "
        "failed run, the same budget for every method compared (default: each method's own)",
    )
    parser.add_argument(
        "--replay-temperature",
        type=temperature,
        metavar="T",
        help="removed: replays now run greedily and are compared with a control replay; proposals (the agent's "
        "own decisions at a step) are sampled at --proposal-temperature",
    )
    parser.add_argument("--judge-explanations", action="store_true", help="LLM-judge explanation similarity")
    ablation = parser.add_argument_group("ablations (the paper's table, one flag per row)")
    ablation.add_argument("--no-diagnostician", action="store_true", help="a null repair plan")
    add_pipeline_options(ablation)
    ablation.add_argument("--no-relocalize", action="store_true", help="keep the first localization every round")
    parser.set_defaults(handler=_eval)


def add_eval_compare_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "eval-compare",
        help="put evaluation runs side by side",
        description="Print the runs' figures as markdown tables: dataset runs (EM, Off-1, verified, cost), wtq-live "
        "runs (one row per method: failures flipped and verified), and a localization benchmark's own table. A "
        "folder may be a run of 'reflect-otel eval', a folder of runs, or any folder under benchmarks/results/; "
        "a run without metrics.json is computed from its results.jsonl, and the table says so. Nothing is written "
        "into the folders.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (from 'reflect-otel eval -o FOLDER')")
    parser.add_argument("--chart", type=Path, help="also write a chart here (SVG; replaced only when written whole)")
    parser.set_defaults(handler=_compare)


def _eval(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.out.is_dir():
        raise InputError(f"--out {args.out}: is a file; --out names the folder of this run (new, or one to resume)")
    if not args.data.is_dir():
        raise InputError(
            f"--data {args.data}: no such folder; give the folder holding the datasets (bbm/, trail/, who_and_when/, "
            "wtq/; see docs/usage.md, Evaluations)"
        )
    config = pipeline_config(
        args,
        use_diagnostician=False if args.no_diagnostician else None,
        relocalize=False if args.no_relocalize else None,
    )
    if args.max_replays is not None:  # the cap every method runs under is the one its records and run_config say
        config = config.model_copy(update={"max_replays": args.max_replays})
    if args.replay_temperature is not None:
        raise ConfigError(
            "--replay-temperature was removed: replays run greedily and each is compared with a control replay "
            "from the same prefix; sample the agent's proposals with --proposal-temperature T instead"
        )
    if args.benchmark == LIVE:
        return _eval_live(args, config)
    if args.method not in METHODS:
        raise ConfigError(f"--method: choose one of {', '.join(METHODS)}")
    if args.runs is not None:
        raise ConfigError(f"--runs counts the agent runs of {LIVE}; for {args.benchmark} give --limit")
    if args.agent != "table":
        raise ConfigError(f"--agent chooses the agent of {LIVE}; {args.benchmark} attributes recorded traces")
    if args.deterministic_agent is not None:
        raise ConfigError(f"--deterministic-agent is about the agent of {LIVE}; {args.benchmark} replays its own way")
    if args.max_replays is not None and args.benchmark not in REPLAYABLE:
        raise ConfigError(f"--max-replays: {args.benchmark} is localization-only, nothing is replayed")
    print(
        f"{args.benchmark}: {REPLAYABLE.get(args.benchmark, 'localization-only (no environment to replay)')}",
        file=sys.stderr,
    )
    llm = llm_for(method_spec(args.method), LLMConfig.from_env())
    tty = sys.stderr.isatty()

    def progress(done: int, total: int, em: float | None, failed: int) -> None:
        scored = f"running EM {em * 100:.1f}%" if em is not None else "nothing scored yet"
        line = f"[{done}/{total}] {scored}" + (f", {failed} failed" if failed else "")
        print(f"\r{line}" if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
        _stop_if_down(args.out)

    options = EvalOptions(
        args.benchmark,
        args.method,
        args.data,
        args.out,
        args.limit,
        args.seed,
        args.judge_explanations,
        config,
        max_replays=args.max_replays,
        exclude=excluded_ids(args.exclude or ""),
    )
    metrics = run_eval(options, llm, progress=progress)
    if tty:
        print(file=sys.stderr)
    print((args.out / "metrics.md").read_text())
    failed = metrics["failed"]
    print(
        f"{metrics['traces']} traces, {failed} failed (stage errors, not scored); results in {args.out}",
        file=sys.stderr,
    )
    if failed and failed == metrics["traces"]:
        print(
            f"every trace failed, so nothing was measured; see the errors in {args.out / 'results.jsonl'} "
            "(is the LLM endpoint up and able to answer in JSON?)",
            file=sys.stderr,
        )
        return 1
    return 0


def _eval_live(args: argparse.Namespace, config: ReflectConfig) -> int:
    from reflect_otel.evaluation.live import LiveOptions, check_methods, run_live_eval
    from reflect_otel.online.setup import instrumented_provider

    methods = (
        ()
        if args.method == NO_METHOD
        else tuple(m.strip() for m in (args.method or ",".join(LIVE_METHODS)).split(",") if m.strip())
    )
    if not methods and args.method != NO_METHOD:
        raise ConfigError(f"--method names no method; give {NO_METHOD} to record the agent's runs only")
    if args.max_steps < 1:
        raise ConfigError("--max-steps must be at least 1")
    check_methods(methods)  # before the model starts: that can take minutes
    llm = make_llm(LLMConfig.from_env())
    deterministic = agent_is_deterministic(args, llm)
    print(
        f"{LIVE}: {args.agent} agent, model {llm.model_name}; methods {', '.join(methods) or 'none (runs only)'}; "
        + (
            "deterministic replays, one per arm"
            if deterministic
            else f"sampled replays, {config.verify_samples} per arm"
        ),
        file=sys.stderr,
    )
    exclude = excluded_ids(args.exclude or "")
    options = LiveOptions(
        methods,
        args.data,
        args.out,
        args.limit,
        args.seed,
        config,
        exclude=exclude,
        agent=args.agent,
        max_replays=args.max_replays,
        max_runs=args.runs,
        max_steps=args.max_steps,
        deterministic_agent=deterministic,
    )
    provider = instrumented_provider()
    if args.agent == "sql":
        from reflect_otel.demo.sql_agent import chat_client

        client, model = chat_client(llm)  # the agent runs on the configured endpoint, as the auditor does
        run_agent, rebuild = sql_agent_runs(
            client, model, provider, max_steps=args.max_steps, deterministic=deterministic
        )
    else:
        run_agent = table_agent_runs(llm, provider, max_steps=args.max_steps, deterministic=deterministic)
        rebuild = table_agent_rebuilt(llm, provider, max_steps=args.max_steps, deterministic=deterministic)
    metrics = run_live_eval(
        options,
        llm,
        run_agent,
        rebuild=rebuild,
        progress=lambda text: _said_then_stop_if_down(text, args.out),
    )
    print((args.out / "metrics.md").read_text())
    runs = [m["runs"] for m in metrics["methods"].values()]
    if any(runs) and all(m["failed"] == m["runs"] for m in metrics["methods"].values()):
        print(f"every attribution failed, so nothing was measured; see {args.out / 'results.jsonl'}", file=sys.stderr)
        return 1
    return 0


def _stop_if_down(out: Path) -> None:
    """Stop an evaluation whose LLM endpoint was taken for down: every later trace would fail the same way, after
    the same wait. What finished is in ``out`` (a rerun resumes there)."""
    down = endpoint_down()
    if down is not None:
        raise EndpointDownError(f"stopped: {down}; what finished is in {out}, and a rerun resumes there")


def _said_then_stop_if_down(text: str, out: Path) -> None:
    print(text, file=sys.stderr, flush=True)
    _stop_if_down(out)


def table_agent_runs(llm: StructuredLLM, provider: TracerProvider, *, max_steps: int, deterministic: bool) -> RunAgent:
    """Runs the table-QA demo agent on a question, captures its trace from ``provider`` (which must carry the
    LangChain instrumentation) and gives the LangGraph adapter that replays it from the run's checkpoints, its
    proposals sampled. ``deterministic``: the agent's model repeats itself (greedy on one slot: the embedded local
    server), so one replay per arm decides (:func:`~reflect_otel.cli._options.agent_is_deterministic`)."""
    from reflect_otel.demo import table_rules
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.demo.wtq import WTQQuestion
    from reflect_otel.evaluation.live import AgentRun
    from reflect_otel.reading.capture import recorded_run
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    agent_llm = AgentCallRecorder(llm)  # its calls for an attribution (replays, proposals) are counted there

    def run(question: WTQQuestion) -> AgentRun:
        agent = TableQAAgent(question, agent_llm, max_steps=max_steps)
        with recorded_run(provider, "table_qa") as capture:
            answer = agent.answer(thread_id=f"{LIVE}-{question.id}-{uuid.uuid4().hex[:8]}")
        trace = capture.trace
        if trace is None:
            raise InputError(capture.error)
        if not trace.question:
            trace = trace.model_copy(update={"question": question.question})
        # the answer the run is judged by is the one the methods see: a run stopped at its step limit has none
        # (as its replays have), though its spans may end on a model turn that reads like one
        trace = trace.model_copy(update={"final_answer": answer or None})
        adapter = LangGraphReplayAdapter(
            agent.graph,
            tracer_provider=provider,
            recursion_limit=agent.recursion_limit,
            deterministic=deterministic,
            correction_rules=table_rules.RULES,  # the table agent's own rule, for its runs only
            pure_tools=tuple(agent.tools),  # its table operations read fixed data: a repeated call adds nothing
            restore_state=agent.rewind,  # each replay reads the table names its run read
        )
        return AgentRun(answer=answer, trace=trace, replay=adapter, context=agent.table_context)

    return run


def table_agent_rebuilt(
    llm: StructuredLLM, provider: TracerProvider, *, max_steps: int, deterministic: bool
) -> RebuildRun:
    """An earlier run of the table-QA demo agent from its stored trace: the same agent on the same question, its
    workspace rebuilt before each replay by re-running the kept steps' tool calls (checked once on the whole trace
    first), its LangGraph adapter seeding the replay from the trace's spans (this process holds no checkpoints of
    it)."""
    from reflect_otel.demo import table_rules
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.demo.wtq import WTQQuestion
    from reflect_otel.evaluation.live import AgentRun
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    agent_llm = AgentCallRecorder(llm)  # its calls for an attribution (replays, proposals) are counted there

    def rebuilt(question: WTQQuestion, trace: StructuredTrace) -> AgentRun:
        agent = TableQAAgent(question, agent_llm, max_steps=max_steps)
        agent.restore(trace)  # a trace whose calls no longer give its results fails here, not in every replay
        adapter = LangGraphReplayAdapter(
            agent.graph,
            tracer_provider=provider,
            recursion_limit=agent.recursion_limit,
            deterministic=deterministic,
            correction_rules=table_rules.RULES,  # the table agent's own rule, for its runs only
            pure_tools=tuple(agent.tools),  # its table operations read fixed data: a repeated call adds nothing
            restore_state=agent.rewind,  # the tables its kept steps made, rebuilt before each replay
        )
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
    from reflect_otel.demo.wtq import WTQQuestion
    from reflect_otel.evaluation.live import AgentRun
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


def _compare(args: argparse.Namespace) -> int:
    if args.chart:
        check_output_file(args.chart, flag="--chart", example="chart.svg")
    runs = load_runs(args.runs)
    print(compare_markdown(runs))
    if args.chart and not any(run.kind in ("dataset", "live") for run in runs):
        raise InputError("--chart: none of these folders holds a run with figures to chart (only localization tables)")
    if args.chart:
        write_text_atomically(args.chart, chart_svg(runs), flag="--chart")
        print(f"chart written to {args.chart}", file=sys.stderr)
    return 0


def excluded_ids(text: str) -> tuple[str, ...]:
    """``--exclude``'s question ids: comma separated, spaces and a trailing newline ignored."""
    return tuple(q.strip() for q in text.split(",") if q.strip())
