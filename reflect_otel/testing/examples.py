"""A worked example for tests and benchmarks: a five-step tool trace that answers 41 to "What is 6 times 7?"
(step 3 adds where it should multiply), a scripted auditor that diagnoses it, and a scripted agent that answers right
only when the step is redone as a multiplication. :func:`verified_attribution` runs REFLECT on them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.record import AttributionRecord
from reflect_otel.testing import ScriptedLLM, ScriptedProposingAdapter, ScriptedRequest, make_trace
from reflect_otel.trace import Step, StepAction, StructuredTrace

__all__ = ["EXPECTED", "five_step_trace", "scripted_agent", "scripted_auditor", "verified_attribution"]

EXPECTED = "42"


def five_step_trace() -> StructuredTrace:
    return make_trace(
        "What is 6 times 7?",
        [
            {"tool": "read", "args": {"x": 6}, "result": "6", "reasoning": "read the first number"},
            {"tool": "read", "args": {"x": 7}, "result": "7", "reasoning": "read the second number"},
            {"tool": "add", "args": {"a": 6, "b": 7}, "result": "13", "reasoning": "combine them"},
            {"tool": "double", "args": {"v": 13}, "result": "26", "reasoning": "double it"},
            {"reasoning": "The answer is 41", "is_final_answer": True},
        ],
        final_answer="The answer is 41",
    )


def scripted_auditor(
    localize: Sequence[int] = (3,),
    *,
    plan: Mapping[str, Any] | None = None,
    gate_faithful: bool = True,
) -> ScriptedLLM:
    """An auditor that localizes the given steps in order (the last repeats) and otherwise agrees."""
    localizations = list(localize)

    def respond(request: ScriptedRequest) -> Any:
        if request.stage == "localize":
            step = localizations.pop(0) if len(localizations) > 1 else localizations[0]
            return {
                "error_step": step,
                "confidence": 0.8,
                "reasoning": f"step {step} looks wrong",
                "what_should_have_been_done": "multiply",
            }
        if request.stage == "classify":
            return {
                "error_type": "incorrect_problem_identification",
                "confidence": 0.7,
                "explanation": "added",
                "suggested_correction": "multiply instead",
            }
        if request.stage == "diagnose":
            return plan or {
                "root_cause": "it added instead of multiplying",
                "correction_instruction": "multiply 6 by 7",
                "forbidden_actions": ["add"],
                "expected_next_tool": None,
                "confidence": 0.9,
            }
        if request.stage == "gate":
            return {
                "is_faithful": gate_faithful,
                "violation_reason": None if gate_faithful else "drifted",
                "violation_type": None if gate_faithful else "unrelated_drift",
            }
        if request.stage == "explain":
            return {
                "reasoning": "the replay multiplied and got 42",
                "error_type": "incorrect_problem_identification",
                "explanation": "adding was the wrong operation",
            }
        raise AssertionError(f"unexpected stage {request.stage}")

    return ScriptedLLM(respond=respond)


def scripted_agent(
    *,
    fixed_at: Collection[int] = (3,),
    deterministic: bool = True,
    resample: Callable[[int, int], Mapping[str, Any]] | None = None,
) -> ScriptedProposingAdapter:
    """A scripted agent for :func:`five_step_trace`. Left alone (a control replay) it redoes the original steps and
    answers 41 again. When step p is a ``multiply`` call, executed as an action or decided under a correction that
    says to multiply, it answers 42 if p is in ``fixed_at``, else 41. Asked what it would do at step p
    (``propose``), it multiplies when the injection says so, else repeats its original step p, or
    ``resample(p, sample)`` when given (bare resampling)."""
    original = five_step_trace()

    def continue_with(trace: StructuredTrace, point: int, injection: str) -> list[Mapping[str, Any]]:
        multiplied = next((s.index for s in trace.steps[:point] if s.tool_name == "multiply"), None)
        if multiplied is None:  # its own steps from here: the original run again
            return [_as_fields(step) for step in original.steps[point:]]
        answer = "42" if multiplied in fixed_at else "41"
        return [{"reasoning": f"The answer is {answer}", "is_final_answer": True}]

    def propose_with(trace: StructuredTrace, point: int, injection: str, sample: int, temperature: float) -> Any:
        if "multiply" in injection.lower().split("you must follow this correction:")[-1]:
            return {"tool": "multiply", "args": {"a": 6, "b": 7}}
        if resample is not None:
            return resample(point + 1, sample)
        return StepAction.of_step(original.steps[point])

    return ScriptedProposingAdapter(
        continue_with,
        propose_with,
        tools={
            "multiply": lambda a, b: a * b,
            "add": lambda a, b: a + b,
            "read": lambda x: x,
            "double": lambda v: 2 * v,
        },
        deterministic=deterministic,
    )


def _as_fields(step: Step) -> dict[str, Any]:
    if step.tool_name:
        return {
            "tool": step.tool_name,
            "args": dict(step.tool_args),
            "result": step.tool_result,
            "reasoning": step.reasoning,
        }
    return {"reasoning": step.reasoning, "is_final_answer": step.is_final_answer}


def verified_attribution() -> tuple[StructuredTrace, AttributionRecord]:
    """The five-step trace and REFLECT's verified record of it: step 2 is localized (and classified), the agent's
    step redone there under the plan (multiply, step 1 kept) answers 42, while from the same prefix the control
    replay answers 41 and so does step 2 changed in text only (its sensitivity arm: the call without its thought)."""
    trace = five_step_trace()
    pipeline = ReflectPipeline(
        scripted_auditor(localize=[2]),
        verifier=OracleVerifier(),
        config=ReflectConfig(gate=GateMode.HARD, rollback_points=2, proposal_samples=1),
    )
    return trace, pipeline.attribute(trace, expected=EXPECTED, replay=scripted_agent(fixed_at=(2,)))
