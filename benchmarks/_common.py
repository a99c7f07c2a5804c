"""Shared helpers: interleaved timing rounds (these machines are noisy), a synthetic agent workload, the failing
BIG-Bench-Mistake traces and call summaries of the local-server benchmarks, and ``--smoke`` (every script's mode
that checks it still runs: a few traces in seconds, the local model replaced by a scripted double)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.datasets import DatasetItem, read_bbm
from reflect_otel.datasets.bbm import BBMVerifier
from reflect_otel.demo.examples import example_path
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.record import AttributionRecord, LLMCall
from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter
from reflect_otel.testing import ScriptedLLM, ScriptedRequest

RESULTS = Path(__file__).resolve().parent / "results"
"""Measured runs kept in the repository (``benchmarks/results``)."""


def add_smoke_option(parser: argparse.ArgumentParser) -> None:
    """``--smoke``: the script on a few traces in seconds, with a scripted model where it would call one. It checks
    that the script still runs against the package as it is (``tests/test_benchmarks.py`` runs every script so);
    its figures are not measurements."""
    parser.add_argument(
        "--smoke", action="store_true", help="a few traces in seconds, to check the script runs (no measurement)"
    )


def smoke_sizes(args: argparse.Namespace, **sizes: Any) -> None:
    """Under ``--smoke``, set each option named in ``sizes`` to its small value (and say so on stderr)."""
    if args.smoke:
        for name, value in sizes.items():
            setattr(args, name, value)
        print("--smoke: a check that the script runs; its figures are not measurements", file=sys.stderr)


def median_seconds(run: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def interleaved(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds per run name, alternating the runs each round so drift hits them alike."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def synthetic_trace(trace_number: int, tool_calls: int = 5) -> list[SpanRecord]:
    """A ReAct-shaped trace: an AGENT root, then per turn an LLM span with one tool call and its TOOL span,
    then a final LLM answer; attributes as OpenInference writes them."""
    trace_id = f"{trace_number + 1:032x}"
    root_id = f"{(trace_number << 8) + 1:016x}"
    spans = [
        SpanRecord(
            trace_id=trace_id,
            span_id=root_id,
            parent_id=None,
            name="agent",
            start_ns=0,
            end_ns=10**9,
            attributes={"openinference.span.kind": "AGENT", "input.value": "What is the answer?", "output.value": "42"},
        )
    ]
    for turn in range(tool_calls + 1):
        llm_id = f"{(trace_number << 8) + 2 + 2 * turn:016x}"
        attributes: dict[str, object] = {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-test",
            "llm.token_count.prompt": 500,
            "llm.token_count.completion": 40,
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.content": "What is the answer?",
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.content": f"Thinking about step {turn}.",
            "input.value": json.dumps({"messages": [{"role": "user", "content": "What is the answer?"}]}),
        }
        if turn < tool_calls:
            prefix = "llm.output_messages.0.message.tool_calls.0.tool_call."
            attributes |= {
                prefix + "id": f"call_{turn}",
                prefix + "function.name": "search",
                prefix + "function.arguments": json.dumps({"query": f"q{turn}"}),
            }
        spans.append(
            SpanRecord(
                trace_id=trace_id,
                span_id=llm_id,
                parent_id=root_id,
                name="llm",
                start_ns=10 * turn + 1,
                end_ns=10 * turn + 2,
                attributes=attributes,  # type: ignore[arg-type]
            )
        )
        if turn < tool_calls:
            spans.append(
                SpanRecord(
                    trace_id=trace_id,
                    span_id=f"{(trace_number << 8) + 3 + 2 * turn:016x}",
                    parent_id=root_id,
                    name="search",
                    start_ns=10 * turn + 3,
                    end_ns=10 * turn + 4,
                    attributes={
                        "openinference.span.kind": "TOOL",
                        "tool.name": "search",
                        "tool_call.id": f"call_{turn}",
                        "output.value": f"result {turn}",
                    },
                )
            )
    return spans


def post_protobuf(port: int, bodies: list[bytes]) -> None:
    """POST each OTLP protobuf body to ``127.0.0.1:port/v1/traces`` on one connection; every answer must be 200."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        for body in bodies:
            connection.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
    finally:
        connection.close()


def add_bbm_workload_options(parser: argparse.ArgumentParser) -> None:
    """``--data`` and ``--traces``: the failing BIG-Bench-Mistake traces a local-server benchmark attributes."""
    parser.add_argument("--data", type=Path, help="a BIG-Bench-Mistake .jsonl (default: the example shipped)")
    parser.add_argument("--traces", type=int, default=2)


def bbm_workload(args: argparse.Namespace) -> list[DatasetItem]:
    """The first ``--traces`` failing traces of ``--data``; exits naming the file when it has none."""
    path = args.data or example_path("bbm/multistep_arithmetic.jsonl")
    items = failing_bbm_items(path, args.traces)
    if not items:
        raise SystemExit(f"{path}: no failing traces")
    return items


def failing_bbm_items(path: Path, count: int) -> list[DatasetItem]:
    """The first ``count`` traces of a BIG-Bench-Mistake file whose answer is wrong."""
    items = [i for i in read_bbm(path) if not BBMVerifier().verify(i.trace, expected=i.expected).is_correct]
    return items[:count]


def attribute_replaying(
    pipeline: ReflectPipeline, llm: StructuredLLM, items: list[DatasetItem], label: str
) -> list[AttributionRecord]:
    """REFLECT on each item, its chain of thought replayed by ``llm``, a progress line per item on stderr."""
    records = []
    for item in items:
        started = time.perf_counter()
        record = pipeline.attribute(
            item.trace,
            expected=item.expected,
            replay=ReasoningReplayAdapter(llm, task_context=item.domain_context),
            domain_context=item.domain_context,
        )
        print(
            f"  {label}: {item.trace.trace_id[:12]} {record.status.value} in {time.perf_counter() - started:.0f} s, "
            f"{record.total_calls} auditor calls",
            file=sys.stderr,
            flush=True,
        )
        records.append(record)
    return records


def call_summary(records: list[AttributionRecord]) -> tuple[float, float, int]:
    """(cached share of prompt tokens, median seconds, count) over the records' successful calls."""
    calls = [c for r in records for c in r.llm_calls if c.ok]
    prompt = sum(c.prompt_tokens for c in calls)
    cached = sum(c.cached_prompt_tokens or 0 for c in calls)
    return (cached / prompt if prompt else float("nan")), statistics.median(c.seconds for c in calls), len(calls)


def per_stage_lines(records: list[AttributionRecord]) -> list[str]:
    """One line per stage: calls, mean prompt and completion tokens, cached share, median seconds (where the time
    goes: a cached prefix saves prompt evaluation, never generation)."""
    stages: dict[str, list[LLMCall]] = {}
    for call in (c for r in records for c in r.llm_calls if c.ok):
        stages.setdefault(call.stage, []).append(call)
    lines = []
    for stage, calls in stages.items():
        prompt = sum(c.prompt_tokens for c in calls)
        cached = sum(c.cached_prompt_tokens or 0 for c in calls)
        lines.append(
            f"  {stage:<16} {len(calls):>3} calls  prompt {prompt / len(calls):>6.0f}  "
            f"completion {sum(c.completion_tokens for c in calls) / len(calls):>5.0f}  "
            f"cached {cached / prompt if prompt else 0:>4.2f}  median {statistics.median(c.seconds for c in calls):>6.2f} s"
        )
    return lines


_ANCHORS = {
    "hard": {"entities": ["answer"], "filters": [], "target_property": "value", "operation": "lookup",
             "output_form": "a number"},
    "plans": [{"subgoals": ["search", "answer"]}],
}  # fmt: skip


def scripted_reply(request: ScriptedRequest) -> Any:
    """A scripted model's reply to every stage the benchmarks reach, at once: REFLECT and the baselines localize
    the middle step and their replays never flip the outcome (the worst case for the replay methods); the proxy
    verifier's audit calls every macro-step aligned (runs judged correct, as most are); the table agent answers at
    its first turn."""
    steps = request.text.count("\nStep ") or 1
    found = {"error_step": 1, "responsible_agent": None, "reason": "r", "error_type": "goal_deviation",
             "confidence": 0.5}  # fmt: skip
    replies: dict[str, Any] = {
        "localize": {
            "error_step": max(1, steps // 2),
            "confidence": 0.6,
            "reasoning": "r",
            "what_should_have_been_done": "w",
        },
        "classify": {
            "error_type": "incorrect_problem_identification",
            "confidence": 0.6,
            "explanation": "e",
            "suggested_correction": "s",
        },
        "diagnose": {
            "root_cause": "r",
            "correction_instruction": "recompute carefully",
            "corrected_thought": "Recompute the sum term by term.",
            "forbidden_actions": ["guess"],
            "expected_next_tool": None,
            "confidence": 0.6,
        },
        "gate": {"is_faithful": True, "violation_reason": None, "violation_type": None},
        "explain": {"reasoning": "r", "error_type": "incorrect_problem_identification", "explanation": "e"},
        "aao": found,
        "reflexion_extract": found,
        "sbs": {"is_error": False, "reason": "r"},
        "bs": {"half": "first", "reason": "r"},
        "bs_reason": {"reason": "r", "error_type": "goal_deviation", "confidence": 0.5},
        "reflect": {"reflection": "I should have recomputed."},
        "dover_hypotheses": {
            "hypotheses": [
                {"step": 1, "hypothesis": "h", "intervention": "i"},
                {"step": 2, "hypothesis": "h", "intervention": "i"},
            ]
        },
        "agent_replay": {"steps": ["Recomputing.", "Still the same."], "answer": "999999"},
        "agent": {"thought": "t", "action": {"tool": "final_answer", "answer": "unknown"}},
        "proxy_anchors": _ANCHORS,
    }
    if request.stage == "proxy_audit":
        shown = [int(line.split()[1]) for line in request.text.splitlines() if line.startswith("Macro-step ")]
        return {
            "steps": [
                {"macro_step": i, "category": "Aligned", "severity": "minor", "anchor": "hard", "rationale": "ok"}
                for i in shown
            ]
        }
    return replies[request.stage]


def scripted_llm() -> ScriptedLLM:
    """A scripted model answering every stage with :func:`scripted_reply` (no model time)."""
    return ScriptedLLM(respond=scripted_reply)
