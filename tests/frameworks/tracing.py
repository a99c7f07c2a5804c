"""One tracer provider per framework test: our span processor (assembled traces) and an in-memory exporter (the
raw spans) side by side, and the check that the same spans exported as an OTLP/JSON file and imported give the
same trace."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reflect_otel.collectors.files import import_files
from reflect_otel.collectors.span_processor import ReflectSpanProcessor
from reflect_otel.trace import StructuredTrace
from tests.agents import otlp_json


@dataclass
class Traced:
    """``first``: processors that must see each span before ours (one that adds attributes, say)."""

    first: Sequence[SpanProcessor] = ()
    provider: TracerProvider = field(default_factory=TracerProvider, init=False)
    exporter: InMemorySpanExporter = field(default_factory=InMemorySpanExporter, init=False)
    traces: list[StructuredTrace] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        for processor in self.first:
            self.provider.add_span_processor(processor)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.provider.add_span_processor(ReflectSpanProcessor(self.traces.append))


@contextmanager
def instrumented_by(instrumentor: Any) -> Iterator[Traced]:
    """A fresh :class:`Traced` with ``instrumentor`` (an OpenTelemetry ``BaseInstrumentor``) on it, turned off after."""
    traced = Traced()
    instrumentor.instrument(tracer_provider=traced.provider)
    try:
        yield traced
    finally:
        instrumentor.uninstrument()
        traced.provider.shutdown()


def same_trace_from_otlp_file(traced: Traced, trace: StructuredTrace, folder: Path) -> StructuredTrace:
    """Export the trace's raw spans as OTLP/JSON, import the file, and return the imported trace after checking that
    it matches the live one (steps, question, answer, session, agent)."""
    spans = [s for s in traced.exporter.get_finished_spans() if format(s.context.trace_id, "032x") == trace.trace_id]
    path = folder / f"{trace.trace_id}.json"
    path.write_text(json.dumps(otlp_json(spans)), encoding="utf-8")
    imported: list[StructuredTrace] = []
    import_files([path], lambda t, _meta: imported.append(t))
    (again,) = imported
    assert again.steps == trace.steps
    assert (again.question, again.final_answer, again.session_id, again.agent) == (
        trace.question,
        trace.final_answer,
        trace.session_id,
        trace.agent,
    )
    return again


ROOT = Path(__file__).resolve().parents[2]


def run_app(module: str, *args: str, python: str | Path = sys.executable, timeout_s: float = 300) -> Any:
    """Run ``python -m module args`` from the repository root (an app that needs a process or an environment of its
    own) and return the JSON it prints; a failed run fails the test with its stderr."""
    done = subprocess.run(
        [str(python), "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
