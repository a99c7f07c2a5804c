"""Assembly throughput on one core: 10,000 synthetic ReAct traces (12 spans each) through ``assemble_trace``.

The baseline, timed in the same run, is the least any assembler must do: group the spans by parent and sort
siblings by start time. Target: at least 50,000 spans/s. Last line: ``assembly_spans_per_s=N``.

``--scaling`` instead assembles one trace each of about 10, 1,000 and 100,000 spans and prints spans/s per size
beside the same baseline: a rate that falls no faster than the baseline's means cost grows as n log n at most.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from benchmarks._common import add_smoke_option, interleaved, smoke_sizes, synthetic_trace
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.spans import SpanRecord


def group_and_sort(traces: list[list[SpanRecord]]) -> None:
    for spans in traces:
        children: dict[str | None, list[SpanRecord]] = defaultdict(list)
        for span in spans:
            children[span.parent_id].append(span)
        for kids in children.values():
            kids.sort(key=lambda s: (s.start_ns, s.end_ns or 0))


def assemble_all(traces: list[list[SpanRecord]]) -> None:
    for spans in traces:
        assemble_trace(spans)


def scaling(rounds: int, sizes: tuple[int, ...] = (4, 499, 49_999), small_repeats: int = 1_000) -> None:
    """Spans/s for one trace of each size (``sizes``: tool calls, two spans each), a trace of up to 1,000 spans
    assembled ``small_repeats`` times per round; the last line is the largest trace's rate over the smallest's."""
    rates = []
    for tool_calls in sizes:
        trace = [synthetic_trace(0, tool_calls=tool_calls)]
        seconds = interleaved(
            {"baseline": lambda t=trace: group_and_sort(t), "assembly": lambda t=trace: assemble_all(t)},
            rounds if len(trace[0]) > 1_000 else rounds * small_repeats,
        )
        spans = len(trace[0])
        rate = spans / seconds["assembly"]
        rates.append(rate)
        print(
            f"{spans:>7,} spans: assemble_trace {rate:10,.0f} spans/s; "
            f"baseline {spans / seconds['baseline']:12,.0f} spans/s; "
            f"{seconds['assembly'] / seconds['baseline']:.1f}x the baseline's time"
        )
    print(f"assembly_scaling_largest_over_smallest={rates[-1] / rates[0]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scaling", action="store_true", help="one trace each of 10, 1,000 and 100,000 spans")
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, traces=20, rounds=1)
    if args.smoke:
        scaling(1, sizes=(4, 49), small_repeats=3)
    elif args.scaling:
        scaling(args.rounds)
        return
    traces = [synthetic_trace(n) for n in range(args.traces)]
    spans = sum(len(t) for t in traces)
    seconds = interleaved(
        {"baseline": lambda: group_and_sort(traces), "assembly": lambda: assemble_all(traces)}, args.rounds
    )
    rate = spans / seconds["assembly"]
    print(f"{args.traces} traces, {spans} spans, median of {args.rounds} rounds")
    print(f"baseline (group + sort): {spans / seconds['baseline']:,.0f} spans/s")
    slower = seconds["assembly"] / seconds["baseline"]
    print(f"assemble_trace:          {rate:,.0f} spans/s ({slower:.1f}x the baseline's time)")
    print(f"target: >= 50,000 spans/s -> {'met' if rate >= 50_000 else 'NOT met'}")
    print(f"assembly_spans_per_s={rate:.0f}")


if __name__ == "__main__":
    main()
