"""Replay endpoints of agents in other processes, from a file the operator writes (``--replay-config FILE``).

Only the URLs in that file are ever called: a URL found in a span attribute, a trace's metadata or any other trace
content is never followed (trace content is data from the agent's inputs and tools; following it would let a
prompt injection make the collector call any address it can reach). The file, TOML::

    [[endpoint]]
    service = "table-agent"            # the agent's resource service.name (required)
    agent = "table_qa"                 # optional: only runs of this agent (the root span's agent name)
    url = "http://10.0.0.7:8900/replay"
    timeout_s = 300                    # optional, default 300
    deterministic = true               # optional: the agent replays greedily (one replay per arm decides)
    propose = true                     # optional: the endpoint serves proposals (protocol v3)
    resample = true                    # optional: the endpoint serves resampled runs (protocol v3)
    corrections = true                 # optional: the endpoint runs the agent's own correction rules (v3)
    max_response_bytes = 67108864      # optional, default 64 MiB
    headers = { "X-Team" = "search" }                       # optional, sent as written
    headers_from_env = { "Authorization" = "AGENT_TOKEN" }  # optional: header -> variable holding its value

The first endpoint whose ``service`` (and ``agent``, when set) match a trace serves its replays. Credentials come
from environment variables named in the file, never from the file's text or from spans.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from reflect_otel.errors import ConfigError
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.replay import ReplayAdapter
from reflect_otel.replay_adapters.http import HTTPReplayAdapter, HTTPReplayOptions
from reflect_otel.trace import StructuredTrace

__all__ = ["MAX_CONFIG_BYTES", "ReplayEndpoint", "ReplayEndpoints", "load_replay_endpoints"]

MAX_CONFIG_BYTES = 1 << 20
_Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256)]
_HeaderName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")]


class ReplayEndpoint(BaseModel):
    """One agent's replay endpoint (see the module's description for the file)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    service: _Name
    agent: _Name | None = None
    url: Annotated[str, StringConstraints(max_length=2_048)]
    timeout_s: float = Field(default=300.0, gt=0, le=3_600)
    max_response_bytes: int = Field(default=64 << 20, ge=1_024, le=1 << 30)
    headers: dict[_HeaderName, Annotated[str, StringConstraints(max_length=8_192)]] = Field(default_factory=dict)
    headers_from_env: dict[_HeaderName, _Name] = Field(default_factory=dict)
    deterministic: bool = False
    propose: bool = False
    resample: bool = False
    corrections: bool = False

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
        if parts.username or parts.password:
            raise ValueError("put credentials in headers_from_env, not in the URL")
        return url

    def matches(self, trace: StructuredTrace) -> bool:
        return trace.source.service == self.service and (self.agent is None or trace.agent == self.agent)

    def resolved_headers(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``headers`` plus each ``headers_from_env`` header read from ``environ``; raises :class:`ConfigError`
        naming a variable that is not set."""
        missing = [var for var in self.headers_from_env.values() if not environ.get(var)]
        if missing:
            raise ConfigError(
                f"replay endpoint of service {self.service!r}: set {', '.join(sorted(set(missing)))} (named in "
                "headers_from_env), or remove it from the file"
            )
        return {**self.headers, **{name: environ[var] for name, var in self.headers_from_env.items()}}

    def options(self, environ: Mapping[str, str]) -> HTTPReplayOptions:
        """The HTTP adapter's options this endpoint's entry sets (headers resolved as :meth:`resolved_headers`)."""
        return HTTPReplayOptions(
            timeout_s=self.timeout_s,
            headers=self.resolved_headers(environ),
            max_response_bytes=self.max_response_bytes,
            deterministic=self.deterministic,
            proposes=self.propose,
            resamples=self.resample,
            corrects=self.corrections,
        )


class ReplayEndpoints:
    """A replay finder (``(trace, llm) -> adapter or None``) over the endpoints of one file: an HTTP adapter for a
    trace whose service an endpoint names, else None (the attribution is localization-only)."""

    def __init__(self, endpoints: list[ReplayEndpoint], environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.endpoints = endpoints
        self._adapters: list[ReplayAdapter] = [HTTPReplayAdapter(e.url, options=e.options(env)) for e in endpoints]

    def __call__(self, trace: StructuredTrace, llm: StructuredLLM) -> ReplayAdapter | None:
        for endpoint, adapter in zip(self.endpoints, self._adapters, strict=True):
            if endpoint.matches(trace):
                return adapter
        return None


def load_replay_endpoints(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> ReplayEndpoints:
    """The endpoints of a TOML file (see the module's description); raises :class:`ConfigError` naming the fix."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--replay-config {file}: no such file")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"--replay-config {file}: larger than {MAX_CONFIG_BYTES} bytes; is it the right file?")
    try:
        document = tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"--replay-config {file}: not valid TOML: {error}") from None
    unknown = set(document) - {"endpoint"}
    if unknown:
        raise ConfigError(f"--replay-config {file}: unknown table(s) {sorted(unknown)}; use [[endpoint]] entries")
    raw = document.get("endpoint", [])
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"--replay-config {file}: no [[endpoint]] entries")
    endpoints = []
    for number, entry in enumerate(raw, start=1):
        try:
            endpoints.append(ReplayEndpoint.model_validate(entry))
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}" for e in error.errors())
            raise ConfigError(f"--replay-config {file}: endpoint {number}: {problems}") from None
    return ReplayEndpoints(endpoints, environ)
