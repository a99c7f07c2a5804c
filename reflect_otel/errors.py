"""Every error reflect-otel raises derives from :class:`ReflectError`; messages name the fix."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "InputError",
    "LLMError",
    "MissingDependencyError",
    "ReflectError",
    "ReplayError",
]


class ReflectError(Exception):
    """Base class of all reflect-otel errors."""


class InputError(ReflectError):
    """External input (spans, OTLP bodies, files, trace JSON) is malformed or over a limit."""


class ConfigError(ReflectError):
    """A setting is invalid; the message names the setting and the accepted values."""


class MissingDependencyError(ReflectError):
    """An optional dependency is not installed; the message gives the ``pip install`` line."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(f"{package} is not installed; install it with: pip install 'reflect-otel[{extra}]'")
        self.package = package
        self.extra = extra


class LLMError(ReflectError):
    """An LLM call failed after its retries, or its output never matched the schema."""


class ReplayError(ReflectError):
    """A replay could not be run (bad rollback point, agent failure, irreversible tool)."""
