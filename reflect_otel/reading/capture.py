"""The trace of a run just made, in process: :func:`recorded_run` runs a block (an agent run) under a fresh root span
on the tracer provider the agent's instrumentation writes to, and assembles the spans it produced into a
:class:`~reflect_otel.trace.StructuredTrace`, for a user's own evaluation or a replay adapter's continuation.

One span processor per provider keeps the spans of the traces being watched (and nothing else), so the block's
spans are taken whole even while other traces run on the provider.

Example::

    with recorded_run(provider, "my_agent") as run:
        answer = agent(question)
    trace = run.trace  # steps, question, final answer (also when the block raised)
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.trace import format_trace_id, use_span

from reflect_otel.errors import ConfigError, ReplayError
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.semconv import OpenInferenceSpanKindValues, ReflectAttributes, SpanAttributes
from reflect_otel.reading.spans import SpanRecord, span_record_from_readable
from reflect_otel.trace import StructuredTrace

__all__ = ["Captured", "captured", "recorded_run"]

_log = logging.getLogger("reflect_otel.reading.capture")


class _SpanCapture(SpanProcessor):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, list[ReadableSpan]] = {}
        self._marked: set[int] = set()

    def watch(self, trace_id: int, *, mark_replay: bool) -> None:
        with self._lock:
            self._watched[trace_id] = []
            if mark_replay:
                self._marked.add(trace_id)

    def take(self, trace_id: int) -> list[ReadableSpan]:
        with self._lock:
            self._marked.discard(trace_id)
            return self._watched.pop(trace_id, [])

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        # Every span of a replay carries the mark, not only its root: an exporter may send the children before
        # the root (or the root not at all), and a collector must not take such a fragment for an application run.
        context = span.context
        if context is not None and context.trace_id in self._marked:
            span.set_attribute(ReflectAttributes.REPLAY, True)

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None:
            return
        with self._lock:
            spans = self._watched.get(context.trace_id)
            if spans is not None:
                spans.append(span)


_captures: weakref.WeakKeyDictionary[TracerProvider, _SpanCapture] = weakref.WeakKeyDictionary()
_captures_lock = threading.Lock()


def _capture_for(provider: TracerProvider) -> _SpanCapture:
    with _captures_lock:
        capture = _captures.get(provider)
        if capture is None:
            capture = _captures[provider] = _SpanCapture()
            provider.add_span_processor(capture)
        return capture


@dataclass
class Captured:
    """Filled in when the ``with`` block ends, whether it returned or raised: the spans it produced and the trace they
    assemble into (None, with ``error`` saying why, when they could not be assembled)."""

    records: list[SpanRecord] = field(default_factory=list)
    trace: StructuredTrace | None = None
    trace_id: str = ""
    error: str = ""


@contextmanager
def captured(provider: TracerProvider, name: str, *, replay: bool = True) -> Iterator[Captured]:
    """Run the block under a new root span (a new trace, not a child of the caller's) on ``provider``, which must
    be the provider the agent's instrumentation writes to; then assemble the spans of that trace, also when the block
    raised (its exception then goes on, unchanged). ``replay`` marks every span of the trace ``reflect.replay`` (our
    collectors skip traces holding such a span). Assembling never raises: a failure leaves ``trace`` None and says
    why in ``error``."""
    if not isinstance(provider, TracerProvider):
        error = ReplayError if replay else ConfigError
        raise error(
            f"{'replay' if replay else 'recording a run'} needs the SDK TracerProvider "
            "(opentelemetry.sdk.trace.TracerProvider) the agent's OpenInference instrumentation writes to"
        )
    capture = _capture_for(provider)
    tracer = provider.get_tracer("reflect_otel.replay")
    result = Captured()
    root = tracer.start_span(
        name,
        context=Context(),
        attributes={
            SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.CHAIN.value,
            ReflectAttributes.REPLAY: replay,
        },
    )
    trace_id = root.get_span_context().trace_id
    result.trace_id = format_trace_id(trace_id)
    capture.watch(trace_id, mark_replay=replay)
    try:
        with use_span(root, end_on_exit=True):
            yield result
    finally:  # a run that crashed is the run a user most wants attributed
        _assemble(result, capture.take(trace_id), collector="replay" if replay else "capture")


def _assemble(result: Captured, spans: list[ReadableSpan], *, collector: str) -> None:
    try:
        result.records = [r for r in (span_record_from_readable(s) for s in spans) if r is not None]
        result.trace = assemble_trace(result.records, collector=collector)
    except Exception as error:  # never in place of the block's own outcome
        result.error = f"the run's spans could not be assembled: {type(error).__name__}: {error}"
        _log.warning("%s (trace %s)", result.error, result.trace_id)


def recorded_run(provider: TracerProvider, name: str = "run") -> AbstractContextManager[Captured]:
    """Run the ``with`` block as one new trace named ``name`` on ``provider`` (the SDK provider the agent's
    OpenInference instrumentation writes to) and fill in the returned :class:`Captured` when the block ends, also when
    it raises (the trace of a run that crashed, its exception going on unchanged): its span records and the assembled
    ``trace``. The spans still go to the provider's exporters as usual (an application run, not a replay). Raises
    :class:`~reflect_otel.errors.ConfigError` when ``provider`` is not an SDK provider, and nothing else of its own."""
    return captured(provider, name, replay=False)
