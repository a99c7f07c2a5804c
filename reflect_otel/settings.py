"""Every ``REFLECT_*`` environment variable, read in one place and validated with a message naming the variable.

Two kinds, one table (:func:`variables`, printed by ``reflect-otel settings`` and copied into docs/settings.md):

* process settings (:class:`Settings`, pydantic-settings): the store, the LLM backend, the local model and its
  server, redaction, the proxy verifier's calibration. Read at each use, so a test or a process that sets a
  variable later is heard; :func:`settings` raises :class:`ConfigError` naming the bad variable.
* per-run settings, which a command's flags or a caller's arguments override: :class:`~reflect_otel.config.LLMConfig`
  (``REFLECT_LLM_*``, falling back on ``OPENAI_*``) and :class:`~reflect_otel.config.ReflectConfig` (the pipeline).

:func:`check_environment` validates all of them at once; the CLI calls it before any work starts.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from reflect_otel.config import LLM_VARIABLES, REFLECT_VARIABLES, LLMConfig, ReflectConfig
from reflect_otel.errors import ConfigError

__all__ = [
    "PREFIX",
    "Settings",
    "Variable",
    "check_environment",
    "check_spelling",
    "known_variables",
    "settings",
    "variables",
    "variables_markdown",
]

PREFIX = "REFLECT_"


class Settings(BaseSettings):
    """Process-wide settings; each field is the variable ``REFLECT_<FIELD>``."""

    # an empty variable counts as unset (``REFLECT_STORE= cmd`` must not mean a store named "")
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, extra="ignore", frozen=True, case_sensitive=False, env_ignore_empty=True
    )

    store: str | None = Field(
        default=None, description="Where records go: a DuckDB file (default ./reflect.duckdb); --store overrides."
    )
    llm_backend: str | None = Field(
        default=None,
        description="LLM backend by name (entry point group reflect_otel.llm_backends): openai when an endpoint is "
        "configured, else local.",
    )
    local_model: str | None = Field(
        default=None,
        description="The local model: a bundled name, a .gguf path, or hf:OWNER/REPO/FILE.gguf (opt-in download).",
    )
    local_model_path: str | None = Field(default=None, description="Older name of REFLECT_LOCAL_MODEL.")
    local_model_sha256: str | None = Field(
        default=None, description="Expected sha256 of an hf: download; the file is refused when it differs."
    )
    local_context: int = Field(default=8192, ge=512, le=131072, description="The local server's context, tokens.")
    local_threads: int | None = Field(
        default=None, ge=1, le=256, description="The local server's CPU threads (default: every core)."
    )
    cache_dir: Path | None = Field(
        default=None, description="Where the local model is assembled (default: the platform's user cache folder)."
    )
    redact_patterns: str = Field(
        default="",
        description='Extra redaction patterns, a JSON list of regular expressions (e.g. ["ghp_[A-Za-z0-9]{36}"]), '
        "applied to span text before it is stored, besides the built-in ones.",
    )
    proxy_calibration: Path | None = Field(
        default=None,
        description="A calibration file of the flagging verifiers' precision per basis and their score maps, measured "
        "and fitted on labelled runs of your agent (python -m benchmarks.flagging --live RESULTS --calibration-out "
        "FILE); default: none, verdicts show no confidence and scores are the share of resamples that did not "
        "reproduce the answer.",
    )
    flag_samples: int = Field(
        default=5,
        ge=1,
        le=16,
        description="Consistency check (--verifier consistency or combined): at most this many runs of the agent "
        "again on the same input, sampled, whose answers are compared with the original's in substance.",
    )
    flag_stop_lead: int = Field(
        default=2,
        ge=0,
        le=16,
        description="The consistency check stops resampling once the resamples that reproduce the answer outnumber "
        "those that do not, or the other way round, by this many (2: two alike stop it, a split draws more, up to "
        "REFLECT_FLAG_SAMPLES); 0: always run REFLECT_FLAG_SAMPLES.",
    )
    flag_threshold: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="A run is flagged (and so attributed) when its flagging score, how likely it is wrong, reaches "
        "this: lower flags more wrong runs and more right ones with them (false alarms, each an attribution), higher "
        "fewer of both. The score is fitted by the calibration file, else the share of resamples that did not "
        "reproduce the answer; the file records the threshold that flagged 80% of its wrong runs.",
    )
    flag_sample_rate: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="The share of runs (by trace id) the consistency check resamples; each costs "
        "up to REFLECT_FLAG_SAMPLES agent runs (REFLECT_FLAG_STOP_LEAD stops it sooner).",
    )
    flag_temperature: float = Field(
        default=0.7, ge=0.0, le=2.0, description="The temperature the consistency check's resamples run at."
    )
    deterministic_agent: bool | None = Field(
        default=None,
        description="Whether the demo agents' replays repeat exactly, so one replay per arm decides a controlled "
        "test (demo and eval --benchmark wtq-live; --deterministic-agent / --no-deterministic-agent override). Unset: "
        "only on the embedded local model (greedy, one request at a time); temperature 0 on a remote API is not "
        "repeatable, so there each arm runs REFLECT_VERIFY_SAMPLES replays.",
    )


def _variable(field: str) -> str:
    return PREFIX + field.upper()


def settings() -> Settings:
    """The process settings from the environment, or a :class:`ConfigError` naming the variable and what is wrong
    with it."""
    try:
        return Settings()
    except ValidationError as error:
        first = error.errors()[0]
        name = _variable(str(first["loc"][0])) if first["loc"] else PREFIX + "*"
        raise ConfigError(f"{name}={first.get('input')!r}: {first['msg']}; fix or unset the variable") from None


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Validate every ``REFLECT_*`` variable (process, LLM and pipeline settings) at once; raise the first
    :class:`ConfigError`, which names the variable. A ``REFLECT_*`` variable reflect-otel does not read but that is
    close to one it does (a misspelling, which would otherwise be silently ignored) is refused, naming the real one."""
    check_spelling(os.environ if environ is None else environ)
    settings()
    LLMConfig.from_env()
    ReflectConfig.from_env()


OTHER_VARIABLES = frozenset({"REFLECT_TEST_ENVS", "REFLECT_CI_VENV"})
"""``REFLECT_*`` variables the project's own tooling reads (the tests' side environments, CI's venv)."""


def known_variables() -> frozenset[str]:
    """Every ``REFLECT_*`` variable that means something here."""
    names = {name for variable in variables() for name in variable.name.split(" / ")}
    return frozenset(name for name in names if name.startswith(PREFIX)) | OTHER_VARIABLES


def check_spelling(environ: Mapping[str, str]) -> None:
    """Refuse a ``REFLECT_*`` variable that is unknown but close to a known one (``REFLECT_ROUDNS``), naming the
    known one; an unknown name close to none is left alone (it may be another tool's)."""
    known = known_variables()
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in known:
            continue
        close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.8)
        if close:
            raise ConfigError(
                f"{name} is not a reflect-otel variable: did you mean {close[0]}? Rename it, or unset it "
                "('reflect-otel settings' lists every variable)"
            )


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    default: str
    description: str


def _default(value: Any) -> str:
    if value is None or value == "":
        return "unset"
    return str(value.value if hasattr(value, "value") else value)


def variables() -> list[Variable]:
    """Every variable, with its default and what it does: process settings, then LLM, then pipeline settings."""
    rows = [
        Variable(_variable(name), _default(field.default), field.description or "")
        for name, field in Settings.model_fields.items()
    ]
    for setting, names in LLM_VARIABLES.items():
        field = LLMConfig.model_fields[setting]
        rows.append(Variable(" / ".join(names), _default(field.default), field.description or ""))
    for setting, name in REFLECT_VARIABLES.items():
        field = ReflectConfig.model_fields[setting]
        rows.append(Variable(name, _default(field.default), field.description or ""))
    return rows


def variables_markdown() -> str:
    """:func:`variables` as a Markdown table (the one in docs/settings.md)."""
    lines = ["| variable | default | what it sets |", "|---|---|---|"]
    lines += [f"| `{v.name}` | {v.default} | {v.description.replace('|', '/')} |" for v in variables()]
    return "\n".join(lines)
