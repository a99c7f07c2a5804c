"""Seeded fuzzing of the receiver over HTTP and gRPC: a few thousand mutated OTLP bodies, every one answered
with a status that names the client's fault (never a 5xx, a reset or a hang), and valid traces sent afterwards
arrive whole."""

from __future__ import annotations

import json
import random
from collections import Counter

import grpc
import httpx
import pytest

from reflect_otel.collectors.receiver import OTLPReceiver
from reflect_otel.collectors.trace_collector import BufferLimits
from reflect_otel.testing import TraceSink
from reflect_otel.testing.otlp_bodies import gzipped, json_trace, mutate_bytes, mutate_json, proto_trace, trace_id

SEED = 20261122
HTTP_BODIES = 1_500
GRPC_BODIES = 1_500
CLIENT_FAULTS = {200, 400, 413, 415}
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


@pytest.mark.slow
def test_mutated_bodies_get_client_fault_answers_and_valid_traces_still_arrive_whole() -> None:
    rng = random.Random(SEED)
    sink = TraceSink()
    receiver = OTLPReceiver(
        sink, http=("127.0.0.1", 0), grpc_endpoint=("127.0.0.1", 0), buffer_limits=BufferLimits(grace_s=0.0)
    ).start()
    tally: Counter[str] = Counter()
    statuses: Counter[object] = Counter()
    try:
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        with httpx.Client(timeout=30) as client:
            for n in range(HTTP_BODIES):
                number = 1_000_000 + n
                choice = rng.randrange(4)
                if choice == 0:
                    body, headers = mutate_json(rng, number), {"Content-Type": "application/json"}
                elif choice == 1:
                    body, headers = mutate_bytes(rng, proto_trace(number)), {"Content-Type": "application/x-protobuf"}
                elif choice == 2:  # a corrupted or cut gzip stream around a valid body
                    zipped = mutate_bytes(rng, gzipped(proto_trace(number)))
                    body = zipped
                    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
                else:  # a valid gzip stream around a mutated body
                    body = gzipped(mutate_json(rng, number))
                    headers = {"Content-Type": "application/json", "Content-Encoding": rng.choice(["gzip", "x-gzip"])}
                tally["tried"] += 1
                try:
                    response = client.post(url, content=body, headers=headers)
                except httpx.TimeoutException:
                    tally["hangs"] += 1
                    continue
                except httpx.TransportError:
                    tally["dropped without an answer"] += 1
                    continue
                statuses[response.status_code] += 1
                if response.status_code >= 500:
                    tally["crashes (5xx)"] += 1
                elif response.status_code not in CLIENT_FAULTS:
                    tally["wrong status"] += 1
        with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            export = channel.unary_unary(EXPORT)
            for n in range(GRPC_BODIES):
                tally["tried"] += 1
                try:
                    export(mutate_bytes(rng, proto_trace(2_000_000 + n)), timeout=30)
                    statuses["grpc OK"] += 1
                except grpc.RpcError as error:
                    code = error.code()  # type: ignore[attr-defined]
                    statuses[f"grpc {code.name}"] += 1
                    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                        tally["hangs"] += 1
                    elif code is not grpc.StatusCode.INVALID_ARGUMENT:
                        tally["wrong status"] += 1
            # afterwards, valid traces over both transports arrive whole
            for n in range(10):
                response = httpx.post(
                    url, content=json.dumps(json_trace(n + 1)), headers={"Content-Type": "application/json"}
                )
                assert response.status_code == 200
                export(proto_trace(n + 101), timeout=30)
        assert receiver.force_flush(30_000)
    finally:
        receiver.shutdown(30_000)
    print(f"\nfuzz: {dict(tally)}; statuses {dict(statuses)}")
    for n in [*range(1, 11), *range(101, 111)]:
        trace = sink.traces.get(trace_id(n))
        whole = trace is not None and trace.question == f"question {n}"
        if not whole or [s.tool_name for s in trace.steps] != ["tool_0", "tool_1", "tool_2"]:  # type: ignore[union-attr]
            tally["valid traces lost or cut"] += 1
    assert tally["tried"] == HTTP_BODIES + GRPC_BODIES
    problems = {k: v for k, v in tally.items() if k != "tried"}
    assert problems == {}, problems
    assert statuses[400] > 0 and statuses["grpc INVALID_ARGUMENT"] > 0  # the mutations did reach the decoders
