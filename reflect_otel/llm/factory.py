"""Choosing a backend by name: entry points in the group ``reflect_otel.llm`` (see :mod:`reflect_otel.plugins`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import NoReturn

from reflect_otel import plugins
from reflect_otel.config import LLMConfig
from reflect_otel.errors import LLMError
from reflect_otel.llm.base import ChatMessage, Check, Completion, OutputT, StructuredLLM
from reflect_otel.settings import settings

__all__ = ["LazyLLM", "NoModel", "make_llm"]


def make_llm(config: LLMConfig | None = None, *, backend: str | None = None) -> StructuredLLM:
    """The backend named by ``backend`` or ``REFLECT_LLM_BACKEND``; by default ``openai`` when an endpoint is
    configured, else ``local`` (the llama.cpp server with the default local model)."""
    config = config or LLMConfig.from_env()
    name = backend or settings().llm_backend or ("openai" if config.is_configured else "local")
    llm: StructuredLLM = plugins.load(plugins.LLM_BACKENDS, name)(config)
    return llm


class NoModel:
    """Stands in for a model where none is needed; calling it is a bug, reported clearly."""

    model_name = "none"

    def complete(
        self, messages: object, output: object, *, stage: str, check: object = None, temperature: object = None
    ) -> NoReturn:
        raise LLMError(f"no model is configured for stage {stage!r}")


class LazyLLM:
    """Makes its backend on first use, so that starting a local server happens off the caller's path (online
    mode builds everything at ``configure`` time and the worker thread makes the first call)."""

    def __init__(self, make: Callable[[], StructuredLLM]) -> None:
        self._make = make
        self._llm: StructuredLLM | None = None
        self._lock = threading.Lock()

    @property
    def inner(self) -> StructuredLLM:
        with self._lock:
            if self._llm is None:
                self._llm = self._make()
            return self._llm

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    def complete(
        self,
        messages: Sequence[ChatMessage],
        output: type[OutputT],
        *,
        stage: str,
        check: Check[OutputT] | None = None,
        temperature: float | None = None,
    ) -> Completion[OutputT]:
        return self.inner.complete(messages, output, stage=stage, check=check, temperature=temperature)
