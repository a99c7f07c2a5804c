"""Any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp, ...) through the ``openai`` client."""

from __future__ import annotations

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

__all__ = ["OpenAICompatibleLLM"]


class OpenAICompatibleLLM:
    """Structured output via ``response_format``; with no schema mode configured it asks for ``json_schema`` and
    falls back to plain JSON mode for good if the endpoint refuses it. The client retries 429, 5xx, timeouts and
    connection errors with backoff (``max_retries``); after that an :class:`LLMError` names the endpoint."""

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
        self._mode = config.schema_mode or SchemaMode.JSON_SCHEMA
        self._auto_mode = config.schema_mode is None
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
    ) -> Completion[OutputT]:
        framed = [
            *messages[:-1],
            ChatMessage(role=messages[-1].role, content=messages[-1].content + "\n\n" + schema_instruction(output)),
        ]
        return complete_with_repair(lambda conversation: self._send(conversation, output), framed, output, check)

    def _response_format(self, output: type[BaseModel]) -> dict[str, Any]:
        schema = output.model_json_schema()
        if self._mode is SchemaMode.JSON_SCHEMA:
            return {"type": "json_schema", "json_schema": {"name": output.__name__, "schema": schema, "strict": False}}
        if self._mode is SchemaMode.JSON_OBJECT_SCHEMA:
            return {"type": "json_object", "schema": schema}
        return {"type": "json_object"}

    def _send(self, messages: list[ChatMessage], output: type[BaseModel]) -> tuple[str, LLMUsage]:
        # reflect-otel's own model calls must not show up as spans of the user's application (the auditor's
        # calls would be taken for agent runs), and inside a traced chat-model wrapper they would be duplicates
        token = context.attach(context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            return self._send_unsuppressed(messages, output)
        finally:
            context.detach(token)

    def _send_unsuppressed(self, messages: list[ChatMessage], output: type[BaseModel]) -> tuple[str, LLMUsage]:
        openai = self._openai
        start = time.perf_counter()
        while True:
            mode = self._mode
            try:
                response = self._client.chat.completions.create(
                    model=self.model_name,
                    messages=[m.model_dump() for m in messages],
                    response_format=self._response_format(output),
                    temperature=self.config.temperature,
                    max_tokens=self.config.max_output_tokens,
                )
                break
            except openai.BadRequestError as error:
                if self._auto_mode and mode is not SchemaMode.JSON_OBJECT:
                    with self._lock:  # this endpoint cannot do schemas: JSON mode from now on
                        self._mode = SchemaMode.JSON_OBJECT
                    continue
                raise LLMError(f"{self._where()} refused the request: {error}") from None
            except openai.APIError as error:
                raise LLMError(
                    f"{self._where()} failed after {self.config.max_retries} retries: {error}. "
                    "Check that the server is up and REFLECT_LLM_BASE_URL / REFLECT_LLM_API_KEY are right"
                ) from None
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content if choice is not None else None) or ""
        usage = response.usage
        return text, LLMUsage(
            prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
            completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
            seconds=time.perf_counter() - start,
        )

    def _where(self) -> str:
        return f"LLM endpoint {self.config.base_url or '(OpenAI default)'} (model {self.model_name})"
