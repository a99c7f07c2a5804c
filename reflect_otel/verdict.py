"""A verifier's answer about a trace (the contract lives in :mod:`reflect_otel.verifiers`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Verdict"]


class Verdict(BaseModel):
    """Is the trace's answer correct? ``is_correct`` is None when the verifier cannot tell."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verifier: str
    is_correct: bool | None
    extracted_answer: str | None = None
    confidence: float = Field(default=1.0, ge=0, le=1)
    score: float | None = Field(default=None, description="Verifier-specific: e.g. a proxy verifier's error signal.")
    label: str | None = None
    reasoning: str = ""
