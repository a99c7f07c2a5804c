"""Online mode: decorate an agent, run it, and find attributions of its silent failures in the store.

``observe`` wraps the agent in a root ``AGENT`` span and registers reflect-otel's span processor on the
application's tracer provider (or on a new one with high attribute limits); finished traces go to a bounded
queue served by one worker thread that verifies them (the oracle when ``expect`` gave the answer, else the
plan-anchored proxy), attributes the flagged ones (with the replay adapter bound to the agent), and writes
everything to the store and the configured exporters. The agent's hot path never blocks and never raises: when
the queue is full a trace is dropped and counted; a failure in the worker is logged and counted.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from importlib.metadata import entry_points
from typing import Any, TypeVar

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.trace import Status, StatusCode, format_trace_id

from reflect_otel.config import LLMConfig, ReflectConfig
from reflect_otel.errors import ConfigError, LLMError
from reflect_otel.llm.base import ChatMessage, Check, Completion, OutputT, StructuredLLM
from reflect_otel.pipeline import ReflectPipeline
from reflect_otel.proxy_verifier import PlanAnchoredVerifier
from reflect_otel.record import AttributionRecord, AttributionStatus
from reflect_otel.replay import ReplayAdapter
from reflect_otel.semconv import OpenInferenceSpanKindValues, SpanAttributes
from reflect_otel.store import AttributionStore, RecordExporter, open_exporter, open_store
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict
from reflect_otel.verifiers import OracleVerifier, Verifier

__all__ = ["OnlineStats", "Runtime", "configure", "expect", "observe", "runtime", "shutdown"]

_log = logging.getLogger("reflect_otel.online")
F = TypeVar("F", bound=Callable[..., Any])
_expected: contextvars.ContextVar[str | None] = contextvars.ContextVar("reflect_expected_answer", default=None)
PROCESSOR_GROUP = "reflect_otel.span_processors"
METRICS_GROUP = "reflect_otel.metrics"
MAX_PENDING = 10_000


@dataclass(slots=True)
class OnlineStats:
    """Counters of the online worker."""

    runs: int = 0
    traces_received: int = 0
    traces_dropped: int = 0
    traces_verified: int = 0
    traces_flagged: int = 0
    traces_attributed: int = 0
    traces_verified_attributions: int = 0
    budget_skips: int = 0
    export_errors: int = 0
    worker_errors: int = 0
    tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class TokenBudget:
    """Tokens spent in the last hour, and a cap per trace; thread-safe."""

    def __init__(self, per_trace: int, per_hour: int) -> None:
        self.per_trace = per_trace
        self.per_hour = per_hour
        self._spent: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def spent_last_hour(self) -> int:
        cutoff = time.monotonic() - 3600
        with self._lock:
            while self._spent and self._spent[0][0] < cutoff:
                self._spent.popleft()
            return sum(tokens for _, tokens in self._spent)

    def spend(self, tokens: int) -> None:
        with self._lock:
            self._spent.append((time.monotonic(), tokens))


class _BudgetedLLM:
    """Refuses further calls once one attribution has used ``limit`` tokens (the pipeline records the refusal)."""

    def __init__(self, inner: StructuredLLM, limit: int, budget: TokenBudget) -> None:
        self.inner = inner
        self.model_name = inner.model_name
        self.limit = limit
        self.budget = budget
        self.used = 0

    def complete(
        self, messages: Sequence[ChatMessage], output: type[OutputT], *, stage: str, check: Check[OutputT] | None = None
    ) -> Completion[OutputT]:
        if self.used >= self.limit:
            raise LLMError(f"the token budget for one trace ({self.limit}) is spent; raise max_tokens_per_trace")
        completion = self.inner.complete(messages, output, stage=stage, check=check)
        tokens = completion.usage.prompt_tokens + completion.usage.completion_tokens
        self.used += tokens
        self.budget.spend(tokens)
        return completion


@dataclass
class _Run:
    """What ``observe`` knew when the run started: its expected answer and replay adapter."""

    agent: str
    expected: str | None
    replay: ReplayAdapter | None


@dataclass
class Runtime:
    """The configured online machinery; one per process (see :func:`configure`)."""

    provider: TracerProvider
    store: AttributionStore | None
    llm_factory: Callable[[], StructuredLLM]
    reflect_config: ReflectConfig
    proxy_verifier: Callable[[StructuredLLM], Verifier] | None
    exporters: list[RecordExporter]
    metrics: Any
    budget: TokenBudget
    max_queue: int
    stats: OnlineStats = field(default_factory=OnlineStats)
    records: list[AttributionRecord] = field(default_factory=list)
    _pending: OrderedDict[str, _Run] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _llm: StructuredLLM | None = None
    _processor: Any = None
    _queue: Any = None
    _worker: threading.Thread | None = None
    _tracer: Any = None

    # -- the agent's side (never blocks, never raises) -----------------------------------------------------
    def register(self, trace_id: str, run: _Run) -> None:
        with self._lock:
            self._pending[trace_id] = run
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
            self.stats.runs += 1

    def submit(self, trace: StructuredTrace) -> None:
        """The span processor's sink: queue the trace for the worker, or drop and count it when full."""
        import queue

        with self._lock:
            if trace.trace_id not in self._pending:
                return  # a trace of the application that no observed agent started
        self.stats.traces_received += 1
        try:
            self._queue.put_nowait(trace)
        except queue.Full:
            self.stats.traces_dropped += 1
            _log.warning(
                "reflect-otel's queue is full (%d traces); trace %s was dropped", self.max_queue, trace.trace_id
            )

    # -- the worker ---------------------------------------------------------------------------------------
    def _llm_once(self) -> StructuredLLM:
        if self._llm is None:
            self._llm = self.llm_factory()
        return self._llm

    def _work(self) -> None:
        while True:
            trace = self._queue.get()
            if trace is None:
                self._queue.task_done()
                return
            try:
                self._handle(trace)
            except Exception:  # a bug here must not stop the worker
                self.stats.worker_errors += 1
                _log.exception("reflect-otel failed to process trace %s", trace.trace_id)
            finally:
                self._queue.task_done()

    def _handle(self, trace: StructuredTrace) -> None:
        with self._lock:
            run = self._pending.pop(trace.trace_id, None)
        if run is None:
            return
        if run.expected is not None:
            verifier: Verifier = OracleVerifier()
        elif self.proxy_verifier is not None:
            verifier = self.proxy_verifier(self._llm_once())
        else:
            verifier = OracleVerifier()  # cannot tell without an answer: stored, not flagged
        verdict: Verdict = verifier.verify(trace, expected=run.expected)
        self.stats.traces_verified += 1
        flagged = verdict.is_correct is False
        if self.store is not None:
            self.store.write_trace(trace)
            self.store.write_verdict(trace.trace_id, verdict)
        if self.metrics is not None:
            self.metrics.trace_seen(trace, flagged=flagged)
        if not flagged:
            return
        self.stats.traces_flagged += 1
        if self.budget.spent_last_hour() >= self.budget.per_hour:
            self.stats.budget_skips += 1
            record = AttributionRecord(
                trace_id=trace.trace_id,
                method="reflect",
                status=AttributionStatus.SKIPPED,
                mode="none",
                original_verdict=verdict,
                original_answer=trace.final_answer,
                reason=f"the hourly LLM token budget ({self.budget.per_hour}) is spent: stored and flagged, not "
                "attributed; raise max_tokens_per_hour",
            )
        else:
            llm = _BudgetedLLM(self._llm_once(), self.budget.per_trace, self.budget)
            pipeline = ReflectPipeline(llm, verifier=verifier, config=self.reflect_config)
            record = pipeline.attribute(trace, expected=run.expected, replay=run.replay)
            self.stats.tokens += llm.used
            self.stats.traces_attributed += 1
            if record.status is AttributionStatus.VERIFIED:
                self.stats.traces_verified_attributions += 1
        with self._lock:
            self.records.append(record)
        if self.store is not None:
            self.store.write_record(record)
        if self.metrics is not None:
            self.metrics.record_attributed(record)
        for exporter in self.exporters:
            try:
                exporter.export(record)
            except Exception as error:  # one broken exporter must not stop the others; the store has the record
                self.stats.export_errors += 1
                _log.warning("exporting the attribution of %s failed: %s", trace.trace_id, error)

    def drain(self, timeout_s: float = 600.0) -> bool:
        """Wait until every finished run has been processed; True when done in time."""
        if self._processor is not None:
            self._processor.force_flush(int(timeout_s * 1000))
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._queue.unfinished_tasks

    def close(self, timeout_s: float = 30.0) -> None:
        self.drain(timeout_s)
        if self._processor is not None:
            self._processor.shutdown()  # it stays registered on the provider (OTel cannot remove one), idle
        self._queue.put(None)
        if self._worker is not None:
            self._worker.join(timeout=timeout_s)
        if self.store is not None:
            self.store.close()
        for exporter in self.exporters:
            exporter.close()
        if self.metrics is not None:
            self.metrics.shutdown()


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


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


def _entry(group: str, name: str) -> Any:
    found = {e.name: e for e in entry_points(group=group)}
    if name not in found:
        raise ConfigError(f"reflect-otel's {group} entry point {name!r} is missing; reinstall reflect-otel")
    return found[name].load()


def configure(
    *,
    store: str | None = None,
    no_store: bool = False,
    llm: StructuredLLM | None = None,
    llm_config: LLMConfig | None = None,
    reflect_config: ReflectConfig | None = None,
    proxy: bool = True,
    exporters: Sequence[str] = (),
    metrics_port: int | None = None,
    max_tokens_per_trace: int = 200_000,
    max_tokens_per_hour: int = 2_000_000,
    max_queue: int = 100,
    tracer_provider: TracerProvider | None = None,
) -> Runtime:
    """Set up online mode (optional: ``observe`` calls it with the defaults). Settings not given come from
    ``REFLECT_*`` variables: the store from ``REFLECT_STORE`` (else ``./reflect.duckdb``), the LLM from
    ``REFLECT_LLM_*``/``OPENAI_*`` (else the local SmolLM2 server, started on first use, off the agent's path)."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        import queue

        from reflect_otel.llm.factory import make_llm

        provider = _provider(tracer_provider)
        metrics = _entry(METRICS_GROUP, "prometheus")(prometheus_port=metrics_port) if metrics_port else None
        rt = Runtime(
            provider=provider,
            store=None if no_store else open_store(store),
            llm_factory=(lambda: llm) if llm is not None else (lambda: make_llm(llm_config or LLMConfig.from_env())),
            reflect_config=reflect_config or ReflectConfig.from_env(),
            proxy_verifier=PlanAnchoredVerifier if proxy else None,
            exporters=[open_exporter(name) for name in dict.fromkeys(exporters)],
            metrics=metrics,
            budget=TokenBudget(max_tokens_per_trace, max_tokens_per_hour),
            max_queue=max_queue,
        )
        rt._queue = queue.Queue(maxsize=max_queue)
        rt._processor = _entry(PROCESSOR_GROUP, "reflect")(rt.submit)
        provider.add_span_processor(rt._processor)
        _instrument(provider)
        rt._tracer = provider.get_tracer("reflect_otel.observe")
        rt._worker = threading.Thread(target=rt._work, name="reflect-otel-online", daemon=True)
        rt._worker.start()
        _runtime = rt
        return rt


def runtime() -> Runtime:
    """The configured runtime (configuring it with the defaults on first use)."""
    return _runtime if _runtime is not None else configure()


def shutdown(timeout_s: float = 30.0) -> None:
    """Process what is queued (within ``timeout_s``), then stop the worker and close the store."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close(timeout_s)
            _runtime = None


@contextmanager
def expect(answer: str) -> Iterator[None]:
    """The correct answer of the runs started inside the block (the oracle regime for them)."""
    token = _expected.set(answer)
    try:
        yield
    finally:
        _expected.reset(token)


def _input_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    values = [*args, *kwargs.values()]
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    try:
        return json.dumps({"args": list(args), "kwargs": kwargs}, default=str)[:100_000]
    except (TypeError, ValueError):
        return repr(values)[:100_000]


def observe(
    fn: F | None = None,
    *,
    replay: ReplayAdapter | None = None,
    name: str | None = None,
    session_id: str | Callable[..., str] | None = None,
) -> Any:
    """Decorate an agent function (sync or async): each call becomes a traced run that reflect-otel verifies and,
    when it failed, attributes. Return values and exceptions pass through untouched. ``session_id`` (a string, or
    a function of the call's arguments) groups runs into sessions."""

    def decorate(func: F) -> F:
        agent = name or func.__name__

        def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            try:
                rt = runtime()
                attributes = {
                    SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
                    SpanAttributes.AGENT_NAME: agent,
                    SpanAttributes.INPUT_VALUE: _input_text(args, kwargs),
                }
                session = session_id(*args, **kwargs) if callable(session_id) else session_id
                if session:
                    attributes[SpanAttributes.SESSION_ID] = str(session)
                span = rt._tracer.start_span(agent, attributes=attributes)
                rt.register(format_trace_id(span.get_span_context().trace_id), _Run(agent, _expected.get(), replay))
                return span
            except Exception:  # tracing must never break the agent
                _log.exception("reflect-otel could not start tracing %s; running it untraced", agent)
                return None

        def finish(span: Any, result: Any = None, error: BaseException | None = None) -> None:
            if span is None:
                return
            try:
                if error is not None:
                    span.record_exception(error)
                    span.set_status(Status(StatusCode.ERROR, str(error)[:500]))
                else:
                    span.set_attribute(
                        SpanAttributes.OUTPUT_VALUE,
                        result if isinstance(result, str) else json.dumps(result, default=str)[:100_000],
                    )
                    span.set_status(Status(StatusCode.OK))
                span.end()
            except Exception:
                _log.exception("reflect-otel could not finish tracing %s", agent)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                span = start(args, kwargs)
                context = otel_trace.set_span_in_context(span) if span is not None else None
                token = otel_context_attach(context)
                try:
                    result = await func(*args, **kwargs)
                except BaseException as error:
                    finish(span, error=error)
                    raise
                finally:
                    otel_context_detach(token)
                finish(span, result)
                return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            span = start(args, kwargs)
            context = otel_trace.set_span_in_context(span) if span is not None else None
            token = otel_context_attach(context)
            try:
                result = func(*args, **kwargs)
            except BaseException as error:
                finish(span, error=error)
                raise
            finally:
                otel_context_detach(token)
            finish(span, result)
            return result

        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


def otel_context_attach(context: Any) -> Any:
    from opentelemetry import context as otel_context

    return otel_context.attach(context) if context is not None else None


def otel_context_detach(token: Any) -> None:
    from opentelemetry import context as otel_context

    if token is not None:
        otel_context.detach(token)
