"""Choosing a backend: entry points in the group ``reflect_otel.llm`` map a name to ``factory(LLMConfig)``."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from typing import NoReturn

from reflect_otel.config import LLMConfig
from reflect_otel.errors import ConfigError, LLMError
from reflect_otel.llm.base import StructuredLLM

__all__ = ["LLM_GROUP", "NO_MODEL_METHODS", "NoModel", "make_llm", "model_for"]

LLM_GROUP = "reflect_otel.llm"


def make_llm(config: LLMConfig | None = None, *, backend: str | None = None) -> StructuredLLM:
    """The backend named by ``backend`` or ``REFLECT_LLM_BACKEND``; by default ``openai`` when an endpoint is
    configured, else ``local`` (the SmolLM2 server)."""
    config = config or LLMConfig.from_env()
    name = backend or os.environ.get("REFLECT_LLM_BACKEND") or ("openai" if config.is_configured else "local")
    found = {entry.name: entry for entry in entry_points(group=LLM_GROUP)}
    if name not in found:
        raise ConfigError(f"unknown LLM backend {name!r}; installed: {', '.join(sorted(found)) or 'none'}")
    llm: StructuredLLM = found[name].load()(config)
    return llm


NO_MODEL_METHODS = frozenset({"first-step", "last-step"})
"""Methods that call no model: no endpoint is needed (and no local server is started) for them."""


class NoModel:
    """Stands in for a model where none is needed; calling it is a bug, reported clearly."""

    model_name = "none"

    def complete(self, messages: object, output: object, *, stage: str, check: object = None) -> NoReturn:
        raise LLMError(f"no model is configured for stage {stage!r}")


def model_for(method: str, config: LLMConfig | None = None) -> StructuredLLM:
    """The configured model, or :class:`NoModel` for methods that need none."""
    return NoModel() if method in NO_MODEL_METHODS else make_llm(config)
