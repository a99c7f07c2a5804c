"""``reflect-otel worker``: attribute the runs collectors queued, on any machine (see
:mod:`reflect_otel.online.shared`)."""

from __future__ import annotations

import argparse
import socket
import sys
import time

from reflect_otel.cli._online import add_online_options, online_choices, online_service, replay_endpoints
from reflect_otel.config import LLMConfig
from reflect_otel.errors import ConfigError
from reflect_otel.llm.patient import PatientLLM
from reflect_otel.online.work import AttributionWorker
from reflect_otel.store import open_store, store_kind, store_target

__all__ = ["add_worker_command"]


def add_worker_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="attribute the runs collectors queued in a PostgreSQL store (any number of workers, any machine)",
        description=(
            "Take the attribution jobs 'collect --attribute --store postgresql://...' queues and process them: "
            "each run judged (against its expected answer, else by --verifier), the flagged ones attributed, "
            "replayed through --replay-config endpoints, stored and exported. Run as many as you like, on any "
            "machine that reaches the server: each job is done once; the jobs of a worker that stops without "
            "finishing (kill -9, a lost machine, a cut network) are taken again by another after --stalled-after "
            "seconds. A worker cut off from the database stops its job and leaves it to the others; when the "
            "database restarts or comes back it takes jobs again by itself. An LLM endpoint that answers 429 or 503 "
            "or stalls is waited for (its Retry-After honoured, else a jittered backoff): the runs wait queued, none "
            "is failed for it. Their status is in the store (attribution_jobs: pending, running, done, failed, "
            "attempts; 'reflect-otel stats' shows the backlog and its age). With a DuckDB store, which one process "
            "owns, it attributes the runs pending there and exits."
        ),
    )
    parser.add_argument("--store", help="postgresql://user@host:port/database (default: REFLECT_STORE)")
    parser.add_argument(
        "--stalled-after",
        type=float,
        default=30.0,
        help="seconds without a worker's heartbeat before its job is retaken (default %(default)s)",
    )
    parser.add_argument("--once", action="store_true", help="stop when no job is left instead of waiting for more")
    parser.add_argument(
        "--llm-concurrency",
        type=int,
        metavar="N",
        help="requests in flight to the LLM endpoint at once across every worker of the store that names the same "
        "model (REFLECT_LLM_MODEL; workers may reach the endpoint by different addresses), held as advisory locks "
        "on the database; a request waits for a free slot (default: REFLECT_LLM_CONCURRENCY, else no cap)",
    )
    add_online_options(parser, parser.add_argument_group("attribution"))
    parser.set_defaults(handler=_worker)


def _worker(args: argparse.Namespace) -> int:
    from reflect_otel.online.shared import SharedQueue

    if args.stalled_after <= 0:
        raise ConfigError("--stalled-after must be positive")
    if args.llm_concurrency is not None and args.llm_concurrency < 1:
        raise ConfigError("--llm-concurrency must be at least 1")
    target = store_target(args.store)
    online_choices(args, command="worker")
    replays = replay_endpoints(args.replay_config)
    store = open_store(target)
    shared = SharedQueue(target) if store_kind(target) == "postgresql" else None
    patient = None if shared is None else (lambda llm: PatientLLM(llm, gate=shared))
    service = online_service(args, store, replays, wrap_llm=patient)
    worker = AttributionWorker(service, store)
    started = time.monotonic()
    try:
        if shared is None:
            print(f"reflect-otel worker: {target} is a DuckDB store; attributing its pending runs", file=sys.stderr)
            worker.run_pending()
        else:
            name = f"{socket.gethostname()}-{id(worker):x}"
            llm = LLMConfig.from_env()
            limit = args.llm_concurrency or llm.concurrency
            print(f"reflect-otel worker {name}: taking attribution jobs from the store", file=sys.stderr)
            shared.run_worker(
                worker,
                stalled_after_s=args.stalled_after,
                wait=not args.once,
                name=name,
                llm_concurrency=limit,
                endpoint=llm.model or "",
            )
    finally:
        service.shutdown()
    s = worker.stats
    print(
        f"reflect-otel worker: {s.verified} run(s) judged in {time.monotonic() - started:.1f} s, {s.flagged} flagged, "
        f"{s.attributed} attributed ({s.verified_attributions} verified), {s.failed} failed",
        file=sys.stderr,
    )
    return 1 if s.failed else 0
