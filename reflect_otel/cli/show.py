"""``reflect-otel show``: the steps of traces in a JSONL file, with their attributions."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from reflect_otel.errors import InputError, ReflectError
from reflect_otel.record import AttributionRecord
from reflect_otel.tracefile import EXPECTED_ANSWER_FIELD, good_trace_rows

__all__ = ["add_show_command"]


def add_show_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "show",
        help="print the steps of traces in a JSONL file",
        description="Print each trace of a JSONL file (from 'collect' or 'import') as a numbered list of steps.",
    )
    parser.add_argument("traces", help="JSONL file of traces")
    parser.add_argument("--trace-id", help="show only this trace")
    parser.add_argument(
        "--records", help="JSONL file of attribution records (from 'attribute') to show beside the steps"
    )
    parser.add_argument("--width", type=int, default=100, help="cut long text to this many characters (default 100)")
    parser.set_defaults(handler=_show)


def _cut(text: str | None, width: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: max(1, width - 1)] + "…"


def _read_records(path: str) -> dict[str, AttributionRecord]:
    records: dict[str, AttributionRecord] = {}
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = AttributionRecord.model_validate_json(line)
            except ValidationError as error:
                raise InputError(f"{path}:{number}: not an AttributionRecord ({error.errors()[0]['msg']})") from None
            records[record.trace_id] = record
    return records


def _show(args: argparse.Namespace) -> int:
    shown = 0
    records = _read_records(args.records) if args.records else {}
    bad: list[InputError] = []

    def skipped(error: InputError) -> None:
        bad.append(error)
        print(f"reflect-otel show: skipped: {error}", file=sys.stderr)

    for row in good_trace_rows(args.traces, extra_fields=(EXPECTED_ANSWER_FIELD,), skipped=skipped):
        trace = row.trace
        if args.trace_id and trace.trace_id != args.trace_id:
            continue
        shown += 1
        record = records.get(trace.trace_id)
        print(f"trace {trace.trace_id}  [{trace.source.framework}, {len(trace.steps)} steps]")
        print(f"  question: {_cut(trace.question, args.width)}")
        for step in trace.steps:
            action = f"{step.tool_name}({_cut(str(step.tool_args), args.width // 2)})" if step.tool_name else ""
            mark = ">>" if record is not None and record.step_index == step.index else "  "
            print(f"{mark}{step.index:>3}. {step.kind.value:<12} {action} {_cut(step.reasoning, args.width)}".rstrip())
            if step.tool_result:
                print(f"       -> {_cut(step.tool_result, args.width)}")
        print(f"  final answer: {_cut(trace.final_answer, args.width)}")
        for warning in trace.warnings:
            print(f"  warning [{warning.code.value}]: {warning.message}")
        for label in trace.labels:
            print(f"  label: step {label.step_index} {label.category}" + (f" ({label.impact})" if label.impact else ""))
        if record is not None:
            kind = record.error_type.value if record.error_type else "unknown error type"
            print(
                f"  attribution ({record.method}): {record.status.value}, step {record.step_index}, {kind}; "
                f"{record.total_calls} LLM calls, {record.total_tokens} tokens"
            )
            print(f"    confidence: {record.confidence_text}")
            if record.explanation:
                heading = "why" if record.status.value == "verified" else "hypothesis, not verified"
                print(f"    {heading}: {_cut(record.explanation, args.width)}")
            if record.reason:
                print(f"    note: {_cut(record.reason, args.width)}")
    if args.trace_id and not shown:
        raise ReflectError(f"no trace {args.trace_id} in {args.traces}")
    return 1 if bad else 0
