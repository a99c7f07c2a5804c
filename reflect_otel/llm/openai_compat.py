"""Any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp, ...) through the ``openai`` client."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import context
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from pydantic import BaseModel

from reflect_otel.config import LLMConfig, SchemaMode
from reflect_otel.errors import ConfigError, EndpointBusyError, EndpointDownError, LLMError
from reflect_otel.llm.base import (
    ChatMessage,
    Completion,
    LLMBase,
    LLMRequest,
    LLMUsage,
    OutputT,
    complete_with_repair,
    schema_instruction,
)

__all__ = [
    "ENDPOINT_ERROR_PREFIX",
    "STOP_AFTER",
    "OpenAICompatibleLLM",
    "endpoint_down",
    "forget_endpoint_health",
    "reset_negotiation",
]

ENDPOINT_ERROR_PREFIX = "LLM endpoint "
"""How every error about an endpoint begins (then its URL and model)."""

_log = logging.getLogger("reflect_otel.llm.openai")


_STEP_DOWN = {
    SchemaMode.JSON_SCHEMA: SchemaMode.JSON_OBJECT_SCHEMA,
    SchemaMode.JSON_OBJECT_SCHEMA: SchemaMode.JSON_OBJECT,
}
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "schema")
_negotiated: dict[tuple[str | None, str], SchemaMode] = {}
_negotiated_lock = threading.Lock()


def _about_response_format(error: Any) -> bool:
    """True when an endpoint's refusal names the structured-output request (llama.cpp's Python server answers
    500 "Input should be 'text' or 'json_object'", OpenAI 400 "'response_format' ... is not supported")."""
    response = getattr(error, "response", None)
    body = getattr(response, "text", "") if response is not None else ""
    text = f"{error} {body[:2000]}".lower()
    return any(word in text for word in _FORMAT_WORDS)


def reset_negotiation() -> None:
    """Forget what was learned about each endpoint: the structured-output mode it accepted, and whether it was
    failing (for tests, or after reconfiguring a server)."""
    with _negotiated_lock:
        _negotiated.clear()
    forget_endpoint_health()


def forget_endpoint_health() -> None:
    """Forget which endpoints were failing (a test that takes one for down must not leave it down)."""
    with _health_lock:
        _health.clear()


STOP_AFTER = 3
"""Consecutive requests to one endpoint that fail the same way (refused, unreachable, timed out, a 401/403/404,
429 or 5xx after their retries) after which it is taken for down: :func:`endpoint_down` names it, and for
:data:`_COOL_OFF_S` (or the ``Retry-After`` a busy endpoint last asked for, when shorter) every request to it fails
at once with that cause instead of waiting again."""
_COOL_OFF_S = 30.0
SLOW_NOTICE_S = 10.0
"""A request with no answer after this many seconds (or a third of ``timeout_s``, if sooner) says what it waits for
(once)."""


@dataclass(slots=True)
class _Health:
    """Consecutive failures of one endpoint, and since when it is taken for down."""

    signature: str = ""
    streak: int = 0
    down: EndpointDownError | None = None
    down_since: float = 0.0
    cool_off_s: float = 0.0


_health: dict[tuple[str | None, str], _Health] = {}
_health_lock = threading.Lock()
_stage: contextvars.ContextVar[str] = contextvars.ContextVar("reflect_llm_stage", default="")


def endpoint_down() -> EndpointDownError | None:
    """The first endpoint of this process taken for down (:data:`STOP_AFTER` consecutive failures the same way),
    with its URL and the cause; None when every endpoint answers. A command checks it between traces and stops."""
    with _health_lock:
        return next((health.down for health in _health.values() if health.down is not None), None)


def _retry_after(error: Exception) -> float | None:
    """The seconds an error's response asked to wait (``Retry-After`` in seconds), else None."""
    response = getattr(error, "response", None)
    after = response.headers.get("retry-after") if response is not None else None
    try:
        return max(0.0, float(after)) if after is not None else None
    except (TypeError, ValueError):  # an HTTP date, or garbage: the backoff's own pause
        return None


def _busy(error: Exception, openai: Any) -> bool:
    """Whether a failure says the endpoint is busy or slow (429, 408, 409, 5xx, a timeout, a connection that could
    not be made or broke) rather than that the request, key or model is wrong."""
    status = getattr(error, "status_code", None)
    if isinstance(status, int):
        return status >= 500 or status in (408, 409, 429)
    return isinstance(error, openai.APIConnectionError)  # APITimeoutError is one


def _failure_signature(error: Exception) -> str | None:
    """How a failed request failed, for telling "the same way" apart; None for a failure about the request
    itself (a 400 or 422: another request may well succeed)."""
    status = getattr(error, "status_code", None)
    if isinstance(status, int):
        return None if status in (400, 422) else f"HTTP {status}"
    return type(error).__name__


class OpenAICompatibleLLM(LLMBase):
    """Structured output via ``response_format``. With no schema mode configured the mode is negotiated per
    endpoint: ``json_schema``, then ``json_object`` with the schema (llama.cpp), then plain JSON mode with the schema
    in the prompt, stepping down when the endpoint refuses a mode in words that name it; the mode that worked is
    remembered for the endpoint (for the process) and logged once. ``REFLECT_LLM_SCHEMA_MODE`` forces one. A request
    is retried on 429, 5xx, timeouts and connection errors with backoff (``max_retries``), all within ``timeout_s``;
    after that an :class:`LLMError` names the endpoint, and an endpoint failing the same way :data:`STOP_AFTER` times
    in a row is taken for down (:func:`endpoint_down`)."""

    def __init__(self, config: LLMConfig, *, client: Any | None = None) -> None:
        import openai

        if not config.model:
            raise ConfigError("no model named for the LLM endpoint; set REFLECT_LLM_MODEL (or pass model=...)")
        self.config = config
        self.model_name = config.model
        self._client: Any = client or openai.OpenAI(
            base_url=config.base_url,
            api_key=config.api_key or "not-needed",
            timeout=config.timeout_s,
            max_retries=0,  # retried here, within timeout_s in all
        )
        self._endpoint = (config.base_url, config.model)
        self._auto_mode = config.schema_mode is None
        with _negotiated_lock:
            known = _negotiated.get(self._endpoint) if self._auto_mode else None
        self._mode = config.schema_mode or known or SchemaMode.JSON_SCHEMA
        self._confirmed = not self._auto_mode or known is not None
        self._lock = threading.Lock()
        self._openai = openai

    @classmethod
    def from_config(cls, config: LLMConfig) -> OpenAICompatibleLLM:
        return cls(config)

    def answer(self, request: LLMRequest[OutputT]) -> Completion[OutputT]:
        messages, output, temperature = request.messages, request.output, request.temperature
        instruction = schema_instruction(output)
        if messages and instruction in messages[0].content:
            framed = list(messages)  # the caller put the schema first, where a prompt cache keeps it
        else:  # last, after the content every stage shares
            last = messages[-1]
            framed = [*messages[:-1], ChatMessage(role=last.role, content=f"{last.content}\n\n{instruction}")]
        sampling = self.config.temperature if temperature is None else temperature
        token = _stage.set(request.stage)
        try:
            return complete_with_repair(
                lambda conversation: self._send(conversation, output, sampling), framed, output, request.check
            )
        finally:
            _stage.reset(token)

    def _response_format(self, output: type[BaseModel]) -> dict[str, Any]:
        schema = output.model_json_schema()
        if self._mode is SchemaMode.JSON_SCHEMA:
            return {"type": "json_schema", "json_schema": {"name": output.__name__, "schema": schema, "strict": False}}
        if self._mode is SchemaMode.JSON_OBJECT_SCHEMA:
            return {"type": "json_object", "schema": schema}
        return {"type": "json_object"}

    def _send(self, messages: list[ChatMessage], output: type[BaseModel], temperature: float) -> tuple[str, LLMUsage]:
        # reflect-otel's own model calls must not show up as spans of the user's application (the auditor's
        # calls would be taken for agent runs), and inside a traced chat-model wrapper they would be duplicates
        token = context.attach(context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            return self._send_unsuppressed(messages, output, temperature)
        finally:
            context.detach(token)

    def _send_unsuppressed(
        self, messages: list[ChatMessage], output: type[BaseModel], temperature: float
    ) -> tuple[str, LLMUsage]:
        start = time.perf_counter()
        response = self._create(messages, output, temperature)
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content if choice is not None else None) or ""
        usage = response.usage
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None)
        return text, LLMUsage(
            prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
            completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
            seconds=time.perf_counter() - start,
            cached_prompt_tokens=cached if isinstance(cached, int) else None,
        )

    def _create(self, messages: list[ChatMessage], output: type[BaseModel], temperature: float) -> Any:
        """One request, retried where a retry can help (429, 408, 409, 5xx, timeouts, connection errors) with
        backoff, within ``timeout_s`` in all: the setting bounds what a caller waits, retries included. A refusal
        that names the structured-output mode steps down a mode and is not counted as a retry."""
        openai = self._openai
        self._refuse_if_down()
        deadline = time.monotonic() + self.config.timeout_s
        retries = 0
        with self._slow_notice():
            while True:
                mode = self._mode
                remaining = deadline - time.monotonic()
                try:
                    if remaining <= 0:
                        raise openai.APITimeoutError(request=None)
                    response = self._client.with_options(max_retries=0, timeout=remaining).chat.completions.create(
                        model=self.model_name,
                        messages=[m.model_dump() for m in messages],
                        response_format=self._response_format(output),
                        temperature=temperature,
                        max_tokens=self.config.max_output_tokens,
                    )
                except openai.APIStatusError as error:
                    if self._auto_mode and mode in _STEP_DOWN and _about_response_format(error):
                        self._step_down(mode, error)
                        continue
                    transient = error.status_code >= 500 or error.status_code in (408, 409, 429)
                    if transient and self._pause_before_retry(retries, deadline, error):
                        retries += 1
                        continue
                    if isinstance(error, openai.BadRequestError):
                        raise LLMError(f"{self._where()} refused the request: {error}") from None
                    raise self._failed(error, retries) from None
                except openai.APIError as error:  # connection refused or reset, timed out
                    if self._pause_before_retry(retries, deadline, error):
                        retries += 1
                        continue
                    raise self._failed(error, retries) from None
                self._confirm(mode)
                self._answered()
                return response

    def _fix(self, error: Exception, *, model: bool = False) -> str:
        """What to do about ``error``: a timeout is a server up but slow (a busy CPU, a long prompt), whose fix is
        time; anything else, the endpoint's settings."""
        if isinstance(error, self._openai.APITimeoutError):
            longer = max(600, 2 * self.config.timeout_s)
            return (
                f"No answer within {self.config.timeout_s:g} s, retries included: on a slow or busy machine give it "
                f"longer (REFLECT_LLM_TIMEOUT_S, e.g. {longer:g}), or check that the server is up"
            )
        names = (
            "REFLECT_LLM_BASE_URL / REFLECT_LLM_MODEL / REFLECT_LLM_API_KEY"
            if model
            else ("REFLECT_LLM_BASE_URL / REFLECT_LLM_API_KEY")
        )
        return f"Check that the server is up and {names} are right"

    def _pause_before_retry(self, retries: int, deadline: float, error: Exception) -> bool:
        """Wait before retry ``retries + 1`` and say True, or say False when no retry is left or no time for one.
        The pause is the server's ``Retry-After`` (and up to a tenth more), else 0.5 s doubling up to 8 s, each
        drawn between half and all of that (full jitter: workers throttled together do not all come back at once)."""
        if retries >= self.config.max_retries:
            return False
        pause = min(0.5 * 2**retries, 8.0) * random.uniform(0.5, 1.0)
        after = _retry_after(error)
        if after is not None:
            pause = after * random.uniform(1.0, 1.1)
        if time.monotonic() + pause >= deadline:
            return False
        time.sleep(max(0.0, pause))
        return True

    @contextlib.contextmanager
    def _slow_notice(self) -> Iterator[None]:
        """While a request goes unanswered past :data:`SLOW_NOTICE_S`, say once what it waits for."""
        if self.slow_notice_s is None:
            yield
            return
        after = min(self.slow_notice_s, self.config.timeout_s / 3)
        stage = _stage.get()
        timer = threading.Timer(
            after,
            lambda: _log.warning(
                "waiting for %s%s: no answer after %.0f s; it is given up to %.0f s in all, retries included "
                "(REFLECT_LLM_TIMEOUT_S)",
                self._where(),
                f" for {stage}" if stage else "",
                after,
                self.config.timeout_s,
            ),
        )
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    slow_notice_s: float | None = SLOW_NOTICE_S
    """Seconds of silence after which a request says what it waits for (None: never)."""

    def _refuse_if_down(self) -> None:
        with _health_lock:
            health = _health.get(self._endpoint)
            if health is None or health.down is None:
                return
            left = health.cool_off_s - (time.monotonic() - health.down_since)
            if left > 0:
                down = health.down
                raise EndpointDownError(str(down), endpoint=down.endpoint, busy=down.busy, retry_after_s=left)
            health.down = None  # cooled off: the next request tries the endpoint again
            health.streak = 0

    def _answered(self) -> None:
        with _health_lock:
            _health.pop(self._endpoint, None)

    def _failed(self, error: Exception, retries: int) -> LLMError:
        said = str(error).rstrip(".")
        fix = self._fix(error)
        message = f"{self._where()} failed after {retries} retries: {said}. {fix}"
        busy = _busy(error, self._openai)
        failure = EndpointBusyError(message, retry_after_s=_retry_after(error)) if busy else LLMError(message)
        signature = _failure_signature(error)
        if signature is None:
            return failure
        with _health_lock:
            health = _health.setdefault(self._endpoint, _Health())
            health.streak = health.streak + 1 if health.signature == signature else 1
            health.signature = signature
            if health.streak >= STOP_AFTER and health.down is None:
                # an endpoint that said when to come back (Retry-After) is tried again then, others after a pause
                asked = _retry_after(error) if busy else None
                health.cool_off_s = min(_COOL_OFF_S, asked) if asked is not None else _COOL_OFF_S
                health.down = EndpointDownError(
                    f"{self._where()} failed {health.streak} times in a row the same way ({str(error).rstrip('.')}). "
                    + self._fix(error, model=True),
                    endpoint=self._where(),
                    busy=busy,
                    retry_after_s=health.cool_off_s,
                )
                health.down_since = time.monotonic()
        return failure

    def _step_down(self, mode: SchemaMode, error: Exception) -> None:
        lower = _STEP_DOWN[mode]
        with self._lock:
            if self._mode is mode:
                self._mode = lower
        _log.info("%s refused %s structured output (%s); trying %s", self._where(), mode.value, error, lower.value)

    def _confirm(self, mode: SchemaMode) -> None:
        if self._confirmed:
            return
        with self._lock:
            self._confirmed = True
        with _negotiated_lock:
            first = self._endpoint not in _negotiated
            _negotiated[self._endpoint] = mode
        if first:
            _log.warning(
                "%s: structured output as %s (set REFLECT_LLM_SCHEMA_MODE to force one)", self._where(), mode.value
            )

    def _where(self) -> str:
        return f"{ENDPOINT_ERROR_PREFIX}{self.config.base_url or '(OpenAI default)'} (model {self.model_name})"
