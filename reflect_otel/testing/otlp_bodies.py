"""Valid OTLP bodies to mutate, the mutations (seeded) that the fuzz and flood tests send, and flood bodies."""

from __future__ import annotations

import gzip
import json
import random

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

WEIRD_JSON_VALUES = (
    "Infinity",
    "-Infinity",
    "NaN",
    "1e400",
    "-1",
    "1e27",
    str(2**70),
    '"\\ud800"',
    '"\\udfff\\ud800"',
    "null",
    "[]",
    "{}",
    '"' + "x" * 10_000 + '"',
    "[" * 5_000 + "]" * 5_000,
)


def trace_id(number: int) -> str:
    return f"{number:032x}"


def json_trace(number: int, *, steps: int = 3, text: str = "ok") -> dict[str, object]:
    """An OTLP/JSON request holding one whole trace: an AGENT root and ``steps`` TOOL children."""
    spans: list[dict[str, object]] = [
        {
            "traceId": trace_id(number),
            "spanId": f"{1:016x}",
            "name": "agent",
            "startTimeUnixNano": "1000",
            "endTimeUnixNano": "9000",
            "attributes": [
                {"key": "openinference.span.kind", "value": {"stringValue": "AGENT"}},
                {"key": "input.value", "value": {"stringValue": f"question {number}"}},
                {"key": "output.value", "value": {"stringValue": "answer"}},
            ],
        }
    ]
    for step in range(steps):
        spans.append(
            {
                "traceId": trace_id(number),
                "spanId": f"{step + 2:016x}",
                "parentSpanId": f"{1:016x}",
                "name": "tool",
                "startTimeUnixNano": str(2000 + step * 100),
                "endTimeUnixNano": str(2050 + step * 100),
                "attributes": [
                    {"key": "openinference.span.kind", "value": {"stringValue": "TOOL"}},
                    {"key": "tool.name", "value": {"stringValue": f"tool_{step}"}},
                    {"key": "output.value", "value": {"stringValue": text}},
                    {"key": "llm.token_count.prompt", "value": {"intValue": "12"}},
                ],
            }
        )
    return {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "fuzz"}, "spans": spans}]}]}


def proto_trace(number: int, *, steps: int = 3, text: str = "ok") -> bytes:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    root = scope.spans.add(trace_id=bytes.fromhex(trace_id(number)), span_id=(1).to_bytes(8, "big"), name="agent")
    root.start_time_unix_nano, root.end_time_unix_nano = 1000, 9000
    for key, value in (("openinference.span.kind", "AGENT"), ("input.value", f"question {number}")):
        root.attributes.add(key=key).value.string_value = value
    for step in range(steps):
        span = scope.spans.add(
            trace_id=root.trace_id, span_id=(step + 2).to_bytes(8, "big"), parent_span_id=root.span_id, name="tool"
        )
        span.start_time_unix_nano, span.end_time_unix_nano = 2000 + step * 100, 2050 + step * 100
        for key, value in (("openinference.span.kind", "TOOL"), ("tool.name", f"tool_{step}"), ("output.value", text)):
            span.attributes.add(key=key).value.string_value = value
    return bytes(request.SerializeToString())


def mutate_bytes(rng: random.Random, original: bytes) -> bytes:
    """One of: flip bytes, truncate, insert random bytes, duplicate a slice, zero a run."""
    data = bytearray(original)
    kind = rng.randrange(5)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del data[rng.randrange(len(data)) :]
    elif kind == 2:
        at = rng.randrange(len(data))
        data[at:at] = rng.randbytes(rng.randint(1, 32))
    elif kind == 3:
        start = rng.randrange(len(data))
        data[start:start] = data[start : start + rng.randint(1, 200)]
    else:
        start = rng.randrange(len(data))
        data[start : start + rng.randint(1, 16)] = b"\0" * 16
    return bytes(data)


def mutate_json(rng: random.Random, number: int) -> bytes:
    """A JSON request with one value replaced by something OTLP/JSON decoders choke on, or bytes-mutated."""
    text = json.dumps(json_trace(number))
    if rng.random() < 0.5:
        return mutate_bytes(rng, text.encode())
    targets = ['"1000"', '"9000"', '"12"', '"ok"', '"AGENT"', f'"{trace_id(number)}"', '"fuzz"', "[{"]
    target = rng.choice(targets)
    return text.replace(target, rng.choice(WEIRD_JSON_VALUES), 1).encode("utf-8", "surrogatepass")


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1)


def json_span(trace: str, span_id: str, parent: str | None, kind: str, start: int, **attrs: str) -> dict[str, object]:
    """One hand-made OTLP/JSON span of OpenInference ``kind``, ending 10 ns after ``start``; ``attrs`` are string
    attributes whose ``__`` stands for a dot (``input__value`` is ``input.value``)."""
    attributes = [{"key": "openinference.span.kind", "value": {"stringValue": kind}}]
    attributes += [{"key": k.replace("__", "."), "value": {"stringValue": v}} for k, v in attrs.items()]
    span: dict[str, object] = {
        "traceId": trace,
        "spanId": span_id,
        "name": kind.lower(),
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 10),
        "attributes": attributes,
        "status": {"code": 1},
    }
    if parent:
        span["parentSpanId"] = parent
    return span


def json_request(*spans: dict[str, object]) -> dict[str, object]:
    """An OTLP/JSON export request holding ``spans`` in one scope."""
    return {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "hand"}, "spans": list(spans)}]}]}


def wrong_run_body(number: int, *, answer: str = "Lyon") -> bytes:
    """An OTLP/JSON body of one finished run that answered ``answer`` ('Lyon', wrong) where its root says 'Paris'
    is expected: an AGENT root and one TOOL span, trace id ``number + 1``."""
    trace = f"{number + 1:032x}"
    root = json_span(trace, f"{number + 1:016x}", None, "AGENT", 1, input__value=f"capital {number}?",
                     output__value=answer, reflect__expected_answer="Paris")  # fmt: skip
    tool = json_span(trace, f"{number + 1:08x}{2:08x}", f"{number + 1:016x}", "TOOL", 2, tool__name="lookup",
                     output__value=answer)  # fmt: skip
    return json.dumps(json_request(root, tool)).encode()


def huge_spans_body(trace: int, spans: int, attribute_bytes: int) -> bytes:
    """A gzip protobuf request of ``spans`` children of a root that is never sent (the trace stays
    buffered), each with an ``output.value`` of ``attribute_bytes``: what a memory flood sends."""
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for n in range(spans):
        span = scope.spans.add(
            trace_id=bytes.fromhex(trace_id(trace)),
            span_id=(n + 2).to_bytes(8, "big"),
            parent_span_id=(1).to_bytes(8, "big"),
            name="tool",
        )
        span.start_time_unix_nano, span.end_time_unix_nano = 10 + n, 20 + n
        span.attributes.add(key="output.value").value.string_value = chr(65 + n % 26) * attribute_bytes
    return gzip.compress(request.SerializeToString(), compresslevel=1)
