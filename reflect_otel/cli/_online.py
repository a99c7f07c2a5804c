"""Options and service shared by the commands that judge and attribute runs online: ``collect --attribute`` and
``attribute --pending``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from reflect_otel.attribution.methods import ATTRIBUTE_METHODS, llm_for, method_spec
from reflect_otel.attribution.service import AttributionService, ReplayFinder
from reflect_otel.cli._options import add_pipeline_options, pipeline_config, positive_int
from reflect_otel.config import LLMConfig
from reflect_otel.errors import NoModelError
from reflect_otel.flagging.combined import VERIFIER_NAMES, flagging_verifier
from reflect_otel.flagging.verifiers import OracleVerifier, Verifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.budget import TokenBudget
from reflect_otel.llm.factory import GET_A_MODEL, LazyLLM, model_missing
from reflect_otel.online.setup import NO_MODEL_VERIFIERS
from reflect_otel.reading._files import check_input_file
from reflect_otel.replay_adapters.remote import load_replay_endpoints
from reflect_otel.settings import settings
from reflect_otel.store import AttributionStore, open_exporter

__all__ = ["add_online_options", "online_choices", "online_service", "replay_endpoints", "say_consistency"]

VERIFIER_HELP = (
    "how runs without an expected answer are judged (a run with one is judged against it): consistency (the "
    "agent run again, up to REFLECT_FLAG_SAMPLES times, through its replay endpoint; a run whose score, the share of "
    "resamples not reproducing its answer or the calibration's fitted map, reaches REFLECT_FLAG_THRESHOLD is "
    "flagged), combined (evidence, then the consistency score on the trace's features too, then the audit where no "
    "check decided; a run the evidence flags is resampled too, for its replays to be judged by the agent's "
    "consensus), proxy (the "
    "plan-anchored verifier: evidence checks, then an LLM audit; the default with a model) or evidence (critical "
    "evidence checks only, no LLM call, silent failures go unflagged; the default without a model). These are "
    "not 'attribute --verifier''s choices, which judge a file's runs against their expected answers"
)


def add_online_options(parser: argparse.ArgumentParser, online: argparse._ArgumentGroup) -> None:
    """``--method``, ``--verifier``, ``--replay-config``, ``--export``, the budgets and REFLECT's settings."""
    online.add_argument(
        "--method",
        choices=ATTRIBUTE_METHODS,
        help="attribution method (default reflect; without a model, evidence)",
    )
    online.add_argument("--verifier", choices=VERIFIER_NAMES, help=VERIFIER_HELP)
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
    online.add_argument(
        "--max-tokens-per-trace",
        type=positive_int,
        default=200_000,
        help="LLM token budget per run (default %(default)s)",
    )
    online.add_argument(
        "--max-tokens-per-hour",
        type=positive_int,
        default=2_000_000,
        help="LLM token budget per hour (default %(default)s); a flagged run met with a spent budget is stored and "
        "counted, not attributed",
    )
    add_pipeline_options(parser.add_argument_group("REFLECT's settings"))


def online_choices(args: argparse.Namespace, *, command: str, verifier_flag: str = "--verifier") -> None:
    """Fill in ``args.method`` and ``args.verifier`` (``verifier_flag``'s): as given, else reflect and proxy.
    Without a model (the light install) a choice that needs one is refused naming both ways to get one, and what
    was not given becomes the evidence checks, said in one line."""
    verifier_name = verifier_flag.removeprefix("--").replace("-", "_")
    missing = model_missing()
    if missing is None:
        args.method = args.method or "reflect"
        setattr(args, verifier_name, getattr(args, verifier_name) or "proxy")
        return
    needs = []
    if args.method is not None and method_spec(args.method).needs_llm:
        needs.append(f"--method {args.method}")
    chosen = getattr(args, verifier_name)
    if chosen is not None and chosen not in NO_MODEL_VERIFIERS:
        needs.append(f"{verifier_flag} {chosen}")
    if needs:
        raise NoModelError(
            f"{' and '.join(needs)} need{'s' if len(needs) == 1 else ''} a model; {missing} (or choose "
            f"--method evidence {verifier_flag} evidence, which need none)"
        )
    args.method = args.method or "evidence"
    setattr(args, verifier_name, chosen or "evidence")
    print(
        f"reflect-otel {command}: {missing.split(';')[0]}: runs are judged against their expected answer or by the "
        f"evidence checks, and attributed by the evidence checks only (--method {args.method} {verifier_flag} "
        f"{getattr(args, verifier_name)}); for REFLECT, {GET_A_MODEL}",
        file=sys.stderr,
    )


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
    wrap_llm: Callable[[StructuredLLM], StructuredLLM] | None = None,
) -> AttributionService:
    """The attribution service of ``collect --attribute`` and ``attribute --pending``: runs judged first (against
    their expected answer, else by ``verifier``, default ``args.verifier``), flagged ones attributed with
    ``args.method`` under the token budgets, replayed through ``replays`` where it has an endpoint, stored and
    exported to ``args.export``. ``wrap_llm`` wraps the model every call goes through (a shared worker's
    :class:`~reflect_otel.llm.patient.PatientLLM`)."""
    spec = method_spec(args.method)
    llm: StructuredLLM = LazyLLM(lambda: llm_for(spec, LLMConfig.from_env()))  # started at the first flagged run
    if wrap_llm is not None:
        llm = wrap_llm(llm)
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
        f"(REFLECT_FLAG_SAMPLE_RATE) of {', '.join(resampling)}, each run again through its replay endpoint up to "
        f"{current.flag_samples} times (REFLECT_FLAG_SAMPLES)"
        + (
            f", stopped once {current.flag_stop_lead} more resamples agree than not or the other way round "
            "(REFLECT_FLAG_STOP_LEAD)"
            if current.flag_stop_lead
            else ""
        )
        + f"; flagged at a score of {current.flag_threshold:g} (REFLECT_FLAG_THRESHOLD)"
        + ("; their tokens count against --max-tokens-per-hour" if budgeted else ""),
        file=sys.stderr,
    )
