"""The baselines' prompts: all-at-once, step-by-step, binary search, Reflexion and DoVer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from reflect_otel.llm.base import ChatMessage
from reflect_otel.prompts._render import (
    FROZEN,
    Confidence,
    Explanation,
    PromptContext,
    cut,
    data_block,
    reply_format,
    trace_prompt,
)
from reflect_otel.record import ErrorType
from reflect_otel.trace import Step

__all__ = [
    "AAOOutput",
    "BisectOutput",
    "HypothesesOutput",
    "Hypothesis",
    "ReasonOutput",
    "ReflectionOutput",
    "StepCheckOutput",
    "all_at_once",
    "bisect",
    "dover_hypotheses",
    "reason_for_step",
    "reflexion_extract",
    "reflexion_reflect",
    "step_check",
]


class AAOOutput(BaseModel):
    model_config = FROZEN
    error_step: int
    responsible_agent: str | None = Field(description="name")
    reason: Explanation = Field(description="why")
    error_type: ErrorType = Field(description="category")
    confidence: Confidence


class StepCheckOutput(BaseModel):
    model_config = FROZEN
    is_error: bool
    reason: Explanation = Field(description="why")


class BisectOutput(BaseModel):
    model_config = FROZEN
    half: Literal["first", "second"]
    reason: Explanation = Field(description="why")


class ReasonOutput(BaseModel):
    model_config = FROZEN
    reason: Explanation = Field(description="why")
    error_type: ErrorType = Field(description="category")
    confidence: Confidence


class ReflectionOutput(BaseModel):
    model_config = FROZEN
    reflection: Explanation = Field(description="text")


class Hypothesis(BaseModel):
    model_config = FROZEN
    step: int
    hypothesis: Explanation = Field(description="text")
    intervention: Explanation = Field(description="instruction")


class HypothesesOutput(BaseModel):
    model_config = FROZEN
    hypotheses: list[Hypothesis] = Field(min_length=1, max_length=5)


def all_at_once(ctx: PromptContext, steps: Sequence[Step]) -> list[ChatMessage]:
    task = (
        f"Identify the earliest decisive error step (1 to {len(steps)}): the step that, if fixed, would allow the "
        "run to succeed.\n" + reply_format(AAOOutput)
    )
    return trace_prompt(ctx, steps, "an expert auditor of agent failures", task)


def step_check(ctx: PromptContext, steps: Sequence[Step]) -> list[ChatMessage]:
    current = steps[-1].index
    task = f"Is step {current} the first decisive error of this failed run?\n" + reply_format(StepCheckOutput)
    return trace_prompt(ctx, steps, "an expert auditor checking an agent trace one step at a time", task)


def bisect(ctx: PromptContext, steps: Sequence[Step], first: range, second: range) -> list[ChatMessage]:
    task = (
        f"First half: steps {first.start}-{first.stop - 1}. Second half: steps {second.start}-{second.stop - 1}. "
        "Which half contains the earliest decisive error?\n" + reply_format(BisectOutput)
    )
    return trace_prompt(ctx, steps, "an expert auditor locating an error by bisection", task)


def reason_for_step(ctx: PromptContext, steps: Sequence[Step], index: int) -> list[ChatMessage]:
    task = f"The earliest decisive error is step {index}. Explain it. " + reply_format(ReasonOutput)
    return trace_prompt(ctx, steps, "an expert auditor of agent failures", task)


def reflexion_reflect(ctx: PromptContext, steps: Sequence[Step]) -> list[ChatMessage]:
    task = (
        "The steps above are your own trajectory, and the answer was judged incorrect. Reflect on what went wrong "
        "and what you should have done differently.\n" + reply_format(ReflectionOutput)
    )
    return trace_prompt(ctx, steps, "an agent reflecting on its own failed attempt", task)


def reflexion_extract(ctx: PromptContext, steps: Sequence[Step], reflection: str) -> list[ChatMessage]:
    task = (
        f"Reflection:\n{data_block('REFLECTION', cut(reflection, ctx.max_chars * 2))}\n\n"
        f"Based on the reflection, which step (1 to {len(steps)}) is the earliest decisive error?\n"
        + reply_format(AAOOutput)
    )
    return trace_prompt(ctx, steps, "an expert auditor of agent failures", task)


def reflexion_memory(reflection: str) -> str:
    """What Reflexion's retry is given: its reflection on the failed attempt, as the memory of a new attempt."""
    return (
        "Your previous attempt at this task failed. Your reflection on it:\n"
        f"{reflection}\n"
        "Keep it in mind in this new attempt."
    )


def dover_hypotheses(ctx: PromptContext, steps: Sequence[Step], count: int) -> list[ChatMessage]:
    task = (
        f"Propose up to {count} hypotheses for the failure, each naming the step it happened at (1 to "
        f"{len(steps)}) and a concrete intervention (an instruction to the agent at that step) that would fix it.\n"
        + reply_format(HypothesesOutput)
    )
    return trace_prompt(ctx, steps, "a debugging expert forming failure hypotheses for an agent trace", task)
