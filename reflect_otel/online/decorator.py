"""``observe`` and ``expect``: decorate an agent, and say what its answer should be.

``observe`` wraps each call in a root ``AGENT`` span on the runtime's tracer provider and registers the run; when
its spans have finished, the runtime's worker verifies the run and attributes it when it failed. Return values
and exceptions pass through untouched, and tracing never breaks the agent.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry import trace as otel_trace
from opentelemetry.trace import Status, StatusCode, format_trace_id

from reflect_otel.online.runtime import PendingRun
from reflect_otel.online.setup import runtime
from reflect_otel.reading.semconv import OpenInferenceSpanKindValues, SpanAttributes
from reflect_otel.replay import ReplayAdapter

__all__ = ["expect", "observe"]

_log = logging.getLogger("reflect_otel.online")
F = TypeVar("F", bound=Callable[..., Any])
_expected: contextvars.ContextVar[str | None] = contextvars.ContextVar("reflect_expected_answer", default=None)


MAX_CONTEXT_CHARS = 100_000
"""``observe(context=...)`` beyond this is cut (prompts cut it further, to what their budget allows)."""


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
    context: str | Callable[..., str] | None = None,
) -> Any:
    """Decorate an agent function (sync or async): each call becomes a traced run that reflect-otel verifies and,
    when it failed, attributes. Return values and exceptions pass through untouched. ``session_id`` (a string, or
    a function of the call's arguments) groups runs into sessions. ``context`` (a string, or a function of the
    call's arguments) is what the agent was given besides its question, such as the table or document it reads:
    the auditor sees it, delimited as data, so that it can tell a wrong value from a missing one."""

    def decorate(func: F) -> F:
        run = _ObservedAgent(name or func.__name__, replay, session_id, context)
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with run.traced(args, kwargs) as record_result:
                    result = await func(*args, **kwargs)
                    record_result(result)
                    return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with run.traced(args, kwargs) as record_result:
                result = func(*args, **kwargs)
                record_result(result)
                return result

        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


@dataclass(frozen=True, slots=True)
class _ObservedAgent:
    """What ``observe`` was told about one agent, and how each of its calls is traced."""

    agent: str
    replay: ReplayAdapter | None
    session_id: str | Callable[..., str] | None
    context: str | Callable[..., str] | None

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The run's root span, its run registered with the runtime; None when tracing could not start."""
        try:
            rt = runtime()
            attributes = {
                SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
                SpanAttributes.AGENT_NAME: self.agent,
                SpanAttributes.INPUT_VALUE: _input_text(args, kwargs),
            }
            session = self.session_id(*args, **kwargs) if callable(self.session_id) else self.session_id
            if session:
                attributes[SpanAttributes.SESSION_ID] = str(session)
            given = self.context(*args, **kwargs) if callable(self.context) else self.context
            span = rt.tracer.start_span(self.agent, attributes=attributes)
            rt.register(
                format_trace_id(span.get_span_context().trace_id),
                PendingRun(self.agent, _expected.get(), self.replay, str(given or "")[:MAX_CONTEXT_CHARS]),
            )
            return span
        except Exception:  # tracing must never break the agent
            _log.exception("reflect-otel could not start tracing %s; running it untraced", self.agent)
            return None

    def record_output(self, span: Any, result: Any) -> None:
        try:
            span.set_attribute(
                SpanAttributes.OUTPUT_VALUE,
                result if isinstance(result, str) else json.dumps(result, default=str)[:100_000],
            )
            span.set_status(Status(StatusCode.OK))
        except Exception:
            _log.exception("reflect-otel could not record the output of %s", self.agent)

    @contextmanager
    def traced(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Callable[[Any], None]]:
        """The run's span, current while the agent runs and ended after; an exception is recorded on it (status
        ERROR) and passes through untouched. Yields the function that records the agent's result."""
        span = self.start(args, kwargs)
        if span is None:
            yield lambda result: None
            return
        with otel_trace.use_span(span, end_on_exit=True, record_exception=True, set_status_on_exception=True):
            yield lambda result: self.record_output(span, result)
