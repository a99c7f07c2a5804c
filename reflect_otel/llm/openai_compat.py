"""Any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp, ...) through the ``openai`` client."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import context
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from pydantic import BaseModel

from reflect_otel.config import LLMConfig, SchemaMode
from reflect_otel.errors import ConfigError, LLMError
from reflect_otel.llm.base import (
    ChatMessage,
    Check,
    Completion,
    LLMUsage,
    OutputT,
    complete_with_repair,
    schema_instruction,
)

__all__ = ["OpenAICompatibleLLM", "reset_negotiation"]

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
    """Forget which structured-output mode each endpoint accepted (for tests, or after reconfiguring a server)."""
    with _negotiated_lock:
        _negotiated.clear()


class OpenAICompatibleLLM:
    """Structured output via ``response_format``. With no schema mode configured the mode is negotiated per
    endpoint: ``json_schema``, then ``json_object`` with the schema (llama.cpp), then plain JSON mode with the schema
    in the prompt, stepping down when the endpoint refuses a mode in words that name it; the mode that worked is
    remembered for the endpoint (for the process) and logged once. ``REFLECT_LLM_SCHEMA_MODE`` forces one. The
    client retries 429, 5xx, timeouts and connection errors with backoff (``max_retries``), except while a mode is
    still being tried; after that an :class:`LLMError` names the endpoint."""

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
            max_retries=config.max_retries,
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

    def complete(
        self,
        messages: Sequence[ChatMessage],
        output: type[OutputT],
        *,
        stage: str,
        check: Check[OutputT] | None = None,
        temperature: float | None = None,
    ) -> Completion[OutputT]:
        instruction = schema_instruction(output)
        if messages and instruction in messages[0].content:
            framed = list(messages)  # the caller put the schema first, where a prompt cache keeps it
        else:  # last, after the content every stage shares
            last = messages[-1]
            framed = [*messages[:-1], ChatMessage(role=last.role, content=f"{last.content}\n\n{instruction}")]
        sampling = self.config.temperature if temperature is None else temperature
        return complete_with_repair(
            lambda conversation: self._send(conversation, output, sampling), framed, output, check
        )

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
        openai = self._openai
        probing = not self._confirmed  # a mode not yet known to work: no retries, so a refusal is seen at once
        retries_left = self.config.max_retries > 0
        client = self._client.with_options(max_retries=0) if probing else self._client
        while True:
            mode = self._mode
            try:
                response = client.chat.completions.create(
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
                if probing and retries_left and (error.status_code >= 500 or error.status_code in (408, 409, 429)):
                    probing, client = False, self._after_probe()  # transient, not about the mode: retry as usual
                    continue
                if isinstance(error, openai.BadRequestError):
                    raise LLMError(f"{self._where()} refused the request: {error}") from None
                raise self._failed(error) from None
            except openai.APIError as error:
                if probing and retries_left:
                    probing, client = False, self._after_probe()
                    continue
                raise self._failed(error) from None
            self._confirm(mode)
            return response

    def _after_probe(self) -> Any:
        """The client for the retries a failed probe still has (the probe was the first attempt), after a pause."""
        time.sleep(0.5)
        return self._client.with_options(max_retries=self.config.max_retries - 1)

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

    def _failed(self, error: Exception) -> LLMError:
        return LLMError(
            f"{self._where()} failed after {self.config.max_retries} retries: {error}. "
            "Check that the server is up and REFLECT_LLM_BASE_URL / REFLECT_LLM_API_KEY are right"
        )

    def _where(self) -> str:
        return f"LLM endpoint {self.config.base_url or '(OpenAI default)'} (model {self.model_name})"
