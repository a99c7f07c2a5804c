"""``reflect-otel eval`` and ``reflect-otel eval-compare``: their flags, and the harness that runs them, found in a
source checkout. The evaluation harness (dataset loaders, the resumable runner, wtq-live, the comparisons) is
``benchmarks/evaluation`` in the repository, not part of the installed package: this module looks for the checkout
(the current folder or one above it, else the one an editable install points at) and imports the harness from
there; the package imports ``benchmarks`` nowhere else."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

import reflect_otel
from reflect_otel.attribution.methods import METHODS
from reflect_otel.cli._demo_runs import sql_agent_runs, table_agent_rebuilt, table_agent_runs
from reflect_otel.cli._options import add_agent_determinism_option, add_pipeline_options, positive_int, temperature
from reflect_otel.errors import ConfigError

LIVE = "wtq-live"
LIVE_METHODS = ("reflect", "ics", "reflexion")
NO_METHOD = "none"
AGENTS = ("table", "sql")
DATASETS = ("bbm", "trail-gaia", "trail-swe", "who-and-when")
"""The datasets ``--benchmark`` names (the harness's loaders read each; a test keeps the two lists the same)."""
REPLAYABLE_DATASETS = ("bbm",)
"""The datasets whose traces are replayed (the others are localization-only)."""
HARNESS = "benchmarks.evaluation.command"
_HARNESS_FILE = Path("benchmarks", "evaluation", "command.py")

# the demo agents' wiring, which ``reflect-otel replay`` imports from here
__all__ = [
    "add_eval_command",
    "add_eval_compare_command",
    "find_checkout",
    "sql_agent_runs",
    "table_agent_rebuilt",
    "table_agent_runs",
]


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
        choices=(*DATASETS, LIVE),
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
    _add_run_options(parser)
    parser.set_defaults(handler=_eval)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """The rest of eval's flags, in --help's order: which runs, how many, and the ablations."""
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
        help=f"{LIVE} and the replayable benchmarks ({', '.join(REPLAYABLE_DATASETS)}): replays each method may run per "
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
    return int(_harness().eval_command(args))


def _compare(args: argparse.Namespace) -> int:
    return int(_harness().compare_command(args))


def find_checkout(start: Path | None = None) -> Path | None:
    """The source checkout holding the evaluation harness: ``start`` (the current folder) or a folder above it, else
    the repository an editable install of the package points at; None when neither holds it."""
    here = (start or Path.cwd()).resolve()
    installed_from = Path(reflect_otel.__file__).resolve().parents[1]
    for folder in (here, *here.parents, installed_from):
        if (folder / _HARNESS_FILE).is_file() and (folder / "pyproject.toml").is_file():
            return folder
    return None


def _harness() -> ModuleType:
    """The harness module of the checkout :func:`find_checkout` finds; :class:`ConfigError` saying what to do when
    there is none, or when another ``benchmarks`` package shadows it."""
    root = find_checkout()
    if root is None:
        raise ConfigError(
            "the evaluation harness is not installed with the package: run 'reflect-otel eval' from a clone of the "
            "reflect-otel repository (its benchmarks/evaluation/), e.g. after 'pip install -e .' there"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    module = importlib.import_module(HARNESS)
    found = Path(module.__file__ or "").resolve()
    if found != (root / _HARNESS_FILE).resolve():
        raise ConfigError(f"{HARNESS} was imported from {found}, not from the checkout {root}; run from {root}")
    return module
