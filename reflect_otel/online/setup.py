"""``configure``: build the online runtime on the application's tracer provider, with the built-in span processor
and metrics wired by import, and the store, exporters and LLM chosen by name or by ``REFLECT_*`` variables."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import SpanLimits, TracerProvider

from reflect_otel.attribution.methods import method_spec
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import LLMConfig, ReflectConfig
from reflect_otel.errors import ConfigError
from reflect_otel.flagging.combined import VERIFIER_NAMES, flagging_verifier
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.budget import TokenBudget
from reflect_otel.llm.factory import LazyLLM, NoModel, make_llm, model_missing
from reflect_otel.online.runtime import Runtime
from reflect_otel.settings import check_environment
from reflect_otel.store import open_exporter, open_store

__all__ = [
    "NO_MODEL_VERIFIERS",
    "OnlineOptions",
    "OnlineSettings",
    "configure",
    "instrumented_provider",
    "runtime",
    "say_no_model",
    "shutdown",
]

_log = logging.getLogger("reflect_otel.online")
_runtime: Runtime | None = None
_runtime_lock = threading.Lock()
_said_no_model: set[str] = set()
_said_lock = threading.Lock()

NO_MODEL_VERIFIERS = ("evidence", "consistency")
"""The verifiers of runs without an expected answer that need no model (consistency re-runs the agent, which runs
on its own model); ``proxy`` and ``combined`` audit with one."""


def say_no_model(missing: str, *, instead: str) -> None:
    """Warn once per process that there is no model (``missing`` names both ways to get one) and what runs
    ``instead``."""
    with _said_lock:
        if missing in _said_no_model:
            return
        _said_no_model.add(missing)
    _log.warning("reflect-otel: %s. Meanwhile %s", missing, instead)


def _provider(explicit: TracerProvider | None) -> TracerProvider:
    if explicit is not None:
        return explicit
    current = otel_trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current  # attach to the application's provider; its exporters stay as they are
    # none yet: one with limits high enough for long conversations (the default 128 attributes drop messages)
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=10_000, max_attribute_length=None))
    otel_trace.set_tracer_provider(provider)
    return provider


def _instrument(provider: TracerProvider) -> list[str]:
    """Turn on the OpenInference instrumentations that are installed (and not already on)."""
    turned_on = []
    for module, name in (
        ("openinference.instrumentation.langchain", "LangChainInstrumentor"),
        ("openinference.instrumentation.openai", "OpenAIInstrumentor"),
    ):
        try:
            instrumentor = getattr(__import__(module, fromlist=[name]), name)()
        except ImportError:
            continue
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
            turned_on.append(name)
    return turned_on


def instrumented_provider() -> TracerProvider:
    """The provider ``configure`` would attach to (the application's, else a new global one), with the installed
    OpenInference instrumentations on: for commands that run an agent without the online runtime."""
    provider = _provider(None)
    _instrument(provider)
    return provider


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlineSettings:
    """What :func:`configure` sets up; each setting not given comes from ``REFLECT_*`` variables or its default."""

    store: str | None = None
    """The store (a DuckDB file or a ``postgresql://`` URL); None: ``REFLECT_STORE``, else ``./reflect.duckdb``."""
    no_store: bool = False
    llm: StructuredLLM | None = None
    """The model; None: built from ``llm_config`` (else ``REFLECT_LLM_*``/``OPENAI_*``) on first use."""
    llm_config: LLMConfig | None = None
    reflect_config: ReflectConfig | None = None
    proxy: bool = True
    """Judge runs without an expected answer by ``verifier`` (False: store them unjudged)."""
    verifier: str = "proxy"
    """One of :data:`~reflect_otel.flagging.combined.VERIFIER_NAMES`."""
    exporters: Sequence[str] = ()
    """Record exporters by name (``otlp``, ``phoenix``)."""
    metrics_port: int | None = None
    """A Prometheus scrape endpoint on this loopback port."""
    max_tokens_per_trace: int = 200_000
    max_tokens_per_hour: int = 2_000_000
    max_queue: int = 100
    """Finished runs waiting for the worker; beyond, runs are dropped and counted."""
    tracer_provider: TracerProvider | None = None
    """The application's provider; None: the global one (a new one when there is none)."""


class OnlineOptions(TypedDict, total=False):
    """:class:`OnlineSettings` as keyword arguments of :func:`configure`."""

    store: str | None
    no_store: bool
    llm: StructuredLLM | None
    llm_config: LLMConfig | None
    reflect_config: ReflectConfig | None
    proxy: bool
    verifier: str
    exporters: Sequence[str]
    metrics_port: int | None
    max_tokens_per_trace: int
    max_tokens_per_hour: int
    max_queue: int
    tracer_provider: TracerProvider | None


def configure(settings: OnlineSettings | None = None, /, **options: Unpack[OnlineOptions]) -> Runtime:
    """Set up online mode (optional: ``observe`` calls it with the defaults), from ``settings`` and/or the same
    settings as keywords (``configure(store="reflect.duckdb", tracer_provider=provider)``; a keyword overrides
    ``settings``). Settings not given come from ``REFLECT_*`` variables: the store from ``REFLECT_STORE`` (else
    ``./reflect.duckdb``), the LLM from ``REFLECT_LLM_*``/``OPENAI_*`` (else the local llama.cpp server, started on
    first use, off the agent's path). Runs inside ``expect(answer)`` are judged against the answer; the others
    (``proxy=True``) by ``verifier``: one of :data:`~reflect_otel.flagging.combined.VERIFIER_NAMES` (``consistency``
    and ``combined`` resample the agent through the replay adapter given to ``observe``), or not at all
    (``proxy=False``)."""
    chosen = dataclasses.replace(settings or OnlineSettings(), **options)
    if chosen.verifier not in VERIFIER_NAMES:
        raise ConfigError(f"verifier={chosen.verifier!r}: choose from {', '.join(VERIFIER_NAMES)}")
    check_environment()  # a bad REFLECT_* variable fails here, named (observe logs it and runs the agent untraced)
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.shutdown()
        _runtime = _build(chosen)
        return _runtime


def _build(settings: OnlineSettings) -> Runtime:
    from reflect_otel.collectors.span_processor import ReflectSpanProcessor
    from reflect_otel.exporters.metrics import AttributionMetrics

    provider = _provider(settings.tracer_provider)
    model, method, verifier = _model(settings)
    metrics = AttributionMetrics(prometheus_port=settings.metrics_port) if settings.metrics_port else None
    service = AttributionService(
        model,
        method_spec(method),
        verifier=OracleVerifier(),  # without an expected answer and without the proxy: stored, not flagged
        proxy=flagging_verifier(verifier, model) if settings.proxy else None,
        config=settings.reflect_config or ReflectConfig.from_env(),
        store=None if settings.no_store else open_store(settings.store),
        exporters={name: open_exporter(name) for name in dict.fromkeys(settings.exporters)},
        metrics=metrics,
        budget=TokenBudget(settings.max_tokens_per_trace, settings.max_tokens_per_hour),
        triage=True,
    )
    rt = Runtime(
        provider,
        service,
        make_processor=ReflectSpanProcessor,
        max_queue=settings.max_queue,
        metrics_shutdown=metrics.shutdown if metrics is not None else None,
    )
    _instrument(provider)
    return rt


def _model(settings: OnlineSettings) -> tuple[StructuredLLM, str, str]:
    """The model, the method and the verifier of unlabelled runs: without a model (the light install), the
    evidence checks, said once."""
    missing = None if settings.llm is not None else model_missing(settings.llm_config)
    if missing is None:
        config = settings.llm_config
        model = settings.llm if settings.llm is not None else LazyLLM(lambda: make_llm(config or LLMConfig.from_env()))
        return model, "reflect", settings.verifier
    say_no_model(
        missing,
        instead="runs are recorded, judged against expect(...) and by the evidence checks, and failures "
        "attributed by the evidence checks (no audit, no replay)",
    )
    verifier = settings.verifier if settings.verifier in NO_MODEL_VERIFIERS else "evidence"
    return NoModel(missing), "evidence", verifier


def runtime() -> Runtime:
    """The configured runtime (configuring it with the defaults on first use)."""
    return _runtime if _runtime is not None else configure()


def shutdown(timeout_millis: int = 30_000) -> None:
    """Process what is queued (within ``timeout_millis``), then stop the worker and close the store."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.shutdown(timeout_millis)
            _runtime = None
