"""A worked example for tests and benchmarks: a five-step tool trace that answers 41 to "What is 6 times 7?"
(step 3 adds where it should multiply), a scripted auditor that diagnoses it, and a scripted agent whose replay
multiplies. :func:`verified_attribution` runs REFLECT on them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.pipeline import ReflectPipeline
from reflect_otel.record import AttributionRecord
from reflect_otel.testing import ScriptedLLM, ScriptedReplayAdapter, ScriptedRequest, make_trace
from reflect_otel.trace import StructuredTrace
from reflect_otel.verifiers import OracleVerifier

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


def scripted_agent(answer_at: Callable[[int, str], str]) -> ScriptedReplayAdapter:
    """A scripted agent: after the kept prefix it multiplies, then answers ``answer_at(kept, injection)``, where
    ``kept`` is the replay's ``rollback_point`` (how many original steps it kept)."""

    def continue_with(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        return [
            {"tool": "multiply", "args": {"a": 6, "b": 7, "try": point}, "result": "42", "reasoning": "multiply"},
            {"reasoning": f"The answer is {answer_at(point, injection)}", "is_final_answer": True},
        ]

    return ScriptedReplayAdapter(continue_with)


def verified_attribution() -> tuple[StructuredTrace, AttributionRecord]:
    """The five-step trace and REFLECT's verified record of it: step 3 is localized, regenerating it fails, and
    regenerating step 2 (step 1 kept) answers 42."""
    trace = five_step_trace()
    adapter = scripted_agent(lambda kept, _: "42" if kept == 1 else "41")
    pipeline = ReflectPipeline(
        scripted_auditor(localize=[3]), verifier=OracleVerifier(), config=ReflectConfig(gate=GateMode.HARD)
    )
    return trace, pipeline.attribute(trace, expected=EXPECTED, replay=adapter)
