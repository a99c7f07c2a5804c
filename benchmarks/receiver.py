"""OTLP/HTTP protobuf receiver throughput: spans/s from request to assembled trace, over loopback.

The baseline, timed in the same run, decodes the same bodies in process (no HTTP, no assembly), so the ratio
shows what transport and assembly add. Last line: ``receiver_spans_per_s=N``.
"""

from __future__ import annotations

import argparse
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks._common import add_smoke_option, post_protobuf, smoke_sizes, synthetic_trace
from reflect_otel.collectors.otlp import decode_protobuf
from reflect_otel.collectors.receiver import OTLPReceiver
from reflect_otel.collectors.trace_collector import BufferLimits
from reflect_otel.reading.spans import SpanRecord


def encode(traces: list[list[SpanRecord]]) -> bytes:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for spans in traces:
        for record in spans:
            span = scope.spans.add(
                trace_id=bytes.fromhex(record.trace_id),
                span_id=bytes.fromhex(record.span_id),
                name=record.name,
                start_time_unix_nano=record.start_ns,
                end_time_unix_nano=record.end_ns or 0,
            )
            if record.parent_id:
                span.parent_span_id = bytes.fromhex(record.parent_id)
            for key, value in record.attributes.items():
                attribute = span.attributes.add(key=key)
                if isinstance(value, int):
                    attribute.value.int_value = value
                else:
                    attribute.value.string_value = str(value)
    return request.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=int, default=5_000)
    parser.add_argument("--traces-per-request", type=int, default=50)
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, traces=20, traces_per_request=10)
    traces = [synthetic_trace(n) for n in range(args.traces)]
    step = args.traces_per_request
    bodies = [encode(traces[i : i + step]) for i in range(0, len(traces), step)]
    spans = sum(len(t) for t in traces)

    start = time.perf_counter()
    for body in bodies:
        decode_protobuf(body)
    decode_seconds = time.perf_counter() - start

    done: list[str] = []
    receiver = OTLPReceiver(
        lambda trace: done.append(trace.trace_id),
        http=("127.0.0.1", 0),
        buffer_limits=BufferLimits(grace_s=0.0, max_traces=args.traces + 1),
    ).start()
    start = time.perf_counter()
    post_protobuf(receiver.http_port, bodies)
    receiver.force_flush(120_000)
    receive_seconds = time.perf_counter() - start
    receiver.shutdown()
    assert len(done) == args.traces, (len(done), args.traces)
    rate = spans / receive_seconds
    print(f"{args.traces} traces, {spans} spans in {len(bodies)} requests of {step} traces")
    print(f"baseline, protobuf decode in process: {spans / decode_seconds:,.0f} spans/s")
    slower = receive_seconds / decode_seconds
    print(f"receiver, HTTP -> decode -> assemble:  {rate:,.0f} spans/s ({slower:.1f}x the baseline's time)")
    print(f"receiver_spans_per_s={rate:.0f}")


if __name__ == "__main__":
    main()
