"""``reflect-otel show``: the steps of traces in a JSONL file, with their attributions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from reflect_otel.attribution._describe import confidence_text, error_type_text, labels_text, named_by, verdict_text
from reflect_otel.cli._options import SkippedLines
from reflect_otel.datasets.files import DATASET_FORMAT_NAMERS
from reflect_otel.errors import InputError, ReflectError
from reflect_otel.reading._files import check_input_file
from reflect_otel.reading.tracefile import good_trace_rows
from reflect_otel.record import AttributionRecord
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, ErrorLabel

__all__ = ["add_show_command"]


def add_show_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "show",
        help="print the steps of traces in a JSONL file",
        description="Print each trace of a JSONL file (from 'collect' or 'import') as a numbered list of steps.",
    )
    parser.add_argument("traces", type=Path, help="JSONL file of traces")
    parser.add_argument(
        "--trace-id", metavar="ID", help="show only this trace (a prefix is enough: every trace it starts is shown)"
    )
    parser.add_argument(
        "--records",
        type=Path,
        help="JSONL file of attribution records (from 'attribute') to show beside the steps",
    )
    parser.add_argument("--width", type=int, default=100, help="cut long text to this many characters (default 100)")
    parser.set_defaults(handler=_show)


def _cut(text: str | None, width: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: max(1, width - 1)] + "…"


def _read_records(path: Path) -> dict[str, AttributionRecord]:
    check_input_file(path, flag="--records", what="JSONL file of records", hint=_RECORDS_HINT)
    records: dict[str, AttributionRecord] = {}
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = AttributionRecord.model_validate_json(line)
            except ValidationError as error:
                first = error.errors()[0]
                if number == 1 and _looks_like_a_trace(line):
                    raise InputError(
                        f"--records {path}: this is a file of traces, not records; give it as the first argument "
                        "and the records from 'reflect-otel attribute -o' to --records"
                    ) from None
                raise InputError(
                    f"--records {path}:{number}: not an AttributionRecord ({first['msg']}); {_RECORDS_HINT}"
                ) from None
            records[record.trace_id] = record
    if not records:
        raise InputError(f"--records {path}: no records in it; {_RECORDS_HINT}")
    return records


_RECORDS_HINT = "write records with 'reflect-otel attribute TRACES.jsonl -o records.jsonl'"


def _looks_like_a_trace(line: bytes) -> bool:
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "steps" in data and "method" not in data


def _show(args: argparse.Namespace) -> int:
    shown = matched = 0
    records = _read_records(args.records) if args.records else {}
    skipped = SkippedLines("reflect-otel show: ")
    bad = skipped.errors
    rows = good_trace_rows(
        args.traces, extra_fields=(EXPECTED_ANSWER_FIELD,), skipped=skipped, namers=DATASET_FORMAT_NAMERS
    )
    for row in rows:
        trace = row.trace
        if args.trace_id and not trace.trace_id.startswith(args.trace_id):
            continue
        shown += 1
        record = records.get(trace.trace_id)
        matched += record is not None
        print(f"trace {trace.trace_id}  [{trace.source.framework}, {len(trace.steps)} steps]")
        print(f"  question: {_cut(trace.question, args.width)}")
        for step in trace.steps:
            action = f"{step.tool_name}({_cut(str(step.tool_args), args.width // 2)})" if step.tool_name else ""
            mark = ">>" if record is not None and record.step_index == step.index else "  "
            print(f"{mark}{step.index:>3}. {step.kind.value:<12} {action} {_cut(step.reasoning, args.width)}".rstrip())
            if step.tool_result:
                print(f"       -> {_cut(step.tool_result, args.width)}")
        print(f"  final answer: {_cut(trace.final_answer, args.width)}")
        expected = row.extras.get(EXPECTED_ANSWER_FIELD) or trace.metadata.get(EXPECTED_ANSWER_FIELD)
        if expected is not None:
            print(f"  expected answer: {_cut(str(expected), args.width)}")
        for warning in trace.warnings:
            print(f"  warning [{warning.code.value}]: {warning.message}")
        for label in trace.labels:
            where = f"step {label.step_index}" if label.step_index is not None else "no step"
            print(f"  label: {where} {label.category}" + (f" ({label.impact})" if label.impact else ""))
        if record is not None:
            _print_record(record, trace.labels, None if expected is None else str(expected), args.width)
    if args.trace_id and not shown:
        raise ReflectError(f"no trace id starts with {args.trace_id!r} in {args.traces}")
    if not shown and not bad:
        raise InputError(
            f"{args.traces}: no traces in it; write one with 'reflect-otel collect' or 'reflect-otel import'"
        )
    if records and not matched:
        print(f"reflect-otel show: none of the records in {args.records} is about a trace shown", file=sys.stderr)
    return 1 if bad else 0


def _print_record(record: AttributionRecord, labels: tuple[ErrorLabel, ...], expected: str | None, width: int) -> None:
    where = (
        f"step {record.step_index}, error type {error_type_text(record)}"
        if record.step_index is not None
        else "no step named"
    )
    print(
        f"  attribution ({record.method}): {record.status.value}, {where}; "
        f"{record.total_calls} model requests"
        + (f" ({record.agent_calls} the agent's)" if record.agent_calls else "")
        + f", {record.total_tokens} tokens"
    )
    print(f"    run: {verdict_text(record.original_verdict, expected)}")
    compared = labels_text(labels, record.step_index)
    if compared:
        print(f"    labels: {compared}")
    print(f"    confidence: {confidence_text(record)}")
    if record.explanation:
        heading = "why" if record.status.value == "verified" else f"hypothesis of {named_by(record)}, not verified"
        print(f"    {heading}: {_cut(record.explanation, width)}")
    if record.reason:
        print(f"    note: {_cut(record.reason, width)}")
