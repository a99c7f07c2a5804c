"""REFLECT's prompts (the paper's Appendix A): localize, classify, diagnose, gate, explain; and the two texts put
into the agent's context at a rollback point (the repair injection and the gate's retry feedback)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, create_model

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
    "ClassificationOutput",
    "DiagnosisOutput",
    "GateOutput",
    "LocalizationOutput",
    "PostCorrectionOutput",
    "ViolationType",
    "classification",
    "diagnosis",
    "diagnosis_output",
    "gate",
    "gate_feedback",
    "localization",
    "post_correction",
    "repair_injection",
]


_BRIEF_CHARS = 240


def _first(limit: int) -> Callable[[object], object]:
    """Keeps the first ``limit`` characters of a text, or items of a list: a longer one from an endpoint that does
    not constrain decoding to the schema is cut, not sent back for a retry (the schema's limit still stops the
    endpoints that do)."""

    def keep(value: object) -> object:
        return value[:limit] if isinstance(value, str | list) else value

    return keep


Brief = Annotated[
    str, BeforeValidator(_first(_BRIEF_CHARS)), StringConstraints(strip_whitespace=True, max_length=_BRIEF_CHARS)
]
"""A side field (a first idea of the fix, a reason a replay was rejected): on a CPU every generated token costs
about as much as evaluating four prompt tokens, and these fields are read only as hints by the next stage."""


class LocalizationOutput(BaseModel):
    model_config = FROZEN
    error_step: int
    confidence: Confidence
    reasoning: Explanation = Field(description="short explanation")
    what_should_have_been_done: Brief = Field(description="short correction")


class ClassificationOutput(BaseModel):
    model_config = FROZEN
    error_type: ErrorType = Field(description="category")
    confidence: Confidence
    explanation: Explanation = Field(description="short explanation")
    suggested_correction: Brief = Field(description="short fix")


ArgumentValue = str | int | float | bool
"""A value in a structured next action. Beyond the paper's schema: a value the model writes as a JSON field is kept
whole, where inside a text field a double quote ends the string under schema-constrained decoding (live, a plan
``filter_rows({"value": ...})`` was cut at its first quote)."""


class DiagnosisOutput(BaseModel):
    model_config = FROZEN
    root_cause: Explanation = Field(description="explanation")
    correction_instruction: Explanation = Field(description="the exact action to take instead, with its values")
    forbidden_actions: Annotated[list[Brief], BeforeValidator(_first(5))] = Field(max_length=5, description="action")
    expected_next_tool: str | None = Field(description="tool")
    expected_next_arguments: dict[str, ArgumentValue] | None = Field(default=None, description="argument")
    confidence: Confidence


_CALL_DESCRIPTION = "the corrected step: the call the agent should have made at the erroneous step, or null"
_THOUGHT_DESCRIPTION = "the erroneous step rewritten correctly, as one reasoning step"


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
    violation_reason: Brief | None = Field(description="why, or null when faithful")
    violation_type: ViolationType | None


class PostCorrectionOutput(BaseModel):
    model_config = FROZEN
    reasoning: str = Field(description="detailed explanation")
    error_type: ErrorType = Field(description="category")
    explanation: Explanation = Field(description="short summary")


_CATEGORIES = "\n".join(f"- {e.value}" for e in ErrorType)
_QUOTING = (
    "In text fields, quote values with single quotes ('like this'). Never state the expected answer: say what the "
    "agent must do to find it."
)
_STANDING = {
    "LOCALIZE": reply_format(LocalizationOutput),
    "CLASSIFY": f"Classify the error of the step named into one of:\n{_CATEGORIES}\n"
    + reply_format(ClassificationOutput),
    "DIAGNOSE": (
        "Produce a repair plan for the step named:\n1. ROOT CAUSE: why the agent chose wrongly\n2. What EXACTLY to do "
        "instead\n3. The corrected step: that step as it should have been, with concrete values taken from the data "
        "(a tool result, an error message or the context often shows the right value); a candidate correction when "
        f"one is right\n4. What the agent must NEVER do\n{_QUOTING}\nThe JSON format is given with the request."
    ),
    "PLAN": (
        "Produce a repair plan for the step named:\n1. ROOT CAUSE: why the agent chose wrongly\n2. What EXACTLY to do "
        "instead: the action and its argument values, using values that appear in the data (a tool result or the "
        "context may show the right value)\n3. What the agent must NEVER do\n4. expected_next_tool: the first tool to "
        "call next, or null\n5. expected_next_arguments: that call's arguments by name, with their exact values, or "
        f"null\n{_QUOTING}\n" + reply_format(DiagnosisOutput)
    ),
    "GATE": (
        "Check the proposed action against the repair plan: 1. Does it follow the correction? 2. Does it violate any "
        "forbidden action? 3. Is it relevant, or has the agent drifted?\n" + reply_format(GateOutput)
    ),
    "EXPLAIN": "Explain WHY the original step was wrong, using the correction as evidence.\n"
    + reply_format(PostCorrectionOutput),
}
GUIDE = "You answer one request at a time; each names one of these tasks.\n\n" + "\n\n".join(
    f"[{name}] {text}" for name, text in _STANDING.items()
)
"""The standing instructions of every REFLECT stage, in the system message of each of its calls (see
:func:`~reflect_otel.prompts._render.trace_prompt`): identical for every call, so a prompt cache serves them."""


def _prompt(ctx: PromptContext, steps: Sequence[Step], role: str, stage: str, task: str) -> list[ChatMessage]:
    return trace_prompt(ctx, steps, role, f"Task [{stage}]. {task}", standing=_STANDING[stage], guide=GUIDE)


def localization(ctx: PromptContext, steps: Sequence[Step]) -> list[ChatMessage]:
    task = (
        "The run above is known to be incorrect. "
        f"Identify the FIRST step (1 to {len(steps)}) where the error was introduced."
    )
    return _prompt(ctx, steps, "an expert auditor analyzing an agent trace", "LOCALIZE", task)


def classification(ctx: PromptContext, steps: Sequence[Step], error_index: int) -> list[ChatMessage]:
    task = f"Step {error_index} is the first error step. Classify its error."
    return _prompt(ctx, steps, "classifying the first error step in an agent trace", "CLASSIFY", task)


def _diagnosis_task(ctx: PromptContext, error_index: int, error_type: str, explanation: str, correction: str) -> str:
    return (
        f"Step {error_index} is the erroneous step: the steps before it are correct, the steps after it are its "
        f"cascade.\nError classification: {error_type}\n"
        f"Classification explanation:\n{data_block('CLASSIFICATION', cut(explanation, ctx.max_chars))}\n"
        f"Previously suggested correction:\n{data_block('SUGGESTION', cut(correction, ctx.max_chars))}\n\n"
    )


def diagnosis(
    ctx: PromptContext,
    steps: Sequence[Step],
    error_index: int,
    error_type: str,
    explanation: str,
    correction: str,
    output: type[BaseModel] = DiagnosisOutput,
    candidates: Sequence[str] = (),
) -> list[ChatMessage]:
    """The diagnosis prompt for ``output`` (see :func:`diagnosis_output`). ``candidates`` are corrections computed
    from the trace (one line each), shown as data the auditor may choose from."""
    role = "a diagnostic expert analyzing why an agent failed"
    task = _diagnosis_task(ctx, error_index, error_type, explanation, correction)
    if output is DiagnosisOutput:
        return _prompt(ctx, steps, role, "PLAN", task + "Produce the repair plan.")
    what = (
        "corrected_call: the call to make instead of step "
        if "corrected_call" in output.model_fields
        else ("corrected_thought: step ")
    )
    listed = cut("\n".join(candidates), ctx.max_chars * 4)
    options = (
        "Corrections computed from the trace (each replaces the step it names; a result or an error there shows the "
        f"value):\n{data_block('CANDIDATE_CORRECTIONS', listed)}\n\n"
        if candidates
        else ""
    )
    task += f"{options}Produce the repair plan, with {what}{error_index} as it should have been.\n" + reply_format(
        output
    )
    return _prompt(ctx, steps, role, "DIAGNOSE", task)


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
        f"{data_block('PROPOSED_ACTION', format_step(proposed, ctx.max_chars))}"
    )
    return _prompt(
        ctx, steps, "a gatekeeper verifying that an agent's proposed action follows a repair plan", "GATE", task
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
    next_action = (
        f"Your next action: call {plan.expected_next_tool} with arguments {_arguments(plan)}\n\n"
        if plan.expected_next_tool and plan.expected_next_arguments
        else ""
    )
    return (
        "IMPORTANT - CORRECTION CONTEXT:\n"
        f"Your previous attempt to answer this question failed at Step {error_step_index}.\n\n"
        f"{seen}"
        f"Diagnosis: {plan.root_cause}\n\n"
        f"You MUST follow this correction:\n{plan.correction_instruction}\n\n"
        f"{next_action}"
        f"You MUST NOT:\n{forbidden}\n\n"
        "Resume from the last correct state and apply this correction."
    )


def _arguments(plan: RepairPlan) -> str:
    return cut(json.dumps(dict(plan.expected_next_arguments or {}), ensure_ascii=False), 500)


def gate_feedback(retry: int, violation_type: str | None, reason: str | None, proposed: Step, plan: RepairPlan) -> str:
    """Appended to the injection when the hard gate rejected the previous regenerated step."""
    return (
        f"GATE RETRY FEEDBACK (retry {retry} failed):\n"
        f"- Previous violation_type: {violation_type}\n"
        f"- Previous violation_reason: {reason}\n"
        f"- Previous first regenerated tool: {proposed.tool_name}\n"
        f"- Previous first regenerated args: {json.dumps(proposed.tool_args, ensure_ascii=False, default=str)[:300]}\n"
        f"- Regenerate Step {proposed.index} again and do not repeat the same first action.\n"
        f"- First regenerated tool must satisfy expected_next_tool={plan.expected_next_tool}."
    )


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
        f"Corrected answer:\n{data_block('CORRECTED_ANSWER', cut(corrected_answer, ctx.max_chars))}"
    )
    return _prompt(
        ctx, steps, "an expert auditor explaining why a specific step of an agent trace was wrong", "EXPLAIN", task
    )
