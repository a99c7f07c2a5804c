"""Values a decoder chokes on (non-finite numbers, lone surrogates, times and token counts past int64) get an
answer, and the trace they arrive in is kept whole in every output: the JSONL line and the store."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import httpx
from opentelemetry.sdk.trace import TracerProvider

from reflect_otel.collectors.receiver import OTLPReceiver
from reflect_otel.collectors.span_processor import ReflectSpanProcessor
from reflect_otel.collectors.trace_collector import BufferLimits
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.reading.tracefile import TraceWriter
from reflect_otel.testing import TraceSink
from reflect_otel.testing.otlp_bodies import json_request, json_span
from reflect_otel.trace import StructuredTrace

TRACE = "5b8efff798038103d269b633813fc60c"
JSON = {"Content-Type": "application/json"}


def test_non_finite_numbers_huge_times_and_lone_surrogates_get_an_answer_and_keep_the_trace(tmp_path: Path) -> None:
    """Python's JSON reads Infinity, NaN and lone surrogates; none may stop the request or lose the trace."""
    root = json_span(TRACE, "a" * 16, None, "AGENT", 100, input__value="QUESTION", output__value="4")
    root["endTimeUnixNano"] = "1e27"  # past int64: the root is kept, its end unknown
    model = json_span(TRACE, "b" * 16, "a" * 16, "LLM", 110, llm__output_messages__0__message__content="4")
    model["attributes"] += [  # type: ignore[operator]
        {"key": "llm.token_count.prompt", "value": {"intValue": "1180591620717411303424"}},  # 2^70
        {"key": "score", "value": {"doubleValue": "NaN"}},
    ]
    negative = json_span(TRACE, "c" * 16, "a" * 16, "LLM", 120)
    negative["startTimeUnixNano"] = "-5"
    body = json.dumps(json_request(root, model, negative))
    body = body.replace('"endTimeUnixNano": "120"', '"endTimeUnixNano": Infinity').replace("QUESTION", "\\ud800?")
    sink = TraceSink()
    receiver = OTLPReceiver(sink, http=("127.0.0.1", 0), buffer_limits=BufferLimits(grace_s=0.0)).start()
    try:
        response = httpx.post(f"http://127.0.0.1:{receiver.http_port}/v1/traces", content=body, headers=JSON)
        assert receiver.force_flush(10_000)
    finally:
        receiver.shutdown(10_000)
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "startTimeUnixNano" in partial["errorMessage"]  # the negative start
    trace = sink.traces[TRACE]
    assert trace.question == "??" and [s.reasoning for s in trace.steps] == ["4"]
    assert trace.steps[0].prompt_tokens is None  # out of range: dropped, not stored as a 70-bit number
    json.dumps(trace.model_dump(mode="json"), allow_nan=False)  # a JSONL line any reader takes
    path = tmp_path / "store.duckdb"
    with DuckDBStore(path) as store:
        store.write_trace(trace)
    with duckdb.connect(str(path), read_only=True) as db:
        stored = db.execute("SELECT question, step_count FROM traces").fetchall()
    assert stored == [("??", 1)]


def test_a_scope_name_with_a_lone_surrogate_keeps_the_trace_in_both_outputs(tmp_path: Path) -> None:
    """The probe's finding: the scope name was the one text read without replacing lone surrogates; the trace was
    acknowledged, then lost at the JSONL writer and the store."""
    request = json_request(json_span(TRACE, "a" * 16, None, "AGENT", 100, input__value="q", output__value="a"))
    request["resourceSpans"][0]["scopeSpans"][0]["scope"]["name"] = "\ud800"  # type: ignore[index]
    out, path = tmp_path / "out.jsonl", tmp_path / "store.duckdb"
    with TraceWriter(out) as writer, DuckDBStore(path) as store:

        def sink(trace: StructuredTrace) -> None:
            writer.write(trace)
            store.write_trace(trace)

        receiver = OTLPReceiver(sink, http=("127.0.0.1", 0), buffer_limits=BufferLimits(grace_s=0.0)).start()
        try:
            body = json.dumps(request).encode("utf-8", "surrogatepass")
            response = httpx.post(f"http://127.0.0.1:{receiver.http_port}/v1/traces", content=body, headers=JSON)
            assert receiver.force_flush(10_000)
        finally:
            receiver.shutdown(10_000)
    assert response.status_code == 200
    assert [json.loads(line)["trace_id"] for line in out.read_text().splitlines()] == [TRACE]
    with duckdb.connect(str(path), read_only=True) as db:
        assert db.execute("SELECT trace_id FROM traces").fetchall() == [(TRACE,)]


def test_an_application_string_with_a_lone_surrogate_keeps_the_trace_in_process(tmp_path: Path) -> None:
    """In process, the SDK keeps whatever Python string the application sets: span name, attributes, events and
    scope are made writable on the collector's worker, and the trace reaches both outputs."""
    out, path = tmp_path / "out.jsonl", tmp_path / "store.duckdb"
    with TraceWriter(out) as writer, DuckDBStore(path) as store:

        def sink(trace: StructuredTrace) -> None:
            writer.write(trace)
            store.write_trace(trace)

        processor = ReflectSpanProcessor(sink, limits=BufferLimits(grace_s=0.0))
        provider = TracerProvider()
        provider.add_span_processor(processor)
        tracer = provider.get_tracer("scope \udc80")
        with tracer.start_as_current_span("agent \ud800") as root:
            root.set_attribute("openinference.span.kind", "AGENT")
            root.set_attribute("input.value", "what is \ud800?")
            root.set_attribute("tags", ["ok", "bad \udfff"])
            root.add_event("note \ud800", {"text": "\ud800"})
            with tracer.start_as_current_span("tool") as tool:
                tool.set_attribute("openinference.span.kind", "TOOL")
                tool.set_attribute("tool.name", "lookup")
                tool.set_attribute("output.value", "result \udc00 here")
            root.set_attribute("output.value", "done")
        assert processor.force_flush()
        processor.shutdown()
    (line,) = out.read_text().splitlines()
    trace = json.loads(line)
    assert trace["question"] == "what is ??" and trace["steps"][0]["tool_result"] == "result ? here"
    with duckdb.connect(str(path), read_only=True) as db:
        assert db.execute("SELECT question FROM traces").fetchall() == [("what is ??",)]
