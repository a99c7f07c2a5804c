"""What the chain-of-thought agent is told, and what it writes (used by the demo agent and its replay adapter)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from reflect_otel.prompts._render import FROZEN

__all__ = ["CHAIN_OF_THOUGHT_PROMPT", "ReasoningContinuation"]

CHAIN_OF_THOUGHT_PROMPT = (
    "You solve the task step by step. Each step is one short line of reasoning. Continue the reasoning from "
    "where it stops (do not repeat earlier steps), then give the final answer in the form the task asks for: an "
    "option's label such as (B) where the task lists options, only the missing part where it asks to complete "
    "something."
)
"""Why the form: a replay answering "Melissa" where its run and the task's target write "(A)" was read as no answer
at all by BIG-Bench-Mistake's scoring (26 of 44 control replays in seed 48's first 18 traces, 374a535)."""


class ReasoningContinuation(BaseModel):
    """What a chain-of-thought agent writes: its reasoning steps, then its answer."""

    model_config = FROZEN
    steps: list[str] = Field(min_length=1, max_length=40)
    answer: str = Field(description="the final answer alone, in the form the task asks for")
