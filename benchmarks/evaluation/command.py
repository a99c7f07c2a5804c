"""What ``reflect-otel eval`` and ``reflect-otel eval-compare`` do, once the command line found this checkout's harness
(``reflect_otel.cli.evaluate`` defines their flags and finds this module)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.evaluation.compare import chart_svg, compare_markdown, load_runs
from benchmarks.evaluation.live import LiveOptions, check_methods, run_live_eval
from benchmarks.evaluation.runner import REPLAYABLE, EvalOptions, run_eval
from reflect_otel.attribution.methods import METHODS, llm_for, method_spec
from reflect_otel.cli._demo_runs import sql_agent_runs, table_agent_rebuilt, table_agent_runs
from reflect_otel.cli._options import agent_is_deterministic, pipeline_config
from reflect_otel.cli.evaluate import LIVE, LIVE_METHODS, NO_METHOD
from reflect_otel.config import LLMConfig, ReflectConfig
from reflect_otel.demo.runs import RebuildRun, RunAgent
from reflect_otel.errors import ConfigError, EndpointDownError, InputError
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.factory import make_llm
from reflect_otel.llm.openai_compat import endpoint_down
from reflect_otel.reading._files import check_output_file, write_text_atomically

__all__ = ["compare_command", "eval_command", "excluded_ids"]


def eval_command(args: argparse.Namespace) -> int:
    """``reflect-otel eval``: a dataset benchmark, or wtq-live's agent answering live."""
    config = _checked_config(args)
    if args.benchmark == LIVE:
        return _eval_live(args, config)
    return _eval_dataset(args, config)


def _checked_config(args: argparse.Namespace) -> ReflectConfig:
    """The pipeline's configuration from the flags, once ``--out`` and ``--data`` are known to be usable."""
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
    return config


def _check_dataset_flags(args: argparse.Namespace) -> None:
    """:class:`ConfigError` for a flag of wtq-live given to a dataset benchmark, or a method it does not know."""
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


def _eval_dataset(args: argparse.Namespace, config: ReflectConfig) -> int:
    _check_dataset_flags(args)
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
    return _dataset_outcome(args.out, metrics)


def _dataset_outcome(out: Path, metrics: dict[str, Any]) -> int:
    """Print the run's table and counts; 1 when every trace failed (nothing was measured)."""
    print((out / "metrics.md").read_text())
    failed = metrics["failed"]
    print(
        f"{metrics['traces']} traces, {failed} failed (stage errors, not scored); results in {out}",
        file=sys.stderr,
    )
    if failed and failed == metrics["traces"]:
        print(
            f"every trace failed, so nothing was measured; see the errors in {out / 'results.jsonl'} "
            "(is the LLM endpoint up and able to answer in JSON?)",
            file=sys.stderr,
        )
        return 1
    return 0


def _eval_live(args: argparse.Namespace, config: ReflectConfig) -> int:
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
    run_agent, rebuild = _live_agent(args, llm, deterministic)
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


def _live_agent(args: argparse.Namespace, llm: StructuredLLM, deterministic: bool) -> tuple[RunAgent, RebuildRun]:
    """The demo agent ``--agent`` names, on the configured endpoint, traced by the instrumented provider."""
    from reflect_otel.online.setup import instrumented_provider

    provider = instrumented_provider()
    if args.agent == "sql":
        from reflect_otel.demo.sql_agent import chat_client

        client, model = chat_client(llm)  # the agent runs on the configured endpoint, as the auditor does
        return sql_agent_runs(client, model, provider, max_steps=args.max_steps, deterministic=deterministic)
    return (
        table_agent_runs(llm, provider, max_steps=args.max_steps, deterministic=deterministic),
        table_agent_rebuilt(llm, provider, max_steps=args.max_steps, deterministic=deterministic),
    )


def _stop_if_down(out: Path) -> None:
    """Stop an evaluation whose LLM endpoint was taken for down: every later trace would fail the same way, after
    the same wait. What finished is in ``out`` (a rerun resumes there)."""
    down = endpoint_down()
    if down is not None:
        raise EndpointDownError(f"stopped: {down}; what finished is in {out}, and a rerun resumes there")


def _said_then_stop_if_down(text: str, out: Path) -> None:
    print(text, file=sys.stderr, flush=True)
    _stop_if_down(out)


def compare_command(args: argparse.Namespace) -> int:
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
