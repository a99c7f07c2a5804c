"""``reflect-otel attribute``: attribute traces captured earlier (by ``collect`` or ``import``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reflect_otel._values import utf8_text
from reflect_otel.attribution.methods import ATTRIBUTE_METHODS, llm_for, method_spec
from reflect_otel.attribution.service import AttributionService, ReplayFinder
from reflect_otel.cli._online import online_choices, online_service, replay_endpoints, say_consistency
from reflect_otel.cli._options import (
    SkippedLines,
    add_export_option,
    add_pipeline_options,
    add_replay_config_option,
    paragraph,
    pipeline_config,
    positive_int,
)
from reflect_otel.config import LLMConfig, ReflectConfig
from reflect_otel.datasets import BBM_TASKS
from reflect_otel.datasets.bbm import BBMVerifier
from reflect_otel.datasets.files import DATASET_FORMAT_NAMERS
from reflect_otel.errors import ConfigError, EndpointDownError, InputError
from reflect_otel.flagging.combined import VERIFIER_NAMES
from reflect_otel.flagging.verifiers import OracleVerifier, SelfVerifier, Verifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.budget import TokenBudget
from reflect_otel.llm.factory import make_llm
from reflect_otel.llm.openai_compat import ENDPOINT_ERROR_PREFIX, endpoint_down
from reflect_otel.online.work import AttributionWorker, WorkerStats, expected_answer_of
from reflect_otel.reading._files import LinesOut, check_input_file, check_output_file, lines_replaced_on_success
from reflect_otel.reading.tracefile import TraceRow, check_traces_file, good_trace_rows
from reflect_otel.record import AttributionRecord, AttributionStatus
from reflect_otel.replay import ReplayAdapter, find_replay_adapter
from reflect_otel.store import check_store_target, open_exporter, open_store, store_path, store_target
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = ["add_attribute_command"]

VERIFIERS = ("oracle", "bbm", "self")
_MAX_EXPECTED_BYTES = 256 * 1024 * 1024


_DESCRIPTION = paragraph(
    """
Attribute each trace of a JSONL file (from 'collect' or 'import') and write one AttributionRecord per line to -o.
The LLM is REFLECT_LLM_BASE_URL/REFLECT_LLM_MODEL/REFLECT_LLM_API_KEY (or OPENAI_*), else the local llama.cpp server
with REFLECT_LOCAL_MODEL (by default Qwen2.5-Coder-1.5B-Instruct). Traces an installed replay adapter can re-run get
replay-verified attributions; the others are localization-only, and each record says so.
"""
)
"""What ``reflect-otel attribute --help`` says the command does."""


def add_attribute_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "attribute",
        help="find the decisive error step of failed traces (REFLECT or a baseline)",
        description=_DESCRIPTION,
    )
    _add_input_options(parser)
    _add_judging_options(parser)
    add_pipeline_options(parser.add_argument_group("REFLECT's settings"))
    _add_output_options(parser)
    parser.set_defaults(handler=_attribute)


def _add_input_options(parser: argparse.ArgumentParser) -> None:
    """The runs to attribute (a file, or the store's pending ones), how pending runs are judged, and how runs are
    replayed."""
    parser.add_argument("traces", type=Path, nargs="?", help="JSONL file of traces (or --pending)")
    parser.add_argument(
        "--pending",
        action="store_true",
        help="instead of a file, take the runs 'collect --attribute' left pending in the store: each is judged "
        "(against its expected answer, else by --flag-verifier), and attributed when flagged",
    )
    parser.add_argument(
        "--flag-verifier",
        choices=VERIFIER_NAMES,
        help="with --pending, how runs without an expected answer are judged, as 'collect --verifier' (default "
        "proxy, or evidence without a model; consistency and combined re-run the agent through its --replay-config "
        "endpoint)",
    )
    add_replay_config_option(
        parser,
        help="TOML file mapping each agent's service.name to its HTTP replay endpoint (see 'collect --help'); "
        "only these URLs are called, never one found in a trace",
    )
    parser.add_argument(
        "--method",
        choices=ATTRIBUTE_METHODS,
        help="attribution method (default reflect; evidence, first-step and last-step need no model)",
    )


def _add_judging_options(parser: argparse.ArgumentParser) -> None:
    """Where each run's expected answer is, how its answer is judged, which runs are attributed."""
    expected = parser.add_mutually_exclusive_group()
    expected.add_argument(
        "--expected-field",
        default=EXPECTED_ANSWER_FIELD,
        help=f"key in each line holding the correct answer (default {EXPECTED_ANSWER_FIELD}, written by 'import')",
    )
    expected.add_argument("--expected-file", type=Path, help="JSON object or JSONL of {trace_id, expected_answer}")
    parser.add_argument(
        "--verifier",
        choices=VERIFIERS,
        help="how each run's answer is judged before it is attributed (and, for methods that replay, each replay's): "
        "oracle: match the expected answer (the default); bbm: BIG-Bench-Mistake answers (the default for "
        "BIG-Bench-Mistake traces); self: an LLM judge, which needs no expected answer. Runs judged right are not "
        "attributed (see --include-correct); runs that cannot be judged (no expected answer) are attributed. These "
        "judge a file's runs against their answers; 'collect --verifier' (and --flag-verifier here) chooses how "
        "runs without one are flagged, hence other names",
    )
    parser.add_argument(
        "--include-correct",
        action="store_true",
        help="also attribute runs judged right (a baseline then names a step of a right run; REFLECT skips them "
        "anyway: no replay can flip a right answer)",
    )
    parser.add_argument("--domain-context", default="", help="task description or table context for the prompts")
    parser.add_argument("--limit", type=positive_int, help="attribute at most N traces")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    """What the prompts may show, and where the records go: the -o file, the store, exporters."""
    parser.add_argument("--withhold-expected", action="store_true", help="show [WITHHELD] instead of the answer")
    parser.add_argument(
        "-o",
        "--out",
        type=Path,
        help="JSONL file of records to write (required with a file); replaced only when every trace was read and "
        "attributed; when the command fails or is interrupted it is left as it was, and the records that finished "
        "are kept in NAME.partial.jsonl beside it",
    )
    parser.add_argument(
        "--store", help="DuckDB file for traces, verdicts and records (default: REFLECT_STORE, then ./reflect.duckdb)"
    )
    parser.add_argument("--no-store", action="store_true", help="write only the -o file")
    add_export_option(
        parser,
        help="also send each record to: otlp (an EVALUATOR span, via OTEL_EXPORTER_OTLP_*) or phoenix (annotations, "
        "via PHOENIX_COLLECTOR_ENDPOINT); repeatable. A failed export is reported; the store keeps the record",
    )


def _expected_answers(path: Path) -> dict[str, str]:
    check_input_file(path, flag="--expected-file", what="file of expected answers")
    if path.stat().st_size > _MAX_EXPECTED_BYTES:
        raise InputError(f"--expected-file {path}: over {_MAX_EXPECTED_BYTES} bytes; is it the right file?")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data: Any = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, dict):  # one JSON object: {trace_id: expected_answer}
        return {utf8_text(str(k)): utf8_text(str(v)) for k, v in data.items()}
    answers = {}
    for number, line in enumerate(text.splitlines(), start=1):  # JSONL: a bad line is named and skipped
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            print(f"skipped: {path}:{number}: not valid JSON", file=sys.stderr)
            continue
        if not isinstance(row, dict) or "trace_id" not in row or "expected_answer" not in row:
            print(f"skipped: {path}:{number}: needs trace_id and expected_answer", file=sys.stderr)
            continue
        answers[utf8_text(str(row["trace_id"]))] = utf8_text(str(row["expected_answer"]))
    if not answers:
        raise InputError(
            f"{path}: no expected answers (a JSON object of trace_id: answer, or JSONL rows of "
            "{trace_id, expected_answer})"
        )
    return answers


def _replay_finder(config: Path | None) -> ReplayFinder:
    """The configured HTTP endpoints first (when a file is given), then the installed adapters."""
    if config is None:
        return find_replay_adapter
    endpoints = replay_endpoints(config)
    assert endpoints is not None

    def find(trace: StructuredTrace, llm: StructuredLLM) -> ReplayAdapter | None:
        return endpoints(trace, llm) or find_replay_adapter(trace, llm)

    return find


def _dataset_context(trace: StructuredTrace) -> str:
    """The BIG-Bench-Mistake task a dataset trace came from, for the prompts' domain-context slot."""
    task = trace.metadata.get("task", "") if trace.metadata.get("dataset") == "bbm" else ""
    return f"{task}: {BBM_TASKS[task]}" if task in BBM_TASKS else ""


def _attribute_pending(args: argparse.Namespace) -> int:
    if args.traces is not None or args.no_store or args.out is not None:
        raise ConfigError(
            "--pending takes the runs waiting in the store and writes there: drop the trace file, -o and --no-store"
        )
    if args.verifier is not None or args.include_correct:
        raise ConfigError(
            "--pending judges each run against its expected answer, else with --flag-verifier (default proxy), and "
            "attributes only runs judged wrong: drop --verifier and --include-correct"
        )
    check_store_target(args.store)
    online_choices(args, command="attribute --pending", verifier_flag="--flag-verifier")
    replays = replay_endpoints(args.replay_config)
    store = open_store(args.store)
    # a batch the user started and can stop: no token budget
    service = online_service(args, store, replays, verifier=args.flag_verifier, budget=TokenBudget(10**12, 10**12))
    if args.flag_verifier in ("consistency", "combined"):
        say_consistency(replays, flag="--flag-verifier", budgeted=False)
    worker = AttributionWorker(service, store)
    started = time.monotonic()

    def progress(stats: WorkerStats) -> None:
        print(
            f"pending: {stats.verified} judged, {stats.flagged} flagged, {stats.attributed} attributed "
            f"({stats.verified_attributions} verified), {stats.failed} failed; {stats.pending} left",
            file=sys.stderr,
        )

    try:
        stats = worker.run_pending(progress)
    finally:
        service.shutdown()
    print(
        f"{stats.verified} pending run(s) judged in {time.monotonic() - started:.1f} s: {stats.flagged} flagged, "
        f"{stats.attributed} attributed ({stats.verified_attributions} verified); records in the store "
        f"{store_path(args.store)}",
        file=sys.stderr,
    )
    return 1 if stats.failed else 0


def _verifier(name: str, llm: StructuredLLM, config: ReflectConfig, domain_context: str) -> Verifier:
    if name == "self":
        return SelfVerifier(llm, max_chars=config.max_field_chars, domain_context=domain_context)
    return BBMVerifier() if name == "bbm" else OracleVerifier()


def _default_verifier(rows: list[TraceRow]) -> str:
    """bbm for a file of BIG-Bench-Mistake traces (their targets are in a form the oracle does not read), else
    oracle."""
    return "bbm" if rows and all(row.trace.metadata.get("dataset") == "bbm" for row in rows) else "oracle"


def _check_paths(args: argparse.Namespace) -> None:
    """Every path the command was given, before any work: a wrong one fails naming the fix, and no file is
    touched."""
    check_traces_file(args.traces, namers=DATASET_FORMAT_NAMERS)
    check_output_file(args.out, flag="-o", example="records.jsonl")
    if args.expected_file is not None:
        check_input_file(args.expected_file, flag="--expected-file", what="file of expected answers")
    if args.replay_config is not None:
        check_input_file(args.replay_config, flag="--replay-config", what="TOML file")
    if not args.no_store:
        check_store_target(args.store)


def _attribute(args: argparse.Namespace) -> int:
    if args.pending:
        return _attribute_pending(args)
    if args.traces is None or args.out is None:
        raise ConfigError("attribute needs a JSONL file of traces and -o FILE for the records (or --pending)")
    if args.no_store and args.store:
        raise ConfigError("--store and --no-store say opposite things; drop one")
    _check_paths(args)
    config = pipeline_config(args, include_expected_answer=False if args.withhold_expected else None)
    answers = _expected_answers(args.expected_file) if args.expected_file else {}
    skipped = SkippedLines()
    rows = list(
        good_trace_rows(args.traces, extra_fields=(args.expected_field,), skipped=skipped, namers=DATASET_FORMAT_NAMERS)
    )[: args.limit]
    if not rows:
        raise InputError(f"{args.traces}: no valid traces")
    batch = _Batch(args, rows, answers, _service(args, rows, config), skipped.errors)
    started = time.monotonic()
    tally, causes = _Tally(), _Causes()
    output, stopped = _write_records(batch, tally, causes)
    causes.say_held(stopped)
    return _summary(
        _Summary(
            traces=args.traces,
            out=args.out,
            stored_in=None if args.no_store else store_target(args.store),
            tally=tally,
            total=len(rows),
            seconds=time.monotonic() - started,
            skipped_lines=len(skipped.errors),
            output=output,
            stopped=stopped,
        )
    )


def _service(args: argparse.Namespace, rows: list[TraceRow], config: ReflectConfig) -> AttributionService:
    """The attribution service for ``--method`` and ``--verifier`` (said on stderr), writing to the store and the
    exporters asked for."""
    spec = method_spec(args.method or "reflect")
    verifier_name = args.verifier or _default_verifier(rows)
    # the verifier is honoured for every method: a model judge gets the configured model even for a method
    # that asks none
    llm = make_llm(LLMConfig.from_env()) if verifier_name == "self" else llm_for(spec, LLMConfig.from_env())
    service = AttributionService(
        llm,
        spec,
        verifier=_verifier(verifier_name, llm, config, args.domain_context),
        config=config,
        store=None if args.no_store else open_store(args.store),
        exporters={name: open_exporter(name) for name in dict.fromkeys(args.export)},
        replay_finder=_replay_finder(args.replay_config),
        skip_correct=not args.include_correct,
    )
    print(
        f"attribute: {len(rows)} trace(s) with {spec.name}; answers judged by the {verifier_name} verifier"
        + ("" if args.include_correct else ", runs judged right are not attributed"),
        file=sys.stderr,
    )
    return service


@dataclass(frozen=True, slots=True)
class _Batch:
    """A file's runs to attribute, with what they are attributed by: the command's flags, the expected answers of
    --expected-file, the service, and the lines of the file that were not traces."""

    args: argparse.Namespace
    rows: list[TraceRow]
    answers: dict[str, str]
    service: AttributionService
    bad_lines: list[InputError]


def _write_records(batch: _Batch, tally: _Tally, causes: _Causes) -> tuple[LinesOut | None, EndpointDownError | None]:
    """Each run attributed and its record written to -o, which is replaced only when the batch succeeded; the
    service is shut down at the end whatever happened. Returns the output and the endpoint taken for down, if one
    stopped the batch."""
    output: LinesOut | None = None
    try:
        with lines_replaced_on_success(batch.args.out, flag="-o") as output:
            stopped = _attribute_rows(batch, output, tally, causes)
            total = len(batch.rows) if stopped is None else tally.seen
            failure = _failure(tally, total, batch.bad_lines, stopped)
            if failure is not None:
                output.fail(failure)
    except BaseException:
        if output is not None and output.aside is not None:
            print(f"reflect-otel attribute: {output.kept('record(s)')}", file=sys.stderr)
        raise
    finally:
        batch.service.shutdown()
    return output, stopped


def _attribute_rows(batch: _Batch, output: LinesOut, tally: _Tally, causes: _Causes) -> EndpointDownError | None:
    """Each run attributed in turn, its record written and said; stops at an endpoint taken for down (returned)."""
    args = batch.args
    for number, row in enumerate(batch.rows, start=1):
        expected = (
            batch.answers.get(row.trace.trace_id)
            or row.extras.get(args.expected_field)
            or expected_answer_of(row.trace)  # its root span's reflect.expected_answer, as collect reads it
        )
        outcome = batch.service.process(
            row.trace,
            expected=str(expected) if expected is not None else None,
            domain_context=args.domain_context or _dataset_context(row.trace),
        )
        record = outcome.record
        assert record is not None  # without triage every trace gets a record
        output.write_line(record.model_dump_json())
        tally.add(record, outcome.verdict, outcome.export_failures)
        print(
            f"[{number}/{len(batch.rows)}] {row.trace.trace_id[:12]} {_line(record, outcome.verdict)}", file=sys.stderr
        )
        causes.add(record)
        stopped = endpoint_down()
        if stopped is not None:  # every later trace would fail the same way, after the same wait
            return stopped
    return None


class _Causes:
    """Why stages failed, each message said once: at once, except an endpoint's failure, which is said at the end
    unless the endpoint was taken for down (the line that stops the command names it)."""

    def __init__(self) -> None:
        self.said: set[str] = set()
        self.held: dict[str, str] = {}

    def add(self, record: AttributionRecord) -> None:
        for error in record.errors:
            message = " ".join(error.message.split())[:400]
            if message in self.said or message in self.held:
                continue
            if message.startswith(ENDPOINT_ERROR_PREFIX):
                self.held[message] = error.stage
                continue
            self.said.add(message)
            print(f"    {error.stage} failed: {message}", file=sys.stderr)

    def say_held(self, stopped: EndpointDownError | None) -> None:
        for message, stage in self.held.items():
            if stopped is None or not message.startswith(stopped.endpoint):
                print(f"{stage} failed: {message}", file=sys.stderr)


def _line(record: AttributionRecord, verdict: Verdict | None) -> str:
    judged = {True: "right", False: "wrong", None: "not judged"}[verdict.is_correct if verdict else None]
    if record.status is AttributionStatus.SKIPPED and verdict is not None and verdict.is_correct:
        return f"{judged:<10} not attributed"
    where = f"step {record.step_index}" if record.step_index else "no step"
    return (
        f"{judged:<10} {record.status.value:<10} {where:<8} {record.mode.value:<17} calls {record.total_calls:>3} "
        f"tokens {record.total_tokens:>6}" + (f"  ({record.reason})" if record.reason else "")
    )


class _Tally:
    """What the run did, for the summary."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}
        self.judged: dict[str, int] = {}
        self.failed = 0
        self.right_skipped = 0
        self.export_failures: dict[str, int] = {}
        self.seen = 0

    def add(
        self, record: AttributionRecord, verdict: Verdict | None, export_failures: Sequence[tuple[str, str]]
    ) -> None:
        judged = {True: "right", False: "wrong", None: "not judged"}[verdict.is_correct if verdict else None]
        self.seen += 1
        self.judged[judged] = self.judged.get(judged, 0) + 1
        if record.status is AttributionStatus.SKIPPED and verdict is not None and verdict.is_correct:
            self.right_skipped += 1
        else:
            self.statuses[record.status.value] = self.statuses.get(record.status.value, 0) + 1
        self.failed += record.failed
        for name, message in export_failures:
            self.export_failures[name] = self.export_failures.get(name, 0) + 1
            print(f"  export to {name} failed: {message}", file=sys.stderr)


def _failure(
    tally: _Tally, attempted_total: int, bad_lines: list[InputError], stopped: EndpointDownError | None
) -> str | None:
    """Why the command failed (and so leaves -o as it was), or None: an endpoint taken for down, every
    attribution failed, or lines of the traces file that were not traces."""
    if stopped is not None:
        return "stopped"
    attempted = attempted_total - tally.right_skipped
    if attempted and tally.failed == attempted:
        return "every attribution failed"
    if bad_lines:
        return "lines skipped"
    return None


@dataclass(frozen=True, slots=True)
class _Summary:
    """What a file's batch did, for its last lines and exit code: the traces file and the -o file, the store written
    (None with --no-store), the tally of what was judged and attributed, how many runs there were and how long it
    took, the lines skipped, the output (None when it could not be opened) and the endpoint that stopped it, if
    one did."""

    traces: Path
    out: Path
    stored_in: str | None
    tally: _Tally
    total: int
    seconds: float
    skipped_lines: int
    output: LinesOut | None
    stopped: EndpointDownError | None


def _summary(run: _Summary) -> int:
    """The batch's summary on stderr; returns the exit code (1 when it stopped, failed, skipped lines or an export
    failed)."""
    tally = run.tally
    for name, count in tally.export_failures.items():
        print(f"{count} record(s) could not be exported to {name}", file=sys.stderr)
    if run.stored_in is not None:
        print(f"written to the store {run.stored_in}", file=sys.stderr)
    judged = ", ".join(f"{n} {kind}" for kind, n in sorted(tally.judged.items()))
    statuses = ", ".join(f"{n} {status}" for status, n in sorted(tally.statuses.items())) or "none"
    failed = run.output is not None and run.output.failure is not None
    print(
        f"{tally.seen} of {run.total} trace(s) in {run.seconds:.1f} s; judged: {judged}; attributions: {statuses}"
        + (f" ({tally.failed} failed: stage errors, no attribution)" if tally.failed else "")
        + (
            f"; {tally.right_skipped} right run(s) not attributed (--include-correct attributes them)"
            if tally.right_skipped
            else ""
        )
        + ("" if failed else f"; records in {run.out}"),
        file=sys.stderr,
    )
    if tally.judged.get("not judged"):
        print(
            f"{tally.judged['not judged']} run(s) could not be judged (no expected answer: give --expected-file, or "
            "--verifier self) and were attributed as failures",
            file=sys.stderr,
        )
    return _exit_code(run)


def _exit_code(run: _Summary) -> int:
    """1, with the error said, when the batch stopped, every attribution failed, lines were skipped or an export
    failed; else 0."""
    kept = run.output.kept("record(s)") if run.output is not None else ""
    if run.stopped is not None:
        error = f"stopped after {run.tally.seen} of {run.total} trace(s): {run.stopped}; {kept}"
    elif run.output is not None and run.output.failure == "every attribution failed":
        error = f"every attribution failed (the causes are above); {kept}"
    elif run.skipped_lines:
        error = f"{run.skipped_lines} line(s) of {run.traces} were not traces and were skipped (see above); {kept}"
    elif run.tally.export_failures:
        print(
            f"exit 1: the records are in {run.out} but not every export succeeded (see above); fix the exporter's "
            "endpoint and re-run with --export to send them again",
            file=sys.stderr,
        )
        return 1
    else:
        return 0
    print(f"reflect-otel attribute: error: {error}", file=sys.stderr)
    return 1
