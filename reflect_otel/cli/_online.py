"""Options and service shared by the commands that judge and attribute runs online: ``collect --attribute`` and
``attribute --pending``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reflect_otel._files import check_input_file
from reflect_otel.cli._options import add_pipeline_options, pipeline_config, positive_int
from reflect_otel.config import LLMConfig
from reflect_otel.flagging import VERIFIER_NAMES, flagging_verifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.budget import TokenBudget
from reflect_otel.llm.factory import LazyLLM
from reflect_otel.methods import ATTRIBUTE_METHODS, llm_for, method_spec
from reflect_otel.replay_adapters.remote import load_replay_endpoints
from reflect_otel.service import AttributionService, ReplayFinder
from reflect_otel.settings import settings
from reflect_otel.store import AttributionStore, open_exporter
from reflect_otel.verifiers import OracleVerifier, Verifier

__all__ = ["add_online_options", "online_service", "replay_endpoints", "say_consistency"]


def add_online_options(parser: argparse.ArgumentParser, online: argparse._ArgumentGroup) -> None:
    """``--method``, ``--verifier``, ``--replay-config``, ``--export``, the budgets and REFLECT's settings."""
    online.add_argument(
        "--method", choices=ATTRIBUTE_METHODS, default="reflect", help="attribution method (default reflect)"
    )
    online.add_argument(
        "--verifier",
        choices=VERIFIER_NAMES,
        default="proxy",
        help="for runs without an expected answer: consistency (the agent run again REFLECT_FLAG_SAMPLES times "
        "through its replay endpoint; an answer most resamples do not reproduce is flagged), combined (evidence, "
        "then consistency, then the audit where they do not decide; a run the evidence flags is resampled too, for its "
        "replays to be judged by the agent's consensus), proxy (the plan-anchored verifier: evidence checks, then an "
        "LLM audit) or evidence (critical evidence checks only, no LLM call; silent failures go unflagged)",
    )
    online.add_argument(
        "--replay-config",
        type=Path,
        metavar="FILE",
        help="TOML file mapping each agent's service.name to its HTTP replay endpoint; only these URLs are called",
    )
    online.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="NAME",
        help="also send each record to otlp (OTEL_EXPORTER_OTLP_*) or phoenix (PHOENIX_COLLECTOR_ENDPOINT); repeatable",
    )
    online.add_argument(
        "--max-queue-bytes",
        type=positive_int,
        default=64 << 20,
        help="runs held in memory for attribution (default 64 MiB); beyond it they wait in the store",
    )
    online.add_argument("--max-tokens-per-trace", type=positive_int, default=200_000, help="LLM token budget per run")
    online.add_argument(
        "--max-tokens-per-hour",
        type=positive_int,
        default=2_000_000,
        help="LLM token budget per hour; a flagged run met with a spent budget is stored and counted, not attributed",
    )
    add_pipeline_options(parser.add_argument_group("REFLECT's settings"))


def replay_endpoints(path: Path | None) -> ReplayFinder | None:
    """The HTTP replay endpoints of ``--replay-config`` (checked to be a readable file first), or None."""
    if path is None:
        return None
    check_input_file(path, flag="--replay-config", what="TOML file of replay endpoints")
    return load_replay_endpoints(path)


def online_service(
    args: argparse.Namespace,
    store: AttributionStore,
    replays: ReplayFinder | None,
    *,
    verifier: str | None = None,
    budget: TokenBudget | None = None,
) -> AttributionService:
    """The attribution service of ``collect --attribute`` and ``attribute --pending``: runs judged first (against
    their expected answer, else by ``verifier``, default ``args.verifier``), flagged ones attributed with
    ``args.method`` under the token budgets, replayed through ``replays`` where it has an endpoint, stored and
    exported to ``args.export``."""
    spec = method_spec(args.method)
    llm: StructuredLLM = LazyLLM(lambda: llm_for(spec, LLMConfig.from_env()))  # started at the first flagged run
    chosen = verifier or args.verifier
    proxy: Verifier = flagging_verifier(chosen, llm)
    return AttributionService(
        llm,
        spec,
        verifier=OracleVerifier(),
        proxy=proxy,
        config=pipeline_config(args),
        store=store,
        exporters={name: open_exporter(name) for name in dict.fromkeys(args.export)},
        replay_finder=replays,
        budget=budget or TokenBudget(args.max_tokens_per_trace, args.max_tokens_per_hour),
        triage=True,
    )


def say_consistency(replays: ReplayFinder | None, *, flag: str, budgeted: bool) -> None:
    """What the consistency check of ``flag`` (consistency or combined) will cost (``budgeted``: under
    ``--max-tokens-per-hour``), or why it cannot run: no ``--replay-config`` endpoint serves resamples."""
    resampling = [e.service for e in getattr(replays, "endpoints", ()) if e.resample]
    if not resampling:
        print(
            f"warning: {flag} consistency/combined needs an agent to re-run, and no --replay-config endpoint has "
            "resample = true: no run will be checked for consistency (combined falls back to the audit), and without "
            "an expected answer a flagged run's replays cannot be proved right, so it is localized only",
            file=sys.stderr,
        )
        return
    current = settings()
    print(
        f"consistency check: {current.flag_sample_rate:.0%} of runs without an expected answer "
        f"(REFLECT_FLAG_SAMPLE_RATE) of {', '.join(resampling)}, each run again {current.flag_samples} times through "
        "its replay endpoint (REFLECT_FLAG_SAMPLES)"
        + ("; their tokens count against --max-tokens-per-hour" if budgeted else ""),
        file=sys.stderr,
    )
