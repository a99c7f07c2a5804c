"""REFLECT's prompts (the paper's Appendix A): localize, classify, diagnose, gate, explain; and the two texts put
into the agent's context at a rollback point (the repair injection and the gate's retry feedback)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model

from reflect_otel.llm.base import ChatMessage
from reflect_otel.prompts._render import (
    FROZEN,
    Confidence,
    Explanation,
    PromptContext,
    cut,
    data_block,
    format_step,
    format_steps,
    reply_format,
    trace_prompt,
)
from reflect_otel.prompts._tool_calls import call_union
from reflect_otel.record import ErrorType, RepairPlan
from reflect_otel.trace import Step, ToolDefinition

__all__ = [
    "CORRECTED_STEP_ASK",
    "ClassificationOutput",
    "DiagnosisOutput",
    "GateOutput",
    "LocalizationOutput",
    "PostCorrectionOutput",
    "StepReading",
    "ViolationType",
    "classification",
    "diagnosis",
    "diagnosis_output",
    "gate",
    "localization",
    "plan_texts",
    "post_correction",
    "repair_injection",
]


class LocalizationOutput(BaseModel):
    model_config = FROZEN
    error_step: int
    confidence: Confidence
    reasoning: Explanation = Field(description="short explanation")
    what_should_have_been_done: str = Field(description="short correction")


class ClassificationOutput(BaseModel):
    model_config = FROZEN
    error_type: ErrorType = Field(description="category")
    confidence: Confidence
    explanation: Explanation = Field(description="short explanation")
    suggested_correction: str = Field(description="short fix")


ArgumentValue = str | int | float | bool
"""A value in a structured next action. Beyond the paper's schema: a value the model writes as a JSON field is kept
whole, where inside a text field a double quote ends the string under schema-constrained decoding (live, a plan
``search({"value": ...})`` was cut at its first quote)."""


class DiagnosisOutput(BaseModel):
    model_config = FROZEN
    root_cause: Explanation = Field(description="explanation")
    correction_instruction: Explanation = Field(
        description="the exact action to take instead, with its values, not the final answer (an instruction that "
        "states it is refused)"
    )
    forbidden_actions: list[str] = Field(max_length=10, description="action")
    expected_next_tool: str | None = Field(description="tool")
    expected_next_arguments: dict[str, ArgumentValue] | None = Field(default=None, description="argument")
    confidence: Confidence


_CALL_DESCRIPTION = "the corrected step: the call the agent should have made at the erroneous step, or null"
CORRECTED_STEP_ASK = "as it should have been, with concrete values taken from the data above"
"""How the diagnosis asks for the corrected step (lower case, single spaces): a reply that copies it back wrote no
step (:func:`reflect_otel.attribution.stages.diagnose`)."""
_THOUGHT_DESCRIPTION = (
    "the erroneous step rewritten correctly, as one reasoning step; it must not state the final answer (a step that "
    "does is refused: it would prove nothing)"
)
"""Why the warning: the leak guard refuses a correction that states an answer, for every method, and a refused
correction is a diagnosis spent on nothing testable."""


def _also_required(name: str) -> Callable[[dict[str, Any]], None]:
    def extra(schema: dict[str, Any]) -> None:
        schema["required"] = [*schema.get("required", []), name]

    return extra


def diagnosis_output(tools: Sequence[ToolDefinition], *, chain_of_thought: bool = False) -> type[BaseModel]:
    """The diagnosis's output shape for a trace: :class:`DiagnosisOutput` (the paper's plan) when the agent has
    neither tools nor a chain of thought to correct; else the plan with the corrected step in place of the expected
    next tool and arguments: ``corrected_call``, a call of one of ``tools`` (its tool an enum of their names, its
    arguments that tool's schema), or ``corrected_thought`` for a chain of thought."""
    if not tools and not chain_of_thought:
        return DiagnosisOutput
    name = "corrected_call" if tools else "corrected_thought"
    corrected: dict[str, Any] = (
        {name: (Optional[call_union(tools)], Field(default=None, description=_CALL_DESCRIPTION))}  # noqa: UP045
        if tools
        else {name: (str | None, Field(default=None, max_length=600, description=_THOUGHT_DESCRIPTION))}
    )
    plan: dict[str, Any] = {
        field: (info.annotation, info)
        for field, info in DiagnosisOutput.model_fields.items()
        if field in ("root_cause", "correction_instruction", "forbidden_actions", "confidence")
    }
    model: type[BaseModel] = create_model(
        "DiagnosisWithCorrectedStep" if tools else "DiagnosisWithCorrectedThought",
        # required in the schema, so constrained decoding always writes it (null when there is none); a reply
        # that leaves it out still parses, as a plan without a corrected step
        __config__=ConfigDict(frozen=True, json_schema_extra=_also_required(name)),
        root_cause=plan["root_cause"],
        correction_instruction=plan["correction_instruction"],
        **corrected,
        forbidden_actions=plan["forbidden_actions"],
        confidence=plan["confidence"],
    )
    return model


ViolationType = Literal["repeats_original_error", "ignores_instruction", "uses_forbidden_action", "unrelated_drift"]


class GateOutput(BaseModel):
    model_config = FROZEN
    is_faithful: bool
    violation_reason: str | None = Field(description="why")
    violation_type: ViolationType | None


class PostCorrectionOutput(BaseModel):
    model_config = FROZEN
    reasoning: str = Field(description="detailed explanation")
    error_type: ErrorType = Field(description="category")
    explanation: Explanation = Field(description="short summary")


def localization(ctx: PromptContext, steps: Sequence[Step], tested: str = "") -> list[ChatMessage]:
    """The localization prompt. ``tested`` (one line per step) says which steps replays have already tested
    without fixing the run, as data: a later round names another step."""
    already = (
        "Steps already tested by replaying the agent with a correction there; the run stayed wrong, so name "
        f"another step:\n{data_block('TESTED_STEPS', cut(tested, ctx.max_chars * 2))}\n"
        if tested
        else ""
    )
    task = (
        "The run above is known to be incorrect. "
        f"{already}Identify the FIRST step (1 to {len(steps)}) where the error was introduced.\n"
        + reply_format(LocalizationOutput)
    )
    return trace_prompt(ctx, steps, "an expert auditor analyzing an agent trace", task)


def classification(ctx: PromptContext, steps: Sequence[Step], error_index: int) -> list[ChatMessage]:
    categories = "\n".join(f"- {e.value}" for e in ErrorType)
    task = (
        f"Step {error_index} is the first error step. Classify its error into one of:\n{categories}\n\n"
        + reply_format(ClassificationOutput)
    )
    return trace_prompt(ctx, steps, "classifying the first error step in an agent trace", task)


@dataclass(frozen=True, slots=True)
class StepReading:
    """What the diagnosis is told of the erroneous step: its index, the error type it was classified as, the
    classification's explanation and the correction suggested so far."""

    index: int
    error_type: str
    explanation: str
    correction: str


def diagnosis(
    ctx: PromptContext,
    steps: Sequence[Step],
    reading: StepReading,
    output: type[BaseModel] = DiagnosisOutput,
    candidates: Sequence[str] = (),
) -> list[ChatMessage]:
    """The diagnosis prompt for ``output`` (see :func:`diagnosis_output`). ``candidates`` are corrections computed
    from the trace (one line each), shown as data the auditor may choose from."""
    if output is DiagnosisOutput:
        return _paper_diagnosis(ctx, steps, reading)
    error_index, error_type = reading.index, reading.error_type
    explanation, correction = reading.explanation, reading.correction
    what = (
        "corrected_call: the call to make instead of step "
        if "corrected_call" in output.model_fields
        else "corrected_thought: step "
    )
    listed = cut("\n".join(candidates), ctx.max_chars * 4)
    options = (
        "Corrections computed from the trace (each replaces the step it names; a result or an error there shows the "
        f"value):\n{data_block('CANDIDATE_CORRECTIONS', listed)}\n\n"
        if candidates
        else ""
    )
    task = (
        f"Step {error_index} is the erroneous step: the steps before it are correct, the steps after it are its "
        f"cascade.\nError classification: {error_type}\n"
        f"Classification explanation:\n{data_block('CLASSIFICATION', cut(explanation, ctx.max_chars))}\n"
        f"Previously suggested correction:\n{data_block('SUGGESTION', cut(correction, ctx.max_chars))}\n\n"
        f"{options}"
        "Produce a repair plan:\n1. ROOT CAUSE: why the agent chose wrongly\n2. What EXACTLY to do instead\n"
        f"3. {what}{error_index} {CORRECTED_STEP_ASK} (a tool "
        "result, an error message or the context often shows the right value); a candidate above when one is right\n"
        "4. What the agent must NEVER do\n"
        "In text fields, quote values with single quotes ('like this'). Never state the expected answer: say "
        "what the agent must do to find it.\n" + reply_format(output)
    )
    return trace_prompt(ctx, steps, "a diagnostic expert analyzing why an agent failed", task)


def _paper_diagnosis(ctx: PromptContext, steps: Sequence[Step], reading: StepReading) -> list[ChatMessage]:
    error_index, error_type = reading.index, reading.error_type
    explanation, correction = reading.explanation, reading.correction
    task = (
        f"Step {error_index} is the erroneous step: the steps before it are correct, the steps after it are its "
        f"cascade.\nError classification: {error_type}\n"
        f"Classification explanation:\n{data_block('CLASSIFICATION', cut(explanation, ctx.max_chars))}\n"
        f"Previously suggested correction:\n{data_block('SUGGESTION', cut(correction, ctx.max_chars))}\n\n"
        "Produce a repair plan:\n1. ROOT CAUSE: why the agent chose wrongly\n2. What EXACTLY to do instead: the "
        "action and its argument values, using values that appear in the data above (a tool result or the context "
        "may show the right value)\n"
        "3. What the agent must NEVER do\n4. expected_next_tool: the first tool to call next, or null\n"
        "5. expected_next_arguments: that call's arguments by name, with their exact values, or null\n"
        "In text fields, quote values with single quotes ('like this'). Never state the expected answer: say "
        "what the agent must do to find it.\n" + reply_format(DiagnosisOutput)
    )
    return trace_prompt(ctx, steps, "a diagnostic expert analyzing why an agent failed", task)


def gate(ctx: PromptContext, steps: Sequence[Step], plan: RepairPlan, proposed: Step) -> list[ChatMessage]:
    plan_text = (
        f"Correction instruction: {plan.correction_instruction}\n"
        f"Forbidden actions: {json.dumps(list(plan.forbidden_actions), ensure_ascii=False)}\n"
        f"Expected next tool: {plan.expected_next_tool}"
        + (f"\nExpected arguments: {_arguments(plan)}" if plan.expected_next_arguments else "")
    )
    task = (
        "The run was replayed with a repair plan. "
        f"Repair plan:\n{data_block('REPAIR_PLAN', cut(plan_text, ctx.max_chars * 3))}\n\n"
        f"Proposed action (the first regenerated step):\n"
        f"{data_block('PROPOSED_ACTION', format_step(proposed, ctx.max_chars))}\n\n"
        "Check: 1. Does it follow the correction? 2. Does it violate any forbidden action? "
        "3. Is it relevant, or has the agent drifted?\n" + reply_format(GateOutput)
    )
    return trace_prompt(
        ctx, steps, "a gatekeeper verifying that an agent's proposed action follows a repair plan", task
    )


def plan_texts(plan: RepairPlan) -> tuple[str, ...]:
    """What of ``plan`` :func:`repair_injection` writes into the agent's context (the leak guard reads these)."""
    return (
        plan.root_cause,
        plan.correction_instruction,
        *plan.forbidden_actions,
        plan.expected_next_tool or "",
        _arguments(plan) if plan.expected_next_arguments else "",
    )


def repair_injection(
    plan: RepairPlan, error_step_index: int, failed_step: Step | None = None, max_chars: int = 500
) -> str:
    """The correction message put into the agent's context at the rollback point (not an LLM prompt). With
    ``failed_step``, it also shows what that step did and got back in the failed attempt: the replayed agent has
    not seen it (its context ends before it), and an observation there (an error, an empty result listing the
    values that do exist) is often what the correction needs."""
    forbidden = "\n".join(f"- {action}" for action in plan.forbidden_actions) or "- (nothing specific)"
    seen = (
        f"In that attempt, Step {error_step_index} was:\n"
        f"{data_block('FAILED_STEP', format_step(failed_step, max_chars))}\n\n"
        if failed_step is not None
        else ""
    )
    diagnosis = f"Diagnosis: {plan.root_cause}\n\n" if plan.root_cause.strip() else ""  # none, or withheld
    next_action = (
        f"Your next action: call {plan.expected_next_tool} with arguments {_arguments(plan)}\n\n"
        if plan.expected_next_tool and plan.expected_next_arguments
        else ""
    )
    return (
        "IMPORTANT - CORRECTION CONTEXT:\n"
        f"Your previous attempt to answer this question failed at Step {error_step_index}.\n\n"
        f"{seen}"
        f"{diagnosis}"
        f"You MUST follow this correction:\n{plan.correction_instruction}\n\n"
        f"{next_action}"
        f"You MUST NOT:\n{forbidden}\n\n"
        "Resume from the last correct state and apply this correction."
    )


def _arguments(plan: RepairPlan) -> str:
    return cut(json.dumps(dict(plan.expected_next_arguments or {}), ensure_ascii=False), 500)


def post_correction(
    ctx: PromptContext,
    steps: Sequence[Step],
    original: Step,
    continuation: Sequence[Step],
    corrected_answer: str,
    rollback_point: int,
) -> list[ChatMessage]:
    task = (
        f"A correction loop rolled back to step {rollback_point} and resampled. The resampled continuation "
        f"produced the CORRECT answer.\nOriginal error step: {original.index}\n"
        f"Resampled continuation:\n{data_block('RESAMPLED', format_steps(continuation, ctx.max_chars))}\n\n"
        f"Corrected answer:\n{data_block('CORRECTED_ANSWER', cut(corrected_answer, ctx.max_chars))}\n\n"
        "Explain WHY the original step was wrong, using the correction as evidence.\n"
        + reply_format(PostCorrectionOutput)
    )
    return trace_prompt(
        ctx, steps, "an expert auditor explaining why a specific step of an agent trace was wrong", task
    )
