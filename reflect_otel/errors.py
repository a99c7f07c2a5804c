"""Every error reflect-otel raises derives from :class:`ReflectError`; messages name the fix."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EndpointBusyError",
    "EndpointDownError",
    "InputError",
    "LLMError",
    "MissingDependencyError",
    "NoModelError",
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


class EndpointBusyError(LLMError):
    """An LLM endpoint was busy or slow, still after the request's retries: it answered 429, 408, 409 or 5xx, did
    not answer in time, or could not be connected to. A later try may well succeed, so a worker that can wait does
    (:class:`~reflect_otel.llm.patient.PatientLLM`). ``retry_after_s`` is the pause the endpoint asked for
    (``Retry-After``), when it said."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EndpointDownError(LLMError):
    """An LLM endpoint failed the same way on several requests in a row (refused, unreachable, timed out, or a key
    or model it does not know): the message names its URL and the cause once, and a command stops. ``endpoint``
    is how the endpoint's other errors name it; ``busy`` says the failures were of the kind
    :class:`EndpointBusyError` names (worth waiting for), and ``retry_after_s`` how long until it is tried
    again."""

    def __init__(
        self, message: str, *, endpoint: str = "", busy: bool = False, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.busy = busy
        self.retry_after_s = retry_after_s


class NoModelError(LLMError):
    """No model can be had here: no endpoint is configured and the local model is not installed (the light
    install). The message names both ways to get one."""


class ReplayError(ReflectError):
    """A replay could not be run (bad rollback point, agent failure, irreversible tool)."""
