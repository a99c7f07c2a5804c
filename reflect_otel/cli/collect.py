"""The ``collect`` and ``import`` subcommands (registered by entry point; see ``reflect_otel.cli``)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reflect_otel.attribution.service import AttributionService, ReplayFinder
from reflect_otel.cli._online import (
    add_online_options,
    online_choices,
    online_service,
    replay_endpoints,
    say_consistency,
)
from reflect_otel.collectors.files import DEFAULT_MAX_FILE_BYTES, ImportReport, import_files
from reflect_otel.collectors.receiver import OTLPReceiver, ReceiverLimits, parse_endpoint
from reflect_otel.collectors.trace_collector import BufferLimits
from reflect_otel.datasets.files import DATASET_FORMAT_NAMERS, DATASET_READERS
from reflect_otel.demo.examples import example_path
from reflect_otel.errors import ConfigError, InputError
from reflect_otel.llm.openai_compat import endpoint_down
from reflect_otel.online.shared import SharedQueue
from reflect_otel.online.work import AttributionWorker, WorkerStats, expected_answer_of
from reflect_otel.reading._files import LinesOut, check_output_file, lines_replaced_on_success
from reflect_otel.reading.tracefile import TraceWriter, check_traces_file, each_trace_row
from reflect_otel.settings import settings
from reflect_otel.store import (
    AttributionJob,
    AttributionStore,
    check_store_target,
    open_store,
    store_kind,
    store_target,
)
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, StructuredTrace

__all__ = ["TraceSink", "add_collect_command", "add_import_command"]

EXAMPLE_FILES = ("table_agent_nt1.otlp.json", "langgraph_agent.otlp.json", "bbm/multistep_arithmetic.jsonl")


def add_collect_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "collect",
        help="receive OTLP traces from agents in other processes, store them, and (--attribute) judge and attribute them",
        description=(
            "Run an OTLP receiver (HTTP protobuf/JSON on /v1/traces, and gRPC) that rebuilds each finished agent "
            "run into a StructuredTrace and appends it to --out. Point the agent's exporter at it, e.g. "
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces. Stop with Ctrl-C or SIGTERM: "
            "traces still being gathered are written before it exits, and requests that arrive meanwhile are told "
            "to retry (503). The --out file is the source of truth: each trace is appended and flushed before it "
            "goes to the store, so after a crash (kill -9) the store may lack the last traces of the file; "
            "'collect --reingest FILE' brings it up to date (re-writing a trace changes nothing). A crash loses "
            "the traces still being gathered in memory, acknowledged or not. With --attribute it also judges every "
            "run and attributes the flagged ones (see below)."
        ),
    )
    _add_receiver_options(parser)
    _add_store_options(parser)
    online = parser.add_argument_group(
        "attribution (--attribute)",
        "Judge every finished run and attribute the flagged ones, off the receive path: a run whose root span "
        "carries reflect.expected_answer is judged against it, the others by --verifier. Each run is stored as a "
        "job first; when attribution falls behind, runs wait in the store (pending) and are taken later, by this "
        "process or by 'attribute --pending'. Records go to the store, and to each --export.",
    )
    online.add_argument("--attribute", action="store_true", help="verify and attribute runs as they arrive")
    add_online_options(parser, online)
    parser.set_defaults(handler=_collect)


def _add_receiver_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reingest",
        type=Path,
        metavar="FILE",
        help="instead of listening, write every trace of FILE (a --out file) to the store and exit; with "
        "--attribute, their runs are queued for attribution too (a run attributed already is left alone)",
    )
    parser.add_argument("--http", default="127.0.0.1:4318", help="HTTP HOST:PORT, or 'off' (default 127.0.0.1:4318)")
    parser.add_argument("--grpc", default="off", help="gRPC HOST:PORT, e.g. 127.0.0.1:4317, or 'off' (default off)")
    parser.add_argument(
        "-o", "--out", type=Path, help="JSONL file the traces are appended to (required to listen; never truncated)"
    )
    parser.add_argument("--allow-remote", action="store_true", help="allow listening on a non-loopback address")
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=ReceiverLimits().max_body_bytes,
        help="the largest request body taken, in bytes (default %(default)s); a larger one is refused with 413",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=BufferLimits().grace_s,
        help="seconds a run waits, after its root span ends, for late spans (default %(default)s)",
    )
    parser.add_argument(
        "--ttl",
        type=float,
        default=BufferLimits().ttl_s,
        help="seconds a run whose root span never ends is kept before it is written as incomplete (default "
        "%(default)s)",
    )


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: run until Ctrl-C)")
    parser.add_argument(
        "--store", help="DuckDB file the traces also go to (default: REFLECT_STORE, then ./reflect.duckdb)"
    )
    parser.add_argument("--no-store", action="store_true", help="write only the --out file")


def _reingest(path: Path, store_path: str | None, *, attribute: bool = False) -> int:
    """Every trace of ``path`` (a --out file, or an ``import`` output, whose lines carry expected answers) into the
    store; bad lines (a line torn by a crash) are named and skipped. With ``attribute``, each run's job is written
    pending too (a job already running or done is left as it is: a job's state never goes back), for the workers
    of a PostgreSQL store, or 'attribute --pending', to take."""
    check_traces_file(path, namers=DATASET_FORMAT_NAMERS)  # before the store is opened: a wrong file creates no store
    store = open_store(store_path)
    written = bad = 0
    try:
        for row in each_trace_row(path, extra_fields=(EXPECTED_ANSWER_FIELD,)):
            if isinstance(row, InputError):
                bad += 1
                print(f"skipped: {row}", file=sys.stderr)
                continue
            store.write_trace(row.trace)
            if attribute:
                expected = row.extras.get(EXPECTED_ANSWER_FIELD) or expected_answer_of(row.trace)
                store.write_job(AttributionJob(row.trace.trace_id, "pending", expected_answer=expected))
            written += 1
            if written % 1_000 == 0:
                print(f"reingest: {written} traces", file=sys.stderr)
        flushed = store.force_flush(600_000)
    finally:
        store.shutdown()
    print(f"reingest: {written} trace(s) from {path} written to the store; {bad} line(s) skipped", file=sys.stderr)
    if not flushed:
        raise InputError("the store did not finish writing within 10 minutes; run --reingest again")
    return 1 if bad else 0


class TraceSink:
    """Where each trace the receiver assembles goes, each write once: appended to the ``--out`` file, written to the
    store, and (with ``--attribute``) offered for attribution: the worker writes the run's job and the service, told
    the trace is stored, writes only its verdict and record; a shared queue defers a job once the trace is written."""

    def __init__(
        self,
        writer: TraceWriter | None = None,
        store: AttributionStore | None = None,
        worker: AttributionWorker | None = None,
        shared: SharedQueue | None = None,
    ) -> None:
        self.writer = writer
        self.store = store
        self.worker = worker
        self.shared = shared

    def __call__(self, trace: StructuredTrace) -> None:
        if self.writer is not None:
            self.writer.write(trace)
        if self.store is not None:
            self.store.write_trace(trace)
        if self.worker is not None:
            self.worker.offer(trace)
        if self.shared is not None and self.store is not None:
            self.shared.offer(trace, self.store, expected_answer_of(trace))


def _check_collect(args: argparse.Namespace) -> None:
    """Every setting checked before any file is opened or port bound."""
    if args.out is None:
        raise ConfigError("collect needs --out FILE, the JSONL file the traces are appended to")
    check_output_file(args.out, flag="--out", example="traces.jsonl")
    if not args.no_store:
        check_store_target(args.store)  # before the --out file is opened: a wrong store leaves no file behind
    if args.max_body_bytes < 1:
        raise ConfigError("--max-body-bytes must be positive")
    if args.attribute and args.no_store:
        raise ConfigError("--attribute keeps its work list in the store; drop --no-store")
    if args.attribute:
        online_choices(args, command="collect --attribute")  # before any file: no model refuses, or says evidence


def _receiver(args: argparse.Namespace, sink: TraceSink) -> OTLPReceiver:
    """Bound (a bad endpoint fails before any file is opened); nothing is served until ``start()``."""
    http = None if args.http == "off" else parse_endpoint(args.http, default_port=4318)
    grpc_endpoint = None if args.grpc == "off" else parse_endpoint(args.grpc, default_port=4317)
    return OTLPReceiver(
        sink,
        http=http,
        grpc_endpoint=grpc_endpoint,
        limits=ReceiverLimits(max_body_bytes=args.max_body_bytes),
        buffer_limits=BufferLimits(grace_s=args.grace, ttl_s=args.ttl),
        allow_remote=args.allow_remote,
    )


def _wire(args: argparse.Namespace, sink: TraceSink) -> tuple[AttributionService | None, ReplayFinder | None]:
    """Open the --out file, the store and (with --attribute) the worker or shared queue into ``sink``; the service
    when this process attributes, and the replay endpoints configured."""
    replays = replay_endpoints(args.replay_config)
    sink.writer = TraceWriter(args.out)
    sink.store = None if args.no_store else open_store(args.store)
    if not args.attribute or sink.store is None:
        return None, replays
    if store_kind(store_target(args.store)) == "postgresql":
        sink.shared = SharedQueue(store_target(args.store)).open(sink.store)  # workers on any machine attribute
        return None, replays
    service = online_service(args, sink.store, replays)
    sink.worker = AttributionWorker(service, sink.store, max_bytes=args.max_queue_bytes).start()
    return service, replays


def _listening(args: argparse.Namespace, receiver: OTLPReceiver) -> str:
    where = []
    if receiver.http_port is not None and args.http != "off":
        where.append(
            f"OTLP/HTTP on http://{parse_endpoint(args.http, default_port=4318)[0]}:{receiver.http_port}/v1/traces"
        )
    if receiver.grpc_port is not None and args.grpc != "off":
        where.append(f"OTLP/gRPC on {parse_endpoint(args.grpc, default_port=4317)[0]}:{receiver.grpc_port}")
    return f"reflect-otel collect: listening for {' and '.join(where)}; writing to {args.out}"


def _serve(args: argparse.Namespace, receiver: OTLPReceiver, sink: TraceSink) -> None:
    """Until Ctrl-C, SIGTERM or --duration, the status line when it changes."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    deadline = None if args.duration is None else time.monotonic() + args.duration
    while not stop.wait(1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))):
        if deadline is not None and time.monotonic() >= deadline:
            break
        written = sink.writer.written if sink.writer is not None else 0
        _status(receiver.stats(), written, _work_stats(sink.worker, sink.shared), end=_end(), quiet=True)
        _say_endpoint_down()


def _stop(
    args: argparse.Namespace, receiver: OTLPReceiver, sink: TraceSink, service: AttributionService | None
) -> None:
    receiver.shutdown()
    if sink.writer is not None:
        sink.writer.close()
    if sink.worker is not None:
        sink.worker.shutdown(int(args.grace * 1000))  # what is not done stays pending in the store
    if sink.shared is not None:
        sink.shared.shutdown()
    if service is not None:
        service.shutdown()  # its exporters and the store
    elif sink.store is not None:
        sink.store.shutdown()


def _collect(args: argparse.Namespace) -> int:
    if args.reingest is not None:
        if args.no_store:
            raise ConfigError("--reingest writes to the store; drop --no-store")
        return _reingest(args.reingest, args.store, attribute=args.attribute)
    _check_collect(args)
    sink = TraceSink()  # filled in before start(): the receiver calls it only once it serves
    receiver = _receiver(args, sink)
    service, replays = _wire(args, sink)
    receiver.start()
    print(_listening(args, receiver), file=sys.stderr)
    if args.attribute and args.verifier in ("consistency", "combined"):
        say_consistency(replays, flag="--verifier", budgeted=True)
    try:
        _serve(args, receiver, sink)
    finally:
        _stop(args, receiver, sink, service)
    written = sink.writer.written if sink.writer is not None else 0
    _status(receiver.stats(), written, _work_stats(sink.worker, sink.shared), end="\n", quiet=False)
    return _farewell(args, sink)


def _farewell(args: argparse.Namespace, sink: TraceSink) -> int:
    """What was left to do, said; 1 when writes could not reach the store."""
    if sink.shared is not None:
        print(f"{sink.shared.stats.pending} run(s) queued for 'reflect-otel worker'", file=sys.stderr)
    worker = sink.worker
    if worker is not None and worker.stats.pending + worker.stats.queued:
        print(
            f"{worker.stats.pending + worker.stats.queued} run(s) left pending in the store: 'collect --attribute' "
            "or 'attribute --pending' takes them",
            file=sys.stderr,
        )
    unstored = getattr(getattr(sink.store, "stats", None), "unstored", 0)
    if unstored:
        print(
            f"{unstored} write(s) could not reach the store before exit (it was out of reach); the traces are in "
            f"{args.out}: 'reflect-otel collect --reingest {args.out}' stores them",
            file=sys.stderr,
        )
        return 1
    return 0


_said_down: set[str] = set()


def _say_endpoint_down() -> None:
    """Once per endpoint taken for down, why the runs being attributed fail (they are stored and counted; the
    receiver goes on, and the endpoint is tried again after a pause)."""
    down = endpoint_down()
    if down is not None and str(down) not in _said_down:
        _said_down.add(str(down))
        print(f"\nreflect-otel collect: {down}; runs are still received and stored", file=sys.stderr)


def _end() -> str:
    return "\r" if sys.stderr.isatty() else "\n"


def _work_stats(worker: AttributionWorker | None, shared: SharedQueue | None) -> WorkerStats | None:
    return worker.stats if worker is not None else shared.stats if shared is not None else None


_last_status: list[str] = [""]


def _status(stats: dict[str, int], written: int, work: WorkerStats | None, *, end: str, quiet: bool) -> None:
    dropped = sum(v for k, v in stats.items() if k.startswith("spans_dropped"))
    line = (
        f"requests {stats['requests_ok']} ok / {stats['requests_rejected']} rejected; spans {stats['spans_taken']} "
        f"({stats['spans_rejected']} rejected, {dropped} dropped); traces written {written}"
    )
    if work is not None:
        w = work
        line += (
            f"; queue {w.queued} ({w.queued_bytes // 1024} KiB), pending {w.pending}; judged {w.verified}, "
            f"flagged {w.flagged}, attributed {w.attributed} ({w.verified_attributions} verified), "
            f"budget skips {w.budget_skips}, failed {w.failed}"
        )
        if w.consistency_checked:
            rate = settings().flag_sample_rate  # the share asked for, beside the share checked
            line += (
                f"; consistency checked {w.consistency_checked} of {w.verified} at rate {rate:.0%} "
                f"({w.resamples} agent resamples)"
            )
    if quiet and line == _last_status[0]:
        return  # print only when something changed, so logs stay short
    _last_status[0] = line
    print(line, end=end, file=sys.stderr, flush=True)


def add_import_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "import",
        help="read OTLP/JSON, TRAIL or BIG-Bench-Mistake files and write traces as JSONL",
        description=(
            "Read OTLP/JSON exports (an ExportTraceServiceRequest per file, or one per line in .jsonl), TRAIL "
            "span-tree files (with their annotations from ../annotations/, mapped to steps) and BIG-Bench-Mistake "
            ".jsonl files (with each row's target as expected_answer), rebuild each trace and write it to -o. "
            "Folders are searched for *.json and *.jsonl."
        ),
    )
    parser.add_argument("paths", nargs="*", type=Path, help="files or folders to read")
    parser.add_argument(
        "-o",
        "--out",
        required=True,
        type=Path,
        help="JSONL file to write; replaced only when every file was read; when the import fails it is left as it "
        "was, and the traces read are kept in NAME.partial.jsonl beside it",
    )
    parser.add_argument(
        "--example",
        action="store_true",
        help="also read the examples shipped with the package: a failed run of the table-QA demo agent whose empty "
        "filter result names the right value (the evidence checks find its failing step with no model), a "
        "LangGraph run, and three failed BIG-Bench-Mistake chains of thought, with their expected answers",
    )
    parser.add_argument("--max-file-bytes", type=int, default=DEFAULT_MAX_FILE_BYTES, help="largest file read")
    parser.set_defaults(handler=_import)


def _import(args: argparse.Namespace) -> int:
    paths: list[Path] = list(args.paths)
    if args.example:
        paths.extend(example_path(name) for name in EXAMPLE_FILES)
    if not paths:
        raise ConfigError("name at least one file or folder, or pass --example")
    check_output_file(args.out, flag="-o")
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or folder")
    tty = sys.stderr.isatty()

    def progress(report: ImportReport) -> None:
        if tty:
            print(f"\rread {report.files_read} file(s), {report.traces} trace(s)", end="", file=sys.stderr)

    output: LinesOut | None = None
    try:
        # a new file, renamed over -o only when every file was read: a failed import leaves -o as it was
        with lines_replaced_on_success(args.out, flag="-o") as output:
            report = import_files(
                paths,
                _with_expected_answer(TraceWriter(args.out, stream=output.file).write),
                max_file_bytes=args.max_file_bytes,
                progress=progress,
                readers=DATASET_READERS,  # TRAIL and BIG-Bench Mistake files, besides OTLP
            )
            output.lines = report.traces
            if not report.traces:
                raise _NothingImported(report)
            if report.failures:
                output.fail("files failed")
    except _NothingImported as nothing:
        if tty:
            print(file=sys.stderr)
        _print_problems(nothing.report)
        raise InputError(
            f"no trace in {', '.join(map(str, paths))}; {output.kept() if output else args.out}. import reads "
            "OTLP/JSON exports, TRAIL trace files and BIG-Bench-Mistake .jsonl files"
        ) from None
    if tty:
        print(file=sys.stderr)
    if report.failures:
        _print_problems(report)
        print(
            f"reflect-otel import: error: {len(report.failures)} file(s) could not be read (see above); "
            f"{output.kept('trace(s)')}",
            file=sys.stderr,
        )
        return 1
    _print_report(report, args.out)
    return 0


def _with_expected_answer(
    write: Callable[[StructuredTrace, dict[str, str] | None], None],
) -> Callable[[StructuredTrace, dict[str, str] | None], None]:
    """``write``, giving a trace whose root span said its expected answer (``reflect.expected_answer``) that answer
    as the line's ``expected_answer``, as a dataset row's is: ``show`` and ``attribute`` read it there."""

    def written(trace: StructuredTrace, fields: dict[str, str] | None) -> None:
        expected = expected_answer_of(trace)
        if expected is not None and not (fields or {}).get(EXPECTED_ANSWER_FIELD):
            fields = {**(fields or {}), EXPECTED_ANSWER_FIELD: expected}
        write(trace, fields)

    return written


class _NothingImported(Exception):
    def __init__(self, report: ImportReport) -> None:
        super().__init__("no trace imported")
        self.report = report


def _print_problems(report: ImportReport) -> None:
    if report.files_skipped:
        print(f"skipped {report.files_skipped} file(s) that hold no traces (annotations, other JSON)", file=sys.stderr)
    for failure in report.failures:
        print(f"failed: {failure}", file=sys.stderr)


def _print_report(report: ImportReport, out: Any) -> None:
    print(
        f"imported {report.traces} trace(s), {report.steps} step(s) from {report.files_read} file(s) into {out}",
        file=sys.stderr,
    )
    if report.labels_total:
        share = 100.0 * report.labels_mapped / report.labels_total
        print(
            f"annotations: {report.labels_mapped} of {report.labels_total} locations mapped to a step ({share:.1f}%)",
            file=sys.stderr,
        )
    _print_problems(report)
