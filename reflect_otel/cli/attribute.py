"""``reflect-otel attribute``: attribute traces captured earlier (by ``collect`` or ``import``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from reflect_otel._values import utf8_text
from reflect_otel.cli._online import online_service
from reflect_otel.cli._options import add_pipeline_options, pipeline_config, positive_int
from reflect_otel.config import LLMConfig
from reflect_otel.datasets import BBM_TASKS
from reflect_otel.errors import ConfigError, InputError
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.budget import TokenBudget
from reflect_otel.methods import ATTRIBUTE_METHODS, llm_for, method_spec
from reflect_otel.online.work import AttributionWorker, WorkerStats
from reflect_otel.replay import ReplayAdapter, find_replay_adapter
from reflect_otel.replay_adapters.remote import load_replay_endpoints
from reflect_otel.service import AttributionService, ReplayFinder
from reflect_otel.store import open_exporter, open_store, store_path
from reflect_otel.trace import StructuredTrace
from reflect_otel.tracefile import EXPECTED_ANSWER_FIELD, good_trace_rows
from reflect_otel.verifiers import BBMVerifier, OracleVerifier, SelfVerifier, Verifier

__all__ = ["add_attribute_command"]


def add_attribute_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "attribute",
        help="find the decisive error step of failed traces (REFLECT or a baseline)",
        description=(
            "Attribute each trace of a JSONL file (from 'collect' or 'import') and write one AttributionRecord per "
            "line to -o. The LLM is REFLECT_LLM_BASE_URL/REFLECT_LLM_MODEL/REFLECT_LLM_API_KEY (or OPENAI_*), else "
            "the local llama.cpp server with REFLECT_LOCAL_MODEL (by default Qwen2.5-Coder-1.5B-Instruct). Traces an installed replay adapter can re-run get replay-verified "
            "attributions; the others are localization-only, and each record says so."
        ),
    )
    parser.add_argument("traces", type=Path, nargs="?", help="JSONL file of traces (or --pending)")
    parser.add_argument(
        "--pending",
        action="store_true",
        help="instead of a file, take the runs 'collect --attribute' left pending in the store: each is judged "
        "(against its expected answer, else by the plan-anchored proxy verifier), and attributed when flagged",
    )
    parser.add_argument(
        "--replay-config",
        type=Path,
        metavar="FILE",
        help="TOML file mapping each agent's service.name to its HTTP replay endpoint (see 'collect --help'); "
        "only these URLs are called, never one found in a trace",
    )
    parser.add_argument(
        "--method", choices=ATTRIBUTE_METHODS, default="reflect", help="attribution method (default reflect)"
    )
    expected = parser.add_mutually_exclusive_group()
    expected.add_argument(
        "--expected-field",
        default=EXPECTED_ANSWER_FIELD,
        help=f"key in each line holding the correct answer (default {EXPECTED_ANSWER_FIELD}, written by 'import')",
    )
    expected.add_argument("--expected-file", type=Path, help="JSON object or JSONL of {trace_id, expected_answer}")
    parser.add_argument(
        "--verifier",
        choices=("oracle", "bbm", "self"),
        default="oracle",
        help="oracle: match the expected answer; bbm: BIG-Bench-Mistake answers; self: an LLM judge",
    )
    parser.add_argument("--domain-context", default="", help="task description or table context for the prompts")
    parser.add_argument("--limit", type=positive_int, help="attribute at most N traces")
    add_pipeline_options(parser.add_argument_group("REFLECT's settings"))
    parser.add_argument("--withhold-expected", action="store_true", help="show [WITHHELD] instead of the answer")
    parser.add_argument(
        "-o", "--out", type=Path, help="JSONL file of records to write (replaced; required with a file)"
    )
    parser.add_argument(
        "--store", help="DuckDB file for traces, verdicts and records (default: REFLECT_STORE, then ./reflect.duckdb)"
    )
    parser.add_argument("--no-store", action="store_true", help="write only the -o file")
    parser.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="NAME",
        help="also send each record to: otlp (an EVALUATOR span, via OTEL_EXPORTER_OTLP_*) or phoenix (annotations, "
        "via PHOENIX_COLLECTOR_ENDPOINT); repeatable. A failed export is reported; the store keeps the record",
    )
    parser.set_defaults(handler=_attribute)


def _expected_answers(path: Path) -> dict[str, str]:
    if not path.is_file():
        raise InputError(f"{path}: no such file")
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
    endpoints = load_replay_endpoints(config)

    def find(trace: StructuredTrace, llm: StructuredLLM) -> ReplayAdapter | None:
        return endpoints(trace, llm) or find_replay_adapter(trace, llm)

    return find


def _dataset_context(trace: StructuredTrace) -> str:
    """The BIG-Bench-Mistake task a dataset trace came from, for the prompts' domain-context slot."""
    task = trace.metadata.get("task", "") if trace.metadata.get("dataset") == "bbm" else ""
    return f"{task}: {BBM_TASKS[task]}" if task in BBM_TASKS else ""


def _attribute_pending(args: argparse.Namespace) -> int:
    if args.traces is not None or args.no_store:
        raise ConfigError("--pending takes the runs waiting in the store: drop the trace file and --no-store")
    replays = load_replay_endpoints(args.replay_config) if args.replay_config is not None else None
    store = open_store(args.store)
    service = online_service(args, store, replays, verifier="proxy", budget=TokenBudget(10**12, 10**12))
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
        service.close()
    print(
        f"{stats.verified} pending run(s) judged in {time.monotonic() - started:.1f} s: {stats.flagged} flagged, "
        f"{stats.attributed} attributed ({stats.verified_attributions} verified); records in the store "
        f"{store_path(args.store)}",
        file=sys.stderr,
    )
    return 1 if stats.failed else 0


def _attribute(args: argparse.Namespace) -> int:
    if args.pending:
        return _attribute_pending(args)
    if args.traces is None or args.out is None:
        raise ConfigError("attribute needs a JSONL file of traces and -o FILE for the records (or --pending)")
    config = pipeline_config(args, include_expected_answer=False if args.withhold_expected else None)
    answers = _expected_answers(args.expected_file) if args.expected_file else {}
    bad_lines: list[InputError] = []

    def skipped(error: InputError) -> None:
        bad_lines.append(error)
        print(f"skipped: {error}", file=sys.stderr)

    rows = list(good_trace_rows(args.traces, extra_fields=(args.expected_field,), skipped=skipped))[: args.limit]
    if not rows:
        raise InputError(f"{args.traces}: no valid traces")
    spec = method_spec(args.method)
    llm = llm_for(spec, LLMConfig.from_env())
    verifier: Verifier
    if args.verifier == "self":
        verifier = SelfVerifier(llm, max_chars=config.max_field_chars, domain_context=args.domain_context)
    else:
        verifier = BBMVerifier() if args.verifier == "bbm" else OracleVerifier()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    service = AttributionService(
        llm,
        spec,
        verifier=verifier,
        config=config,
        store=None if args.no_store else open_store(args.store),
        exporters={name: open_exporter(name) for name in dict.fromkeys(args.export)},
        replay_finder=_replay_finder(args.replay_config),
    )
    export_failures: dict[str, int] = {}
    started = time.monotonic()
    counts: dict[str, int] = {}
    failed = 0
    with args.out.open("w", encoding="utf-8") as out:
        for number, row in enumerate(rows, start=1):
            expected = answers.get(row.trace.trace_id) or row.extras.get(args.expected_field)
            outcome = service.process(
                row.trace,
                expected=str(expected) if expected is not None else None,
                domain_context=args.domain_context or _dataset_context(row.trace),
            )
            record = outcome.record
            assert record is not None  # without triage every trace is attributed
            out.write(record.model_dump_json() + "\n")
            out.flush()
            for name, message in outcome.export_failures:
                export_failures[name] = export_failures.get(name, 0) + 1
                print(f"  export to {name} failed: {message}", file=sys.stderr)
            counts[record.status.value] = counts.get(record.status.value, 0) + 1
            failed += record.failed
            where = f"step {record.step_index}" if record.step_index else "no step"
            print(
                f"[{number}/{len(rows)}] {row.trace.trace_id[:12]} {record.status.value:<10} {where:<8} "
                f"{record.mode.value:<17} calls {record.total_calls:>3} tokens {record.total_tokens:>6}"
                + (f"  ({record.reason})" if record.reason else ""),
                file=sys.stderr,
            )
    service.close()
    for name, count in export_failures.items():
        print(f"{count} record(s) could not be exported to {name}", file=sys.stderr)
    if service.store is not None:
        print(f"written to the store {store_path(args.store)}", file=sys.stderr)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(
        f"{len(rows)} trace(s) in {time.monotonic() - started:.1f} s: {summary}"
        + (f" ({failed} failed: stage errors, no attribution)" if failed else "")
        + f"; records in {args.out}",
        file=sys.stderr,
    )
    if failed == len(rows):
        print(f"every attribution failed; the records in {args.out} say which stage and why", file=sys.stderr)
        return 1
    if bad_lines:
        print(
            f"exit 1: {len(bad_lines)} line(s) of {args.traces} were not traces and were skipped (see above)",
            file=sys.stderr,
        )
        return 1
    if export_failures:
        print(
            f"exit 1: the records are in {args.out} but not every export succeeded (see above); fix the exporter's "
            "endpoint and re-run with --export to send them again",
            file=sys.stderr,
        )
        return 1
    return 0
