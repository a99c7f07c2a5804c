"""ReflectSpanProcessor: bounded under a multi-threaded burst, exact counters, a hot path that never raises."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider

from reflect_otel.collectors.span_processor import ReflectSpanProcessor
from reflect_otel.collectors.trace_collector import BufferLimits, TraceCollector
from reflect_otel.trace import StructuredTrace

THREADS = 8
SPANS_PER_THREAD = 12_500
SPANS_PER_TRACE = 10


def test_burst_of_100k_spans_from_8_threads_stays_bounded_and_counts_exactly() -> None:
    release = threading.Event()
    received: list[StructuredTrace] = []

    def slow_sink(trace: StructuredTrace) -> None:
        release.wait(30)  # the worker is stuck here while producers run, so the queue must fill and drop
        received.append(trace)

    limits = BufferLimits(max_queue_size=2_000, max_traces=20, max_spans_per_trace=8, grace_s=0.0)
    processor = ReflectSpanProcessor(slow_sink, limits=limits)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("burst")
    start = threading.Barrier(THREADS)

    def produce() -> None:
        start.wait()
        for _ in range(SPANS_PER_THREAD // SPANS_PER_TRACE):
            with tracer.start_as_current_span("root", attributes={"openinference.span.kind": "AGENT"}):
                for _ in range(SPANS_PER_TRACE - 1):
                    with tracer.start_as_current_span("llm", attributes={"openinference.span.kind": "LLM"}):
                        pass

    threads = [threading.Thread(target=produce) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    release.set()
    provider.shutdown()

    stats = processor.stats()
    total = THREADS * SPANS_PER_THREAD
    assert stats.spans_taken + stats.spans_dropped_queue_full == total
    assert stats.spans_dropped_queue_full > 0
    assert stats.spans_taken == (
        stats.spans_in_traces
        + stats.spans_dropped_trace_limit
        + stats.spans_dropped_span_limit
        + stats.spans_dropped_late
        + stats.spans_dropped_invalid
    )
    assert stats.spans_dropped_span_limit > 0  # 10 spans a trace, 8 kept
    # memory bounds: the queue overshoots by at most one span per producer thread; the buffer never exceeds its cap
    assert stats.peak_queue_depth <= limits.max_queue_size + THREADS
    assert stats.peak_buffered_spans <= limits.max_traces * limits.max_spans_per_trace
    assert stats.traces_assembled == len(received)
    assert stats.assembly_errors == stats.sink_errors == 0
    assert all(len(t.steps) <= limits.max_spans_per_trace for t in received)


def test_on_end_never_raises_and_bad_spans_are_counted() -> None:
    processor = ReflectSpanProcessor(lambda trace: None)
    processor.on_end(None)  # type: ignore[arg-type]
    processor.on_end(object())  # type: ignore[arg-type]
    assert processor.force_flush(5_000)
    assert processor.stats().spans_dropped_invalid == 2
    processor.shutdown()
    processor.on_end(None)  # after shutdown: dropped and counted, not raised
    assert processor.stats().spans_dropped_at_shutdown == 1


def test_failing_sink_is_counted_and_collection_goes_on() -> None:
    calls: list[str] = []

    def sink(trace: StructuredTrace) -> None:
        calls.append(trace.trace_id)
        raise RuntimeError("sink down")

    processor = ReflectSpanProcessor(sink, limits=BufferLimits(grace_s=0.0))
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for _ in range(3):
        with tracer.start_as_current_span("root"):
            pass
    assert processor.force_flush(5_000)
    assert len(calls) == 3 and processor.stats().sink_errors == 3
    provider.shutdown()


def test_unfinished_trace_is_written_at_shutdown_marked_incomplete() -> None:
    got: list[StructuredTrace] = []
    processor = ReflectSpanProcessor(got.append)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    root = tracer.start_span("root")  # never ended
    from opentelemetry.trace import set_span_in_context

    with tracer.start_as_current_span(
        "llm",
        context=set_span_in_context(root),
        attributes={"openinference.span.kind": "LLM", "output.value": "thinking"},
    ):
        pass
    assert processor.force_flush(5_000) and got == []  # flush does not cut a running trace short
    provider.shutdown()
    (trace,) = got
    assert [w.code.value for w in trace.warnings] == ["root_never_ended", "orphan_spans", "no_question"]
    assert processor.stats().traces_incomplete_at_shutdown == 1


def test_a_replay_fragment_whose_root_never_came_is_not_taken_for_a_run() -> None:
    """An exporter may deliver a replay's children before its root, and a collector may stop before the root
    comes: every span of a replay is marked, so the fragment is skipped as a replay, not attributed as a run."""
    from reflect_otel.reading.capture import captured
    from reflect_otel.reading.semconv import ReflectAttributes

    got: list[StructuredTrace] = []
    processor = ReflectSpanProcessor(got.append)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    with (
        captured(provider, "reflect.replay.test") as run,
        tracer.start_as_current_span("llm", attributes={"openinference.span.kind": "LLM"}),
    ):
        pass
    assert {r.attributes.get(ReflectAttributes.REPLAY) for r in run.records} == {True}
    provider.shutdown()
    assert got == [] and processor.stats().traces_skipped_replays == 1
    # the same replay as a receiver may see it: its children only, the root never delivered
    fragment = [r for r in run.records if not r.is_local_root]
    assert fragment
    collector = TraceCollector(got.append, convert=lambda record: record, collector_name="test")
    for record in fragment:
        collector.submit(record)
    collector.shutdown()
    assert got == [] and collector.stats().traces_skipped_replays == 1


def test_a_recorded_run_never_raises_its_own_error_in_place_of_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans that cannot be assembled leave the trace out and say why; the block's outcome stays its own."""
    from reflect_otel.errors import InputError
    from reflect_otel.reading import capture

    def broken(*args: object, **kwargs: object) -> StructuredTrace:
        raise InputError("no spans to assemble")

    monkeypatch.setattr(capture, "assemble_trace", broken)
    provider = TracerProvider()
    with capture.recorded_run(provider) as run:
        pass
    assert run.trace is None and run.error.endswith("InputError: no spans to assemble") and run.records
    with pytest.raises(KeyError, match="the run's own"), capture.recorded_run(provider) as crashed:
        raise KeyError("the run's own")
    assert crashed.trace is None and "could not be assembled" in crashed.error
    provider.shutdown()
