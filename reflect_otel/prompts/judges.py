"""Judges: the self-verifier (is this answer correct, without ground truth?) and the evaluation's explanation
judge (does an explanation name the same error as a human's description?)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from reflect_otel.llm.base import ChatMessage
from reflect_otel.prompts._render import (
    FROZEN,
    Confidence,
    PromptContext,
    cut,
    data_block,
    messages,
    reply_format,
)
from reflect_otel.trace import Step

__all__ = ["SelfVerifyOutput", "SimilarityOutput", "explanation_similarity", "self_verify"]


class SelfVerifyOutput(BaseModel):
    model_config = FROZEN
    is_correct: bool
    confidence: Confidence
    reasoning: str = Field(description="why")


class SimilarityOutput(BaseModel):
    model_config = FROZEN
    similarity: Confidence
    reasoning: str = Field(description="why")


def self_verify(ctx: PromptContext, steps: Sequence[Step]) -> list[ChatMessage]:
    header = f"{ctx.header(with_answers=False)}\n\nAgent reasoning:\n"
    answer = f"\n\nAgent answer:\n{data_block('AGENT_ANSWER', cut(ctx.agent_answer, ctx.max_chars))}\n\n"
    run = ctx.with_steps(steps, lambda shown: f"{header}{data_block('STEPS', shown)}{answer}")
    user = run + "Judge whether the agent's answer is correct.\n" + reply_format(SelfVerifyOutput)
    return messages("a careful judge of an agent's answer", user)


def explanation_similarity(explanation: str, reference: str, max_chars: int) -> list[ChatMessage]:
    """The LLM judge of how well an explanation matches a human's description of the same error."""
    user = (
        f"Explanation to judge:\n{data_block('EXPLANATION', cut(explanation, max_chars * 2))}\n\n"
        f"Human description of the error:\n{data_block('REFERENCE', cut(reference, max_chars * 2))}\n\n"
        "How well does the explanation identify the same error as the human description? 1.0 is the same error "
        "and cause, 0.0 unrelated.\n" + reply_format(SimilarityOutput)
    )
    return messages("a judge comparing two explanations of an agent's error", user)
