"""What the chain-of-thought agent is told, and what it writes (used by the demo agent and its replay adapter)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from reflect_otel.prompts._render import FROZEN

__all__ = ["CHAIN_OF_THOUGHT_PROMPT", "ReasoningContinuation"]

CHAIN_OF_THOUGHT_PROMPT = (
    "You solve the task step by step. Each step is one short line of reasoning. Continue the reasoning from "
    "where it stops (do not repeat earlier steps), then give the final answer."
)
"""No answer form is asked for here. Asking for an option's label (0a7c766) made the default model answer "What is
7 + 5?" in one long line with 17 (CI), and it still answered an option's text where options were listed, in the system
or the user message; the BIG-Bench-Mistake verifier reads an option's text as its label instead."""


class ReasoningContinuation(BaseModel):
    """What a chain-of-thought agent writes: its reasoning steps, then its answer."""

    model_config = FROZEN
    steps: list[str] = Field(min_length=1, max_length=40)
    answer: str = Field(description="the final answer alone, in the form the task asks for")
