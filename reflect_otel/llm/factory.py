"""Choosing a backend: entry points in the group ``reflect_otel.llm`` map a name to ``factory(LLMConfig)``."""

from __future__ import annotations

import os
from importlib.metadata import entry_points

from reflect_otel.config import LLMConfig
from reflect_otel.errors import ConfigError
from reflect_otel.llm.base import StructuredLLM

__all__ = ["LLM_GROUP", "make_llm"]

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
