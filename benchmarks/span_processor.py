"""``on_end`` cost per span: ReflectSpanProcessor vs the SDK's BatchSpanProcessor with a no-op exporter.

Both get the same real, finished SDK spans; only the ``on_end`` calls are timed, in interleaved rounds.
Target: ratio at most 1.5. Last line: ``span_processor_on_end_ratio=R``.

``--flood-threads N`` instead times every root span's ``on_end`` while N threads end spans at once (the contention
an agent server sees) and prints, per processor, how many took over 1 ms, the p99 and the max.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from benchmarks._common import add_smoke_option, interleaved, smoke_sizes
from reflect_otel.collectors.span_processor import ReflectSpanProcessor
from reflect_otel.collectors.trace_collector import BufferLimits


class NoOpExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def finished_spans(count: int) -> list[ReadableSpan]:
    spans: list[ReadableSpan] = []

    class Keep(BatchSpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            spans.append(span)

    provider = TracerProvider()
    provider.add_span_processor(Keep(NoOpExporter()))
    tracer = provider.get_tracer("bench")
    per_trace = 20
    for _ in range(count // per_trace):
        with tracer.start_as_current_span("root", attributes={"openinference.span.kind": "AGENT"}):
            for i in range(per_trace - 1):
                with tracer.start_as_current_span("llm", attributes={"openinference.span.kind": "LLM", "i": i}):
                    pass
    return spans


def root_latencies(
    processor: BatchSpanProcessor | ReflectSpanProcessor, spans: list[ReadableSpan], threads: int
) -> list[int]:
    """Nanoseconds of each root span's ``on_end`` while ``threads`` threads each end all of ``spans`` at once."""
    latencies: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def end_all() -> None:
        own = []
        start.wait()
        for span in spans:
            before = time.perf_counter_ns()
            processor.on_end(span)
            if span.parent is None:
                own.append(time.perf_counter_ns() - before)
        with lock:
            latencies.extend(own)

    workers = [threading.Thread(target=end_all) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    processor.shutdown()
    return sorted(latencies)


def flood(spans: list[ReadableSpan], threads: int) -> None:
    queue = len(spans) * threads * 2
    for name, processor in (
        ("BatchSpanProcessor", BatchSpanProcessor(NoOpExporter(), max_queue_size=queue)),
        ("ReflectSpanProcessor", ReflectSpanProcessor(lambda trace: None, limits=BufferLimits(max_queue_size=queue))),
    ):
        latencies = root_latencies(processor, spans, threads)
        slow = sum(1 for ns in latencies if ns > 1_000_000)
        p99 = latencies[int(len(latencies) * 0.99)] / 1e6
        print(
            f"{name:<21} {threads} threads: {slow:,} of {len(latencies):,} root on_end calls over 1 ms; "
            f"p99 {p99:.3f} ms, max {latencies[-1] / 1e6:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--flood-threads", type=int, default=0)
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, spans=400, rounds=2)  # queues of 2 x spans: over the SDK's batch of 512
    if args.smoke:
        flood(finished_spans(args.spans), 2)
    elif args.flood_threads:
        flood(finished_spans(args.spans), args.flood_threads)
        return
    spans = finished_spans(args.spans)
    batch = BatchSpanProcessor(NoOpExporter(), max_queue_size=len(spans) * 2, schedule_delay_millis=50)
    ours = ReflectSpanProcessor(lambda trace: None, limits=BufferLimits(max_queue_size=len(spans) * 2))

    def timed(processor: BatchSpanProcessor | ReflectSpanProcessor) -> object:
        on_end = processor.on_end
        for span in spans:
            on_end(span)
        return None

    # flush between rounds outside the timed region so queues start empty each time
    results = interleaved(
        {
            "batch": lambda: (timed(batch), batch.force_flush()),
            "reflect": lambda: (timed(ours), ours.force_flush()),
        },
        args.rounds,
    )
    only_on_end = interleaved({"batch": lambda: timed(batch), "reflect": lambda: timed(ours)}, args.rounds)
    batch.force_flush()
    ours.force_flush()
    batch.shutdown()
    ours.shutdown()
    per_span = {name: seconds / len(spans) * 1e9 for name, seconds in only_on_end.items()}
    print(f"spans per round: {len(spans)}, rounds: {args.rounds}")
    print(f"BatchSpanProcessor.on_end:   {per_span['batch']:.0f} ns/span")
    print(f"ReflectSpanProcessor.on_end: {per_span['reflect']:.0f} ns/span")
    print(f"(including the flush each round: batch {results['batch']:.3f} s, reflect {results['reflect']:.3f} s)")
    ratio = per_span["reflect"] / per_span["batch"]
    print(f"target: ratio <= 1.5 -> {'met' if ratio <= 1.5 else 'NOT met'}")
    print(f"span_processor_on_end_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
