"""The paper's faithfulness controls (RQ3): a placebo plan written for another failure, and the run's own plan at
a step at distance 2; both REFLECT's guidance pipeline otherwise, so their flips are comparable with its flips."""

from __future__ import annotations

from typing import Any

from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.controls import PLACEBO_PLANS, placebo_plan, wrong_step
from reflect_otel.methods import METHODS
from reflect_otel.record import AttributionStatus
from reflect_otel.testing import ScriptedLLM, ScriptedReplayAdapter, ScriptedRequest, make_trace
from reflect_otel.trace import StructuredTrace
from reflect_otel.verifiers import OracleVerifier

OWN_INSTRUCTION = "Filter the Position column on '1st', the value the table has."


def five_steps(question: str = "Where was the last 1st place?") -> StructuredTrace:
    calls = [{"tool": "lookup", "args": {"table": "t0", "row": i}, "result": f"row {i}"} for i in range(1, 5)]
    return make_trace(question, [*calls, {"reasoning": "Nowhere.", "is_final_answer": True}], final_answer="Nowhere.")


def auditor(step: int) -> ScriptedLLM:
    def respond(request: ScriptedRequest) -> Any:
        return {
            "localize": {"error_step": step, "confidence": 0.7, "reasoning": "r", "what_should_have_been_done": "w"},
            "classify": {"error_type": "tool_error", "confidence": 0.6, "explanation": "e",
                         "suggested_correction": "s"},
            "diagnose": {"root_cause": "the filter value", "correction_instruction": OWN_INSTRUCTION,
                         "forbidden_actions": [], "expected_next_tool": None, "expected_next_arguments": None,
                         "confidence": 0.8},
            "gate": {"is_faithful": True, "violation_reason": None, "violation_type": None},
            "explain": {"reasoning": "r", "error_type": "tool_error", "explanation": "e"},
        }[request.stage]  # fmt: skip

    return ScriptedLLM(respond=respond)


def agent_that_follows(instruction: str) -> ScriptedReplayAdapter:
    """A greedy agent that redoes its step (a lookup it did not make) and answers right when the injection carries
    ``instruction``; left alone, it answers as the run did."""
    return ScriptedReplayAdapter(
        lambda trace, point, injection: [
            {"tool": "lookup", "args": {"table": "t0", "row": 99}, "result": "row 99"},
            {"reasoning": "Bangkok" if instruction in injection else "Nowhere.", "is_final_answer": True},
        ],
        deterministic=True,
    )


def attribute(method: str, step: int, agent: ScriptedReplayAdapter, trace: StructuredTrace | None = None) -> Any:
    config = ReflectConfig(rounds=1, rollback_points=1, gate=GateMode.SOFT)
    attributor = METHODS[method].build(auditor(step), OracleVerifier(), config)
    return attributor.attribute(trace or five_steps(), expected="Bangkok", replay=agent)


def test_the_wrong_step_is_two_steps_away_and_never_the_answer() -> None:
    trace = five_steps()  # steps 1-4 are calls, 5 the answer
    assert [wrong_step(trace, s) for s in (1, 2, 3, 4)] == [3, 4, 1, 2]
    short = make_trace("q", [{"tool": "a", "args": {}, "result": "r"}, {"reasoning": "x", "is_final_answer": True}])
    assert wrong_step(short, 1) is None


def test_wrong_step_injects_the_runs_own_plan_two_steps_from_the_localized_one() -> None:
    agent = agent_that_follows(OWN_INSTRUCTION)
    record = attribute("control-wrong-step", 2, agent)
    control, call = agent.calls
    assert control.rollback_point == 3 and control.injection == ""  # the control from the same prefix
    assert call.rollback_point == 3 and OWN_INSTRUCTION in call.injection  # regenerates step 4, not step 2
    assert [(c.source, c.kind.value, c.step_index) for c in record.corrections] == [
        ("control:wrong-step", "guidance", 4)
    ]
    # the same rule as REFLECT's: the plan at the wrong step flipped the run and its control did not
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 4


def test_wrong_step_does_not_replay_a_run_without_such_a_step() -> None:
    agent = agent_that_follows(OWN_INSTRUCTION)
    short = make_trace("q", [{"tool": "a", "args": {}, "result": "r"}, {"reasoning": "x", "is_final_answer": True}])
    record = attribute("control-wrong-step", 1, agent, short)
    assert agent.calls == [] and record.status is AttributionStatus.UNVERIFIED
    assert "no step at distance 2" in record.reason


def test_placebo_injects_a_plan_written_for_another_question_in_place_of_the_auditors() -> None:
    agent = agent_that_follows(OWN_INSTRUCTION)
    record = attribute("control-placebo", 2, agent)
    _control, call = agent.calls
    placebo = placebo_plan(five_steps())
    assert placebo.correction_instruction in call.injection and OWN_INSTRUCTION not in call.injection
    assert call.rollback_point == 1  # the localized step, as REFLECT's guidance
    assert record.status is AttributionStatus.UNVERIFIED and call.action is None
    assert [r.stage for r in record.llm_calls][:3] == ["localize", "classify", "diagnose"]  # paid for as REFLECT's


def test_a_placebo_is_never_the_plan_written_for_the_same_question() -> None:
    for question, plan in PLACEBO_PLANS:
        for n in range(20):
            trace = five_steps(question.upper()).model_copy(update={"trace_id": f"{n:032x}"})
            assert placebo_plan(trace) != plan
