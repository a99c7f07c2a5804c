"""One config object per concern: explicit argument > ``REFLECT_*`` environment variable > default.

Settings are validated once, here, with messages that name the setting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reflect_otel.errors import ConfigError

__all__ = [
    "LLM_VARIABLES",
    "REFLECT_VARIABLES",
    "GateMode",
    "InjectionRole",
    "LLMConfig",
    "ReflectConfig",
    "SchemaMode",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class InjectionRole(str, Enum):
    """The chat role the correction is injected as. Some chat templates reject a system message in the middle of
    a conversation: use ``user`` for those models. Defined here, below the replay contract, because the settings
    choose it; :mod:`reflect_otel.replay` re-exports it."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"


class SchemaMode(str, Enum):
    """How structured output is asked of the endpoint."""

    JSON_SCHEMA = "json_schema"
    """OpenAI's ``{"type": "json_schema", "json_schema": {...}}``."""
    JSON_OBJECT_SCHEMA = "json_object_schema"
    """``{"type": "json_object", "schema": {...}}``: llama.cpp's servers constrain decoding to the schema."""
    JSON_OBJECT = "json_object"
    """Plain JSON mode; the schema is stated in the prompt and the output validated."""


ModelT = TypeVar("ModelT", bound=BaseModel)


def _validated(cls: type[ModelT], values: dict[str, Any], variable: Callable[[str], str]) -> ModelT:
    """``cls(**values)``, or a :class:`ConfigError` naming the setting and the variable that sets it."""
    try:
        return cls(**values)
    except ValidationError as error:
        first = error.errors()[0]
        setting = ".".join(str(p) for p in first["loc"])
        hint = variable(setting)
        raise ConfigError(
            f"setting {setting!r}: {first['msg']}" + (f" (environment: {hint})" if hint else "")
        ) from None


def _env(names: tuple[str, ...], environ: Mapping[str, str]) -> str | None:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return None


class LLMConfig(BaseModel):
    """Where the auditor LLM is. With no endpoint configured, the local llama.cpp server runs ``REFLECT_LOCAL_MODEL``."""

    model_config = _FROZEN

    model: str | None = Field(default=None, description="The endpoint's model name (the local server's own).")
    base_url: str | None = Field(default=None, description="An OpenAI-compatible endpoint; unset: the local server.")
    api_key: str | None = Field(default=None, description="The endpoint's key; setting it alone means OpenAI.")
    schema_mode: SchemaMode | None = Field(
        default=None,
        description="How structured output is asked: json_schema, json_object_schema or json_object; unset: "
        "json_schema, falling back on refusal.",
    )
    timeout_s: float = Field(default=120.0, gt=0, description="Seconds one LLM request may take, its retries included.")
    max_retries: int = Field(default=3, ge=0, le=10)
    temperature: float = Field(default=0.0, ge=0, le=2)
    max_output_tokens: int = Field(default=1024, ge=16)
    context_tokens: int | None = Field(
        default=None,
        ge=1024,
        description="The model's context window, tokens: prompts about a trace are shortened to fit it (unset: the "
        "local server's context for the local backend, else prompts are not shortened).",
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Requests in flight to the model at once across every 'reflect-otel worker' of a PostgreSQL store "
        "that names the same model (advisory locks on the database; --llm-concurrency overrides); unset: no cap.",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        """Surrounding whitespace dropped (a value pasted with its newline); anything else that is not one
        http(s) URL with a host is refused here, naming the setting, not by the HTTP client deep in a run."""
        if url is None or not url.strip():
            return None
        url = url.strip()
        shown = url if len(url) <= 80 else url[:77] + "..."
        if re.search(r"[\s\x00-\x1f\x7f]", url):
            raise ValueError(
                f"{shown!r} holds whitespace or control characters; give one URL such as http://host:8000/v1"
            )
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018  # raises on a port that is not a number
        except ValueError:
            raise ValueError(f"{shown!r} is not a URL; give one such as http://host:8000/v1") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{shown!r} is not an http:// or https:// URL with a host, such as http://host:8000/v1")
        return url

    @property
    def is_configured(self) -> bool:
        """True when an endpoint (base URL or API key) was given; otherwise the local backend is the default."""
        return bool(self.base_url or self.api_key)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **explicit: Any) -> LLMConfig:
        """Explicit keyword arguments, then ``REFLECT_LLM_*``, then the standard ``OPENAI_*`` variables."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {setting: _env(names, env) for setting, names in LLM_VARIABLES.items()}
        values = {k: v for k, v in values.items() if v is not None}
        values.update({k: v for k, v in explicit.items() if v is not None})
        return _validated(cls, values, lambda setting: " or ".join(LLM_VARIABLES.get(setting, ())))


LLM_VARIABLES: dict[str, tuple[str, ...]] = {
    "model": ("REFLECT_LLM_MODEL", "OPENAI_MODEL"),
    "base_url": ("REFLECT_LLM_BASE_URL", "OPENAI_BASE_URL"),
    "api_key": ("REFLECT_LLM_API_KEY", "OPENAI_API_KEY"),
    "schema_mode": ("REFLECT_LLM_SCHEMA_MODE",),
    "timeout_s": ("REFLECT_LLM_TIMEOUT_S",),
    "context_tokens": ("REFLECT_LLM_CONTEXT",),
    "concurrency": ("REFLECT_LLM_CONCURRENCY",),
}
"""LLMConfig's variables, the first of each pair winning."""


class GateMode(str, Enum):
    """What the faithfulness gate does with an unfaithful first regenerated step."""

    OFF = "off"
    SOFT = "soft"
    """Record the verdict and go on."""
    HARD = "hard"
    """An unfaithful proposal is not replayed (the next proposal is tried instead)."""


class ReflectConfig(BaseModel):
    """The REFLECT pipeline's settings; defaults are the paper's (D = K = 3, hard gate), with its gate's retries
    replaced by sampled proposals (``proposal_samples``) that a hard gate screens before they cost a replay."""

    model_config = _FROZEN

    rounds: int = Field(default=3, ge=1, le=10, description="D: diagnosis rounds.")
    rollback_points: int = Field(default=3, ge=1, le=10, description="K: rollback points per round.")
    gate: GateMode = Field(
        default=GateMode.HARD,
        description="The faithfulness gate on a guidance correction's new step: hard (an unfaithful proposal is "
        "not replayed), soft (replayed and recorded), off (not judged). Only a step the gate judged faithful can "
        "verify.",
    )
    max_replays: int | None = Field(
        default=12,
        ge=1,
        le=200,
        description="Replays one attribution may run, controls and sensitivity arms included (None: no cap); every "
        "method compared gets the same budget. A test needs three arms: 3 replays with a deterministic adapter, "
        "3 x verify_samples with a sampled one.",
    )
    verify_samples: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Replays per arm of a controlled test (intervention, control and sensitivity) when the adapter's "
        "continuations are sampled; a deterministic adapter needs one per arm.",
    )
    proposal_samples: int = Field(
        default=3,
        ge=1,
        le=10,
        description="The agent's own decisions sampled at a rollback point for a guidance correction (or bare "
        "resampling); each distinct one that changes the step is replayed as an action.",
    )
    proposal_temperature: float = Field(
        default=1.0,
        ge=0,
        le=2,
        description="The temperature proposals are sampled at (the agent's decisions, the auditor's extra "
        "diagnoses); the continuations a replay runs are the agent's own, greedy where the adapter is deterministic.",
    )
    auditor_samples: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Diagnoses per round: the first greedy, the others sampled at proposal_temperature; each "
        "corrected call is an action to test.",
    )
    use_diagnostician: bool = Field(default=True, description="Ablation: off gives a null repair plan.")
    actions: bool = Field(
        default=True,
        description="Concrete corrections: the diagnosis writes the corrected step (a call of one of the agent's "
        "tools), evidence rules propose others, and each is replayed as an action; off tries the paper's guidance "
        "text only.",
    )
    max_corrections: int = Field(
        default=3,
        ge=0,
        le=10,
        description="M: concrete corrections (actions) replayed per round, the auditor's first, then the evidence "
        "rules'; each costs one replay. Guidance is tried after them at the K rollback points.",
    )
    relocalize: bool = Field(default=True, description="Ablation: off keeps the first localization every round.")
    max_field_chars: int = Field(default=500, ge=50, description="Trace fields are cut to this many characters.")
    include_expected_answer: bool = Field(
        default=True, description="Oracle regime: show the expected answer to the auditor; else [WITHHELD]."
    )
    injection_role: InjectionRole = InjectionRole.SYSTEM
    domain_context_label: str = Field(default="Task context", description="Heading of the domain-context slot.")
    attribute_uncertain: bool = Field(
        default=False,
        description="Online: also attribute runs the verifier could not judge (UNCERTAIN: its audit failed or was "
        "degenerate). They are counted (reflect.traces.uncertain) either way.",
    )
    evidence_in_prompts: bool = Field(
        default=True,
        description="Show the evidence checks' findings (reflect_otel.flagging.evidence) to the auditor as a data block "
        "after the steps; off measures the auditor without them.",
    )
    prompt_layout: Literal["shared_prefix", "per_stage"] = Field(
        default="shared_prefix",
        description="shared_prefix: every stage's prompt starts with the same system message and trace, so prompt "
        "caches reuse it; per_stage: the layout before (each stage's own system message), kept for comparison.",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **explicit: Any) -> ReflectConfig:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {key: env[var] for key, var in REFLECT_VARIABLES.items() if env.get(var)}
        values.update({k: v for k, v in explicit.items() if v is not None})
        return _validated(cls, values, lambda setting: REFLECT_VARIABLES.get(setting, ""))


REFLECT_VARIABLES: dict[str, str] = {
    "rounds": "REFLECT_ROUNDS",
    "rollback_points": "REFLECT_ROLLBACK_POINTS",
    "gate": "REFLECT_GATE",
    "max_field_chars": "REFLECT_MAX_FIELD_CHARS",
    "evidence_in_prompts": "REFLECT_EVIDENCE_IN_PROMPTS",
    "attribute_uncertain": "REFLECT_ATTRIBUTE_UNCERTAIN",
    "max_replays": "REFLECT_MAX_REPLAYS",
    "verify_samples": "REFLECT_VERIFY_SAMPLES",
    "proposal_samples": "REFLECT_PROPOSAL_SAMPLES",
    "proposal_temperature": "REFLECT_PROPOSAL_TEMPERATURE",
    "auditor_samples": "REFLECT_AUDITOR_SAMPLES",
    "actions": "REFLECT_ACTIONS",
    "max_corrections": "REFLECT_MAX_CORRECTIONS",
}
"""The pipeline settings a variable sets (the others are set by flags or arguments)."""
