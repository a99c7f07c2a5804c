"""The collector path end to end: the real OTLP/HTTP exporter -> our receiver -> assembly -> JSONL file and DuckDB
store (what ``reflect-otel collect --store`` runs), against the receiver alone (the same spans, the same exporter,
a sink that only counts), timed in the same run. Target: the whole path at least 80% of the receiver-only rate.

``--soak-seconds N`` then runs the whole path at the measured rate for N seconds (600 for the 10-minute soak)
and prints the process's RSS at the start, its peak and at the end: flat means bounded memory.
Last line: ``collector_path_share=N`` (end-to-end spans/s over receiver-only spans/s).
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from xml.etree import ElementTree

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from benchmarks._common import add_smoke_option, smoke_sizes, synthetic_trace
from reflect_otel.collectors.receiver import OTLPReceiver
from reflect_otel.collectors.trace_collector import BufferLimits
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.reading.tracefile import TraceWriter
from reflect_otel.trace import StructuredTrace

_RESOURCE = Resource.create({"service.name": "collector-path-benchmark"})


def readable(record: SpanRecord, trace_offset: int) -> ReadableSpan:
    trace_id = int(record.trace_id, 16) + trace_offset
    context = SpanContext(trace_id, int(record.span_id, 16), is_remote=False, trace_flags=TraceFlags(1))
    parent = None
    if record.parent_id:
        parent = SpanContext(trace_id, int(record.parent_id, 16), is_remote=False, trace_flags=TraceFlags(1))
    return ReadableSpan(
        name=record.name,
        context=context,
        parent=parent,
        attributes=dict(record.attributes),
        start_time=record.start_ns + 1,
        end_time=(record.end_ns or record.start_ns) + 1,
        resource=_RESOURCE,
    )


def batches(count: int, per_request: int, trace_offset: int) -> list[list[ReadableSpan]]:
    spans = [readable(r, trace_offset) for n in range(count) for r in synthetic_trace(n, tool_calls=9)]
    per_trace = len(spans) // count
    step = per_request * per_trace
    return [spans[i : i + step] for i in range(0, len(spans), step)]


class Counting:
    """A sink that counts traces and can wait for a number of them."""

    def __init__(self, then: Callable[[StructuredTrace], None] | None = None) -> None:
        self.count = 0
        self._then = then
        self._changed = threading.Condition()

    def __call__(self, trace: StructuredTrace) -> None:
        if self._then is not None:
            self._then(trace)
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait_for(self, count: int, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count >= count, timeout_s)


def run_path(requests: list[list[ReadableSpan]], traces: int, sink: Counting, after: Callable[[], object]) -> float:
    """Seconds from the first export to the last trace through ``sink`` and ``after()`` (a flush)."""
    receiver = OTLPReceiver(
        sink, http=("127.0.0.1", 0), buffer_limits=BufferLimits(grace_s=0.0, max_traces=traces + 1)
    ).start()
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces", timeout=60)
    try:
        start = time.perf_counter()
        for batch in requests:
            assert exporter.export(batch) is SpanExportResult.SUCCESS
        receiver.force_flush(300_000)
        assert sink.wait_for(traces, 300), (sink.count, traces)
        after()
        return time.perf_counter() - start
    finally:
        exporter.shutdown()
        receiver.shutdown()


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def malloc_mib() -> tuple[float, float] | None:
    """glibc's heap over all its arenas (in use, free but kept) in MiB, from ``malloc_info(3)``; None where that
    is not available. (``mallinfo2`` would count the main arena only, and DuckDB's writer thread allocates from an
    arena of its own.) Free bytes that grow while in-use bytes stay flat mean fragmentation, not live data."""
    try:
        libc = ctypes.CDLL(None)
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        with tempfile.NamedTemporaryFile() as report:
            stream = libc.fopen(report.name.encode(), b"w")
            if not stream:
                return None
            libc.malloc_info(0, stream)
            libc.fclose(stream)
            totals = ElementTree.parse(report.name).getroot()  # glibc's own XML, not external input
    except (AttributeError, OSError, ElementTree.ParseError):
        return None
    sizes = {(e.tag, e.get("type")): int(e.get("size") or 0) for e in totals if e.tag in ("total", "system")}
    free = sizes.get(("total", "fast"), 0) + sizes.get(("total", "rest"), 0)
    in_use = sizes.get(("system", "current"), 0) - free + sizes.get(("total", "mmap"), 0)
    return in_use / 2**20, free / 2**20


def soak(folder: Path, seconds: float, traces_per_s: float, per_request: int) -> None:
    """The whole path at ``traces_per_s`` for ``seconds``; RSS sampled every second, and each minute a line with
    what was sent and stored, the store's backlog and glibc's heap, so that a rise can be told apart as backlog,
    live data or fragmentation."""
    requests = batches(per_request, per_request, trace_offset=0)[0]
    writer = TraceWriter(folder / "soak.jsonl")
    store = DuckDBStore(folder / "soak.duckdb")

    def write(trace: StructuredTrace) -> None:
        writer.write(trace)
        store.write_trace(trace)

    sink = Counting(write)
    receiver = OTLPReceiver(sink, http=("127.0.0.1", 0), buffer_limits=BufferLimits(grace_s=0.0)).start()
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces", timeout=60)
    samples = [rss_mib()]
    sent = 0
    start = time.monotonic()
    next_sample = start + 1

    def minute_line() -> None:
        heap = malloc_mib()
        duckdb_mib = store.memory_bytes() / 2**20
        held = f"heap in use {heap[0]:,.0f} MiB, free {heap[1]:,.0f} MiB" if heap else "heap: malloc_info not available"
        print(
            f"soak: {time.monotonic() - start:4.0f} s: RSS {samples[-1]:,.0f} MiB (peak this minute "
            f"{max(samples[-60:]):,.0f}); sent {sent:,}, assembled {sink.count:,}, stored {store.stats.traces:,}, "
            f"store queue {store.backlog:,}; DuckDB {duckdb_mib:,.0f} MiB, RSS less DuckDB {samples[-1] - duckdb_mib:,.0f} "
            f"MiB; {held}",
            flush=True,
        )

    try:
        while time.monotonic() - start < seconds:
            offset = (sent // per_request + 1) << 40  # fresh trace ids for every request
            batch = [_shifted(s, offset) for s in requests]
            assert exporter.export(batch) is SpanExportResult.SUCCESS
            sent += per_request
            ahead = sent / traces_per_s - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
            if time.monotonic() >= next_sample:
                samples.append(rss_mib())
                next_sample += 1
                if len(samples) % 60 == 1:
                    minute_line()
        receiver.force_flush(300_000)
        sink.wait_for(sent, 300)
        store.flush(300)
        samples.append(rss_mib())
        minute_line()
    finally:
        exporter.shutdown()
        receiver.shutdown()
        writer.close()
        store.close()
    print(
        f"soak: {seconds:.0f} s at {traces_per_s:,.0f} traces/s, {sent:,} traces sent, {sink.count:,} stored; "
        f"RSS start {samples[0]:,.0f} MiB, peak {max(samples):,.0f} MiB, end {samples[-1]:,.0f} MiB"
    )
    minutes = [f"{max(samples[i : i + 60]):,.0f}" for i in range(0, len(samples), 60)]
    print(f"soak: peak RSS per minute (MiB): {', '.join(minutes)}")


def _shifted(span: ReadableSpan, offset: int) -> ReadableSpan:
    """``span`` in another trace (its trace id plus ``offset``)."""
    context = span.context
    parent = span.parent
    assert context is not None
    return ReadableSpan(
        name=span.name,
        context=SpanContext(context.trace_id + offset, context.span_id, False, context.trace_flags),
        parent=None
        if parent is None
        else SpanContext(parent.trace_id + offset, parent.span_id, False, parent.trace_flags),
        attributes=span.attributes,
        start_time=span.start_time,
        end_time=span.end_time,
        resource=span.resource,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=int, default=3_000)
    parser.add_argument("--traces-per-request", type=int, default=50)
    parser.add_argument("--soak-seconds", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the medians are compared")
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, traces=20, traces_per_request=10, rounds=1, soak_seconds=1.0)
    receiver_only = batches(args.traces, args.traces_per_request, trace_offset=0)
    spans = sum(len(b) for b in receiver_only)
    alone_times: list[float] = []
    whole_times: list[float] = []
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for round_ in range(args.rounds):  # alternating, so drift on a noisy machine hits both alike
            alone_times.append(run_path(receiver_only, args.traces, Counting(), lambda: None))
            whole_path = batches(args.traces, args.traces_per_request, trace_offset=(round_ + 1) << 64)
            writer = TraceWriter(folder / f"out{round_}.jsonl")
            store = DuckDBStore(folder / f"store{round_}.duckdb")

            def write(trace: StructuredTrace, writer: TraceWriter = writer, store: DuckDBStore = store) -> None:
                writer.write(trace)
                store.write_trace(trace)

            whole_times.append(run_path(whole_path, args.traces, Counting(write), lambda s=store: s.flush(300)))
            writer.close()
            stored = store.stats.traces
            store.close()
            assert stored == args.traces, (stored, args.traces)
        alone, whole = statistics.median(alone_times), statistics.median(whole_times)
        print(
            f"{args.traces:,} traces, {spans:,} spans ({spans // args.traces} per trace), "
            f"{args.traces_per_request} traces per export; median of {args.rounds} interleaved rounds"
        )
        print(
            f"receiver only (exporter -> receiver -> assembly): {args.traces / alone:8,.0f} traces/s "
            f"{spans / alone:10,.0f} spans/s"
        )
        share = alone / whole
        print(
            f"whole path (... -> JSONL + DuckDB store):         {args.traces / whole:8,.0f} traces/s "
            f"{spans / whole:10,.0f} spans/s ({share:.0%} of receiver only)"
        )
        rounds = ", ".join(f"{a / w:.0%}" for a, w in zip(alone_times, whole_times, strict=True))
        print(f"per round (whole path against that round's receiver-only run): {rounds}")
        print(f"target: >= 80% of receiver only -> {'met' if share >= 0.8 else 'NOT met'}")
        if args.soak_seconds > 0:
            soak(folder, args.soak_seconds, args.traces / whole, args.traces_per_request)
    print(f"collector_path_share={share:.3f}")


if __name__ == "__main__":
    main()
