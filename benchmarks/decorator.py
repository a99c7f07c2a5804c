"""End-to-end agent overhead of ``reflect_otel.observe``: the same agent (a deterministic tool loop that emits
OpenInference LLM and TOOL spans) with and without the decorator, interleaved, both on the same tracer provider.
With the decorator every run is also assembled, verified and stored on the worker thread (an in-memory-size
DuckDB file in a temporary folder). Target: at most 5% slower. Last line: ``decorator_overhead_ratio=R``."""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

import reflect_otel
from benchmarks._common import add_smoke_option, interleaved, smoke_sizes
from reflect_otel.llm.factory import NoModel
from reflect_otel.reading.semconv import OpenInferenceSpanKindValues, SpanAttributes


def make_agent(provider: TracerProvider, turns: int, work: int):  # type: ignore[no-untyped-def]
    tracer = provider.get_tracer("bench.agent")
    kind = SpanAttributes.OPENINFERENCE_SPAN_KIND

    def model(messages: list[str]) -> str:  # deterministic "model": a hash chain standing in for inference
        digest = "".join(messages).encode()
        for _ in range(work):
            digest = hashlib.sha256(digest).digest()
        return digest.hex()[:16]

    def agent(question: str) -> str:
        messages = [question]
        for turn in range(turns):
            with tracer.start_as_current_span("llm", attributes={kind: OpenInferenceSpanKindValues.LLM.value}) as span:
                decision = model(messages)
                prefix = "llm.output_messages.0.message."
                span.set_attribute(prefix + "content", f"turn {turn}")
                span.set_attribute(prefix + "tool_calls.0.tool_call.id", f"c{turn}")
                span.set_attribute(prefix + "tool_calls.0.tool_call.function.name", "lookup")
                span.set_attribute(prefix + "tool_calls.0.tool_call.function.arguments", json.dumps({"key": decision}))
            with tracer.start_as_current_span(
                "lookup", attributes={kind: OpenInferenceSpanKindValues.TOOL.value, SpanAttributes.TOOL_NAME: "lookup"}
            ) as tool:
                result = model([decision])
                tool.set_attribute("tool_call.id", f"c{turn}")
                tool.set_attribute(SpanAttributes.OUTPUT_VALUE, result)
            messages += [decision, result]
        return messages[-1]

    return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200, help="agent runs per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--turns", type=int, default=5, help="tool-calling turns per run")
    parser.add_argument("--work", type=int, default=3000, help="hash iterations standing in for one model call")
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, runs=5, rounds=1, turns=2, work=10)
    provider = TracerProvider()
    plain = make_agent(provider, args.turns, args.work)
    with tempfile.TemporaryDirectory() as folder:
        runtime = reflect_otel.configure(  # no expected answer and no proxy: runs are stored, never judged
            store=str(Path(folder) / "bench.duckdb"),
            llm=NoModel(),
            tracer_provider=provider,
            proxy=False,
            max_queue=10_000,
        )
        observed = reflect_otel.observe(name="bench_agent")(make_agent(provider, args.turns, args.work))
        seconds = interleaved(
            {
                "plain": lambda: [plain(f"q{i}") for i in range(args.runs)],
                "observed": lambda: [observed(f"q{i}") for i in range(args.runs)],
            },
            args.rounds,
        )
        runtime.drain(120)
        stats = runtime.stats.as_dict()
        reflect_otel.shutdown()
    assert stats["worker_errors"] == 0 and stats["traces_verified"] == stats["runs"], stats
    ratio = seconds["observed"] / seconds["plain"]
    per_run = {k: v / args.runs * 1e3 for k, v in seconds.items()}
    print(
        f"{args.runs} runs x {args.rounds} rounds, {args.turns} turns each; per run: plain {per_run['plain']:.2f} ms, "
        f"observed {per_run['observed']:.2f} ms"
    )
    print(f"worker: {stats['traces_verified']} traces verified and stored, {stats['traces_dropped']} dropped")
    print(f"target: ratio <= 1.05 -> {'met' if ratio <= 1.05 else 'NOT met'}")
    print(f"decorator_overhead_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
