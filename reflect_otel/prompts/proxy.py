"""The plan-anchored proxy verifier's prompts: anchors from the question alone, then a chunked audit."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field

from reflect_otel.llm.base import ChatMessage
from reflect_otel.prompts._render import FROZEN, cut, data_block, messages

__all__ = [
    "Anchors",
    "AuditOutput",
    "AuditedStep",
    "Category",
    "HardAnchors",
    "Plan",
    "anchors_prompt",
    "audit_prompt",
]

Category = Literal[
    "Housekeeping",
    "Aligned",
    "Valid_Alternative",
    "Recovery",
    "Constraint_Drop",
    "Evidence_Contradiction",
    "Unsupported_Jump",
    "Missed_Required_Subgoal",
    "Output_Drift",
]


class HardAnchors(BaseModel):
    model_config = FROZEN
    entities: list[str] = Field(max_length=20)
    filters: list[str] = Field(max_length=20)
    target_property: str
    operation: Literal["count", "lookup", "compare", "aggregate", "other"]
    output_form: str


class Plan(BaseModel):
    model_config = FROZEN
    subgoals: list[str] = Field(min_length=1, max_length=12)


class Anchors(BaseModel):
    model_config = FROZEN
    hard: HardAnchors
    plans: list[Plan] = Field(min_length=1, max_length=2)


class AuditedStep(BaseModel):
    model_config = FROZEN
    macro_step: int
    category: Category
    severity: Literal["critical", "major", "minor"]
    anchor: Literal["hard", "soft", "none"]
    rationale: str


class AuditOutput(BaseModel):
    model_config = FROZEN
    steps: list[AuditedStep] = Field(max_length=40)


def anchors_prompt(question: str, max_chars: int) -> list[ChatMessage]:
    user = (
        f"Question:\n{data_block('QUESTION', cut(question, max_chars * 4))}\n\n"
        "From the question alone, list its hard anchors (required entities or tables, filters and conditions, "
        "the target property, the operation: count, lookup, compare, aggregate or other, and the output form) "
        "and one or two plausible plans, each an ordered list of subgoals."
    )
    return messages("a planner", user)


def audit_prompt(
    question: str, anchors: Anchors, listing: str, window: range, max_chars: int, evidence: str = ""
) -> list[ChatMessage]:
    """The audit of the macro-steps in ``window``, rendered in ``listing``; ``evidence`` is the evidence checks'
    findings about the whole run (:func:`reflect_otel.flagging.evidence.render_findings`), shown as data."""
    first, last = window.start, window.stop - 1
    checks = (
        f"Automatic checks of the steps (facts computed without judgement):\n"
        f"{data_block('EVIDENCE', cut(evidence, max_chars * 4))}\n\n"
        if evidence
        else ""
    )
    user = (
        f"Question:\n{data_block('QUESTION', cut(question, max_chars * 4))}\n\n"
        f"Anchors:\n{data_block('ANCHORS', json.dumps(anchors.model_dump(), ensure_ascii=False))}\n\n"
        f"Macro-steps {first} to {last}:\n{data_block('MACRO_STEPS', listing)}\n\n{checks}"
        "Classify every macro-step as one of Housekeeping, Aligned, Valid_Alternative, Recovery (benign) or "
        "Constraint_Drop, Evidence_Contradiction, Unsupported_Jump, Missed_Required_Subgoal, Output_Drift "
        "(deviations), with a severity (critical, major, minor) and the anchor it concerns (hard, soft, none)."
    )
    return messages("an auditor of agent runs", user)
