"""One tracer provider per framework test: our span processor (assembled traces) and an in-memory exporter (the
raw spans) side by side; the check that the same spans exported as OTLP/JSON give the same trace through
``import`` and through the OTLP receiver; and the environment of its own that the ``openai<3`` frameworks share."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reflect_otel.collectors.files import import_files
from reflect_otel.collectors.receiver import OTLPReceiver
from reflect_otel.collectors.span_processor import ReflectSpanProcessor
from reflect_otel.collectors.trace_collector import BufferLimits
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

    def print_run(self, answer: str | None, **extra: Any) -> None:
        """For an app run in a process of its own (:func:`run_app`): flush, then print the application's answer, the
        traces reflect-otel rebuilt, the raw spans as OTLP/JSON and ``extra``, as one JSON object."""
        self.provider.force_flush()
        run = {
            "answer": answer,
            "traces": [t.model_dump(mode="json") for t in self.traces],
            "otlp": otlp_json(list(self.exporter.get_finished_spans())),
        }
        print(json.dumps(run | extra))


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
    return same_trace_from_otlp_json(otlp_json(spans), trace, folder)


def same_trace_from_otlp_json(otlp: dict[str, Any], trace: StructuredTrace, folder: Path) -> StructuredTrace:
    """The two ways a run in another process reaches reflect-otel, checked against the live trace (steps, question,
    answer, session, agent): ``otlp`` (an OTLP/JSON request holding ``trace``'s spans) written as a file and
    imported, as ``reflect-otel import`` does, and posted to a real OTLP receiver, as ``collect`` gets it. Returns
    the imported trace."""
    path = folder / f"{trace.trace_id}.json"
    path.write_text(json.dumps(otlp), encoding="utf-8")
    imported: list[StructuredTrace] = []
    import_files([path], lambda t, _meta: imported.append(t))
    received: list[StructuredTrace] = []
    receiver = OTLPReceiver(received.append, http=("127.0.0.1", 0), buffer_limits=BufferLimits(grace_s=0.0)).start()
    try:
        posted = httpx.post(f"http://127.0.0.1:{receiver.http_port}/v1/traces", json=otlp, timeout=30)
        assert posted.status_code == 200, posted.text
        assert receiver.force_flush(30_000)
    finally:
        receiver.shutdown(30_000)
    for again in (*imported, *received):
        assert again.steps == trace.steps
        assert (again.question, again.final_answer, again.session_id, again.agent) == (
            trace.question,
            trace.final_answer,
            trace.session_id,
            trace.agent,
        )
    assert (len(imported), len(received)) == (1, 1)
    return imported[0]


ROOT = Path(__file__).resolve().parents[2]


OPENAI2_EXTRAS = "llamaindex,crewai,litellm,adk,autogen"
"""The frameworks that need ``openai<3``, an older OpenTelemetry SDK or protobuf (the others need ``openai>=3``,
the newest SDK and protobuf 6+): one environment of their own holds them."""


def own_environment(extras: str = OPENAI2_EXTRAS) -> Path:
    """The Python of an environment with reflect-otel and ``extras`` installed (editable), under ``.test-envs/`` (or
    ``REFLECT_TEST_ENVS``), built by ``python -m tests.frameworks.tracing`` (``.ci/run`` runs it before the tests)
    and rebuilt when ``pyproject.toml`` changes. Tests reach it through the session fixture ``openai2_python``,
    which builds it when missing and fails naming the command when it cannot (offline)."""
    env = Path(os.environ.get("REFLECT_TEST_ENVS") or ROOT / ".test-envs") / extras.replace(",", "-")
    python = env / "bin" / "python"
    stamp = env / "built-from.sha256"
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[{extras}]"],
        capture_output=True,
        text=True,
        timeout=1_200,
        check=False,
    )
    if installed.returncode != 0:
        raise EnvironmentBuildError(
            f"installing the {extras} extras into {env} failed (offline? run python -m tests.frameworks.tracing "
            f"where the package index is reachable):\n{installed.stderr[-3000:]}"
        )
    stamp.write_text(wanted)
    return python


class EnvironmentBuildError(RuntimeError):
    """The frameworks' own environment could not be built."""


def run_app(module: str, *args: str, python: str | Path = sys.executable, timeout_s: float = 300) -> Any:
    """Run ``python -m module args`` from the repository root (an app that needs a process or an environment of its
    own) and return the JSON it prints; a failed run fails the test with its stderr."""
    done = subprocess.run(
        [str(python), "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


if __name__ == "__main__":  # .ci/run: build the environment before the tests, so no test installs anything
    print(own_environment())
