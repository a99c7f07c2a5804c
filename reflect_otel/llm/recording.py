"""A wrapper that records every call of a backend, failed ones included, under the stage that made it; and one for
an agent's model that records the calls it makes for an attribution (its replays and proposals) in that
attribution's log."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from reflect_otel.errors import LLMError
from reflect_otel.llm.base import Completion, LLMOutputError, LLMRequest, LLMUsage, OutputT, StructuredLLM
from reflect_otel.llm.wrapper import WrapperLLM
from reflect_otel.record import LLMCall, Stage

if TYPE_CHECKING:
    import httpx

__all__ = ["AgentCallRecorder", "CallLog", "RecordingLLM", "record_agent_response", "recording_agent_calls"]


class CallLog:
    """Thread-safe list of :class:`LLMCall` s for one attribution run."""

    def __init__(self) -> None:
        self._calls: list[LLMCall] = []
        self._lock = threading.Lock()

    def add(self, call: LLMCall) -> None:
        with self._lock:
            self._calls.append(call)

    @property
    def calls(self) -> tuple[LLMCall, ...]:
        with self._lock:
            return tuple(self._calls)


class RecordingLLM(WrapperLLM):
    """Wraps a backend so every call, failed ones included, lands in a :class:`CallLog` under its stage."""

    def __init__(self, inner: StructuredLLM, log: CallLog, *, stage: str | None = None) -> None:
        super().__init__(inner)
        self.log = log
        self._model_name = inner.model_name
        self.stage = stage
        """When set, every call is logged under this stage, whatever stage the caller named (an agent's calls)."""

    @property
    def model_name(self) -> str:
        """The inner model's, read once when wrapped (every logged call names it)."""
        return self._model_name

    def answer(self, request: LLMRequest[OutputT]) -> Completion[OutputT]:
        start = time.perf_counter()
        logged = self.stage or request.stage
        try:
            completion = request.to(self.inner)
        except LLMOutputError as error:
            self.log.add(self._call(logged, error.usage, time.perf_counter() - start, error.attempts, str(error)))
            raise
        except LLMError as error:
            self.log.add(self._call(logged, LLMUsage(), time.perf_counter() - start, 1, str(error)))
            raise
        self.log.add(self._call(logged, completion.usage, time.perf_counter() - start, completion.attempts, None))
        return completion

    def _call(self, stage: str, usage: LLMUsage, seconds: float, attempts: int, error: str | None) -> LLMCall:
        return LLMCall(
            stage=stage,
            model=self.model_name,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_prompt_tokens=usage.cached_prompt_tokens,
            seconds=round(seconds, 6),
            attempts=attempts,
            ok=error is None,
            error=error,
        )


_agent_log: ContextVar[CallLog | None] = ContextVar("reflect_agent_call_log", default=None)


@contextmanager
def recording_agent_calls(log: CallLog) -> Iterator[CallLog]:
    """Within the block (and the threads it hands its context to, as LangGraph and LangChain do), the calls of every
    :class:`AgentCallRecorder` are logged in ``log``. The service runs each attribution in one, with the log whose
    calls the record counts as the agent's."""
    token = _agent_log.set(log)
    try:
        yield log
    finally:
        _agent_log.reset(token)


class AgentCallRecorder(WrapperLLM):
    """An agent's model, wrapped so that what it costs an attribution is counted there: a call made inside
    :func:`recording_agent_calls` (the agent replayed, or asked for a proposal, by an attribution) is logged in
    that block's log under :attr:`~reflect_otel.record.Stage.AGENT_REPLAY`, each request once; a call made outside
    one (the agent's own run, which is not the attribution's cost) is passed through unrecorded. Give it to an
    agent whose replay adapter is built before the attribution (the service's ``replay_finder`` builds others on a
    model it records already: do not wrap that one again). Thread-safe."""

    def __init__(self, inner: StructuredLLM) -> None:
        super().__init__(inner)
        self._model_name = inner.model_name

    @property
    def model_name(self) -> str:
        return self._model_name

    def answer(self, request: LLMRequest[OutputT]) -> Completion[OutputT]:
        log = _agent_log.get()
        if log is None:
            return request.to(self.inner)
        token = _agent_log.set(None)  # a recorder wrapped in another is counted once
        try:
            recording = RecordingLLM(self.inner, log, stage=Stage.AGENT_REPLAY)
            return recording.answer(request)
        finally:
            _agent_log.reset(token)


_MODEL_PATHS = ("/chat/completions", "/completions", "/responses")
_MAX_BODY = 16 << 20
"""The largest reply body read for its usage (an endpoint's reply, not ours: bounded)."""


def record_agent_response(response: httpx.Response) -> None:
    """An ``httpx`` response hook for the client of an agent that calls an OpenAI-compatible endpoint itself (the
    SQL demo agent): inside :func:`recording_agent_calls`, each model request it sends (a retry included) is logged
    there under :attr:`~reflect_otel.record.Stage.AGENT_REPLAY` with the usage its reply reports; outside, nothing.
    ``httpx.Client(event_hooks={"response": [record_agent_response]})``."""
    log = _agent_log.get()
    if log is None or response.request.method != "POST" or not response.request.url.path.endswith(_MODEL_PATHS):
        return
    body: Any = None
    streamed = "text/event-stream" in response.headers.get("content-type", "")
    length = response.headers.get("content-length", "")
    if not streamed and (not length.isdigit() or int(length) <= _MAX_BODY):
        response.read()  # the client reads it next from what was read here
        try:
            body = response.json()
        except ValueError:
            body = None
    usage = body.get("usage") if isinstance(body, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    try:
        seconds = response.elapsed.total_seconds()
    except RuntimeError:  # a streamed reply, not read yet
        seconds = 0.0
    log.add(
        LLMCall(
            stage=Stage.AGENT_REPLAY,
            model=str(body.get("model") or "unknown")[:200] if isinstance(body, dict) else "unknown",
            prompt_tokens=_count(usage.get("prompt_tokens", usage.get("input_tokens"))),
            completion_tokens=_count(usage.get("completion_tokens", usage.get("output_tokens"))),
            cached_prompt_tokens=_count(cached) if cached is not None else None,
            seconds=round(seconds, 6),
            attempts=1,
            ok=response.is_success,
            error=None if response.is_success else f"HTTP {response.status_code}",
        )
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
