"""REFLECT's semantics (Algorithm 1 under controlled verification) with a scripted auditor and a scripted agent.

The scripted agent (``reflect_otel.testing.examples.scripted_agent``) redoes the original run when left alone (the
control) and answers right only when the step is redone as a multiplication at a step that fixes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reflect_otel.attribution.pipeline import ReflectPipeline, guidance_window, rollback_points
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.datasets.bbm import BBMVerifier
from reflect_otel.errors import LLMError
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.record import AttributionRecord, AttributionStatus, ErrorType, ReplayArm
from reflect_otel.replay import BudgetedReplay, ReplayAdapter
from reflect_otel.testing import (
    ScriptedLLM,
    ScriptedProposingAdapter,
    ScriptedReplayAdapter,
    ScriptedRequest,
    make_trace,
)
from reflect_otel.testing.examples import EXPECTED, five_step_trace
from reflect_otel.testing.examples import scripted_agent as agent
from reflect_otel.testing.examples import scripted_auditor as auditor
from reflect_otel.trace import StepAction, StructuredTrace, ToolDefinition


def run(llm: ScriptedLLM, adapter: ReplayAdapter | None, **config: Any) -> AttributionRecord:
    """The paper's Algorithm 1 (guidance only) unless a test turns actions on; tests/test_corrections.py covers
    actions. One proposal per rollback point unless a test asks for more."""
    settings = {"actions": False, "proposal_samples": 1, "max_replays": None, **config}
    pipeline = ReflectPipeline(llm, verifier=OracleVerifier(), config=ReflectConfig(**settings))
    return pipeline.attribute(five_step_trace(), expected=EXPECTED, replay=adapter)


def controls(record: AttributionRecord) -> list[int]:
    return [a.rollback_point for a in record.replays if a.arm is ReplayArm.CONTROL]


def interventions(record: AttributionRecord) -> list[int]:
    return [a.rollback_point for a in record.replays if a.arm is ReplayArm.INTERVENTION]


def test_rollback_points_are_the_localized_step_and_those_before() -> None:
    assert rollback_points(5, 3) == [5, 4, 3]
    assert rollback_points(2, 3) == [2, 1]
    assert rollback_points(1, 3) == [1]


def test_the_guidance_window_is_the_localized_step_and_those_before_it() -> None:
    trace = five_step_trace()  # step 5 is the answer turn: never a point (any extra turn can flip a run)
    assert guidance_window(trace, 5, 2) == [4, 3]
    assert guidance_window(trace, 3, 3) == [3, 2, 1]
    assert guidance_window(trace, 9, 1) == [4]


def test_a_step_is_verified_when_its_intervention_flips_and_the_control_from_the_same_prefix_does_not() -> None:
    llm = auditor(localize=[3])
    record = run(llm, agent(fixed_at=(2,)), rollback_points=3)
    assert record.status is AttributionStatus.VERIFIED, record.reason
    assert record.step_index == 2
    assert record.span_id == five_step_trace().steps[1].span_id
    assert record.intervention is not None and record.intervention.rollback_point == 1
    # step 3 redone (control first, then the intervention), then step 2: the flip is credited once step 2 changed
    # in text only (its arguments reordered, as every replacement is executed) does not flip too
    assert [(a.arm.value, a.rollback_point) for a in record.replays] == [
        ("control", 2),
        ("intervention", 2),
        ("control", 1),
        ("intervention", 1),
        ("sensitivity", 1),
    ]
    effect = record.effect
    assert effect is not None and effect.text() == "intervention flipped 1 of 1, control 0 of 1, sensitivity 0 of 1"
    assert effect.deterministic and effect.control.answers == ("The answer is 41",)
    # step 2, read(x=7), has one argument: its variant is the call alone, without the thought the agent wrote with it
    assert effect.sensitivity_variant == StepAction(tool_name="read", arguments={"x": 7})
    assert effect.sensitivity_note == "the call alone, without the text the agent wrote with it"
    assert record.fidelity is not None and (record.fidelity.controls, record.fidelity.reproduced) == (2, 2)
    assert record.confidence == 1.0 and record.confidence_samples == 1
    assert record.corrected_answer == "The answer is 42"
    # the classification was of step 3, not of the step proved: no error type is claimed for step 2
    assert record.error_type is None
    # the explanation is the proof: the step, what replaced it, and the three arms' answers
    assert record.explanation.startswith("Step 2 did: read(")
    assert "multiply(" in record.explanation and "'The answer is 42', judged right" in record.explanation
    assert "left alone (control) it answered 'The answer is 41'" in record.explanation
    assert (
        "changed in text only (the call alone, without the text the agent wrote with it) it answered 'The answer "
        "is 41'" in record.explanation
    )
    assert record.root_cause == "it added instead of multiplying"
    assert llm.stages() == ["localize", "classify", "diagnose", "gate", "gate"]
    # decisive, not localized: the agent's own step 1, resampled for the localization test, repeats itself
    assert record.claim == "decisive"
    assert record.localization_test is not None and record.localization_test.outcome.value == "untested"
    # the agent proposed its step with the paper's repair message in context; the proposal was executed as an action
    verifying = record.intervention.correction
    assert verifying is not None and verifying.source == "proposal:llm" and verifying.kind.value == "action"
    assert verifying.replacement is not None and verifying.replacement.tool_name == "multiply"
    # as tried: the record's intervention and its entry among the corrections agree (they did not: replays 0, no flip)
    assert (verifying.replays, verifying.flipped) == (1, True) and verifying in record.corrections
    assert record.intervention.injection.startswith("IMPORTANT - CORRECTION CONTEXT:")
    assert "failed at Step 3" in record.intervention.injection


def _resampled(step: int, sample: int) -> dict[str, Any]:
    return [{"tool": "subtract", "args": {"a": 7, "b": 6}}, {"tool": "double", "args": {"v": 6}}][sample % 2]


def test_the_control_of_a_rollback_point_runs_once_and_serves_every_correction_tried_there() -> None:
    # two different proposals for step 3 under a plan that names no tool: both replayed against one control
    plan = {"root_cause": "it added", "correction_instruction": "fix the operation", "forbidden_actions": [],
            "expected_next_tool": None, "confidence": 0.9}  # fmt: skip
    adapter = agent(fixed_at=(1,), resample=_resampled)
    record = run(auditor(localize=[3], plan=plan), adapter, rollback_points=1, rounds=1, proposal_samples=2)
    assert controls(record) == [2]
    assert interventions(record) == [2, 2]
    assert [c.replacement.tool_name for c in record.corrections if c.replacement] == ["subtract", "double"]
    assert record.status is AttributionStatus.UNVERIFIED


def test_a_flip_the_control_also_produces_is_not_attributable() -> None:
    llm = auditor(localize=[3])
    lucky = ScriptedReplayAdapter(  # redoes its step its own way and answers right, told anything or nothing
        lambda trace, point, injection: [
            {"tool": "multiply", "args": {"a": 6, "b": 7}, "result": "42"},
            {"reasoning": "The answer is 42", "is_final_answer": True},
        ],
        tools={"multiply": lambda a, b: a * b},
        deterministic=True,
    )
    record = run(llm, lucky, rollback_points=1)
    assert record.status is AttributionStatus.NOT_ATTRIBUTABLE
    assert record.effect is not None and record.effect.text() == "intervention flipped 1 of 1, control 1 of 1"
    assert "control replay from the same prefix answers right" in record.reason
    assert record.confidence is None  # no measured confidence for what was not proved
    assert record.corrected_answer is None


def test_a_replay_that_names_the_right_answer_among_others_is_no_flip() -> None:
    # the agent, told anything or nothing, hedges between the expected answer and its run's: undecided, never right
    hedging = ScriptedReplayAdapter(
        lambda trace, point, injection: [{"reasoning": "The answer is 42 or 41", "is_final_answer": True}],
        deterministic=True,
    )
    record = run(auditor(localize=[3]), hedging, rollback_points=1)
    assert record.replays and not any(a.flipped for a in record.replays)
    assert all(a.verdict is not None and a.verdict.label == "undecided" for a in record.replays)
    assert record.status is not AttributionStatus.VERIFIED and record.corrected_answer is None
    assert record.fidelity is not None and record.fidelity.reproduced == 0  # nor is it the run's own answer


def test_a_control_that_repeats_the_runs_value_reproduces_the_run() -> None:
    again = ScriptedReplayAdapter(  # the run's 41, written twice
        lambda trace, point, injection: [{"reasoning": "The answer is 41, 41", "is_final_answer": True}],
        deterministic=True,
    )
    record = run(auditor(localize=[3]), again, rollback_points=1)
    controls_run = [a for a in record.replays if a.arm is ReplayArm.CONTROL]
    assert controls_run and all(a.reproduced and not a.flipped for a in controls_run)


def test_an_unfaithful_guidance_flip_never_verifies() -> None:
    # the soft gate replays a proposal it judged unfaithful; the flip is recorded, not verified
    record = run(
        auditor(localize=[3], gate_faithful=False), agent(fixed_at=(3,)), gate=GateMode.SOFT, rollback_points=1
    )
    assert record.status is AttributionStatus.NOT_ATTRIBUTABLE
    (flip,) = [a for a in record.replays if a.arm is ReplayArm.INTERVENTION]
    assert flip.flipped and flip.gate is not None and not flip.gate.is_faithful
    assert "gate did not judge its step p faithful" in record.reason
    # the hard gate does not even replay it
    hard = run(auditor(localize=[3], gate_faithful=False), agent(fixed_at=(3,)), gate=GateMode.HARD, rollback_points=1)
    assert hard.status is AttributionStatus.UNVERIFIED and interventions(hard) == []
    assert any(c.refused and "unfaithful" in c.refused for c in hard.corrections)
    # with the gate off nothing is judged, so a guidance flip cannot verify either
    off = run(auditor(localize=[3]), agent(fixed_at=(3,)), gate=GateMode.OFF, rollback_points=1)
    assert off.status is AttributionStatus.NOT_ATTRIBUTABLE


def test_a_control_that_takes_another_wrong_path_is_checked_again_before_a_flip_counts() -> None:
    """Greedy decoding on a real server is not bit-exact: a control may reach another wrong answer. Then a flip at
    its point is credited only after verify_samples controls all stay wrong; the record says the replays did not give
    the run's own answer."""
    answers = iter([40, 39, 41])

    def drifting(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        multiplied = any(s.tool_name == "multiply" for s in trace.steps[:point])
        return [{"reasoning": f"The answer is {42 if multiplied else next(answers, 41)}", "is_final_answer": True}]

    adapter = ScriptedProposingAdapter(
        drifting,
        lambda trace, point, injection, sample, temperature: {"tool": "multiply", "args": {"a": 6, "b": 7}},
        tools={"multiply": lambda a, b: a * b, "add": lambda a, b: a + b},
        deterministic=True,
    )
    record = run(auditor(localize=[3]), adapter, rollback_points=1, rounds=1)
    assert record.status is AttributionStatus.VERIFIED, record.reason
    assert [a.arm.value for a in record.replays][:5] == ["control", "intervention", "control", "control", "sensitivity"]
    assert record.effect is not None
    assert record.effect.text() == "intervention flipped 1 of 1, control 0 of 3, sensitivity 0 of 1"
    controls_run = [a for a in record.replays if a.arm is ReplayArm.CONTROL and a.rollback_point == 2]
    assert [a.reproduced for a in controls_run] == [False, False, True]
    assert record.fidelity.text().startswith("replays of this agent reproduced its run")  # type: ignore[union-attr]
    # a budget with no room for the extra controls: the flip is recorded, not credited
    answers = iter([40, 39, 41])
    short = run(auditor(localize=[3]), BudgetedReplay(adapter, 3), rollback_points=1, rounds=1)
    assert short.status is AttributionStatus.NOT_ATTRIBUTABLE and "left no room" in short.reason
    assert short.obstacle is not None and short.obstacle.value == "control_unreproduced"
    # a control that leaves the extra controls answering right: not attributable
    answers = iter([40, 42, 40])
    lucky = run(auditor(localize=[3]), adapter, rollback_points=1, rounds=1)
    assert lucky.status is AttributionStatus.NOT_ATTRIBUTABLE
    assert lucky.effect is not None and lucky.effect.text() == "intervention flipped 1 of 1, control 1 of 3"
    assert lucky.obstacle is not None and lucky.obstacle.value == "control_flipped"


def test_a_proposal_that_repeats_the_original_step_is_not_replayed() -> None:
    plan = {"root_cause": "x", "correction_instruction": "check the sum", "forbidden_actions": [],
            "expected_next_tool": None, "confidence": 0.5}  # fmt: skip
    record = run(auditor(localize=[3], plan=plan), agent(), rollback_points=1)
    assert interventions(record) == []
    assert any(c.refused == "the replacement repeats the original step" for c in record.corrections)
    # nor a control: with no intervention to compare it with, it would spend a replay on nothing
    assert controls(record) == [] and record.fidelity is None


def test_a_proposal_that_adds_only_a_null_argument_to_the_step_changes_nothing() -> None:
    plan = {"root_cause": "x", "correction_instruction": "check the sum", "forbidden_actions": [],
            "expected_next_tool": None, "confidence": 0.5}  # fmt: skip
    original = five_step_trace().steps[2]
    defaulted = {"tool": original.tool_name, "args": {**original.tool_args, "note": None}}
    adapter = ScriptedProposingAdapter(
        lambda trace, point, injection: [{"reasoning": "The answer is 41", "is_final_answer": True}],
        lambda trace, point, injection, sample, temperature: defaulted,
        deterministic=True,
    )
    record = run(auditor(localize=[3], plan=plan), adapter, rollback_points=1)
    assert interventions(record) == [] and controls(record) == []
    assert [c.refused for c in record.corrections] == ["the replacement repeats the original step"]


def test_a_pure_tools_call_the_prefix_made_is_no_correction_where_the_adapter_declares_the_tool_pure() -> None:
    plan = {"root_cause": "it added", "correction_instruction": "fix the operation", "forbidden_actions": [],
            "expected_next_tool": None, "confidence": 0.9}  # fmt: skip
    reread = lambda step, sample: {"tool": "read", "args": {"x": 6}}  # noqa: E731  (step 1's call again)
    declared = agent(fixed_at=(1,), resample=reread)
    declared.pure_tools = ("read", "add", "double")  # type: ignore[attr-defined]
    record = run(auditor(localize=[3], plan=plan), declared, rollback_points=1, rounds=1)
    assert interventions(record) == [] and controls(record) == []
    assert any(
        c.refused and "repeats an earlier call of a pure tool (step 1's)" in c.refused for c in record.corrections
    )
    # undeclared, the tool may answer again differently: the call is tested like any other
    record = run(auditor(localize=[3], plan=plan), agent(fixed_at=(1,), resample=reread), rollback_points=1, rounds=1)
    assert interventions(record) == [2]


def test_sampled_arms_verify_by_the_fisher_test() -> None:
    flips = iter([True, True, True])

    def sampled(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        multiplied = any(s.tool_name == "multiply" for s in trace.steps)
        right = multiplied and next(flips)
        return [{"reasoning": f"The answer is {42 if right else 41}", "is_final_answer": True}]

    def propose(trace: StructuredTrace, point: int, injection: str, sample: int, temperature: float) -> Any:
        return {"tool": "multiply", "args": {"a": 6, "b": 7}}

    adapter = ScriptedProposingAdapter(
        sampled, propose, tools={"multiply": lambda a, b: a * b, "add": lambda a, b: a + b}
    )
    record = run(auditor(localize=[3]), adapter, rollback_points=1, verify_samples=3, rounds=1)
    assert record.status is AttributionStatus.VERIFIED, record.reason
    assert record.effect is not None
    assert record.effect.text() == "intervention flipped 3 of 3, control 0 of 3, sensitivity 0 of 3"
    assert record.effect.p_value == pytest.approx(0.05) and not record.effect.deterministic
    assert record.effect.intervention.low == pytest.approx(0.438503, abs=1e-5)
    assert record.confidence == 1.0 and record.confidence_samples == 3

    flips = iter([True, True, False])
    weaker = run(auditor(localize=[3]), adapter, rollback_points=1, verify_samples=3, rounds=1)
    assert weaker.status is AttributionStatus.NOT_ATTRIBUTABLE
    assert weaker.effect is not None and weaker.effect.p_value == pytest.approx(0.2)


def test_every_replay_controls_and_sensitivity_arms_included_comes_out_of_the_budget() -> None:
    # a test needs its control, its intervention and room for its sensitivity arm (run only before a flip is
    # credited): step 3 (control + intervention), step 2 (control + intervention); step 1 cannot pay for three
    budgeted = BudgetedReplay(agent(fixed_at=(1,)), 6)
    record = run(auditor(localize=[3]), budgeted, rollback_points=3, rounds=1)
    assert len(record.replays) == 4 and budgeted.used == 4
    assert record.status is AttributionStatus.UNVERIFIED
    assert "cannot pay for the 3 replays of a test at step 1" in record.reason and "--max-replays" in record.reason
    # four replays cannot pay for step 2's test after step 3's: it is not started, so its flip is never seen
    short = BudgetedReplay(agent(fixed_at=(2,)), 4)
    record = run(auditor(localize=[3]), short, rollback_points=3, rounds=1)
    assert len(record.replays) == 2 and record.status is AttributionStatus.UNVERIFIED
    # five pay for it: the flip at step 2, its control and its sensitivity arm
    enough = BudgetedReplay(agent(fixed_at=(2,)), 5)
    record = run(auditor(localize=[3]), enough, rollback_points=3, rounds=1)
    assert record.status is AttributionStatus.VERIFIED and enough.used == 5


def test_a_later_round_names_another_step_and_is_told_what_was_tested() -> None:
    llm = auditor(localize=[4, 3])
    record = run(llm, agent(fixed_at=(3,)), rounds=2, rollback_points=1)
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 3
    assert record.rounds == 2
    assert [loc.step_index for loc in record.localizations] == [4, 3]
    relocalize = [r for r in llm.requests if r.stage == "localize"][1]
    assert "TESTED_STEPS" in relocalize.text and "step 4: no flip" in relocalize.text
    assert controls(record) == [3, 2]


def test_a_localization_of_a_tested_step_is_sent_back() -> None:
    llm = auditor(localize=[3, 3, 2])  # round 2 names step 3 again, then step 2
    record = run(llm, agent(fixed_at=(2,)), rounds=2, rollback_points=1)
    assert [loc.step_index for loc in record.localizations] == [3, 2]
    repair = [r for r in llm.requests if r.stage == "localize"][2]
    assert "step 3 was localized and tested already; name another step" in repair.messages[-1].content
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 2


def test_exhaustion_gives_an_unverified_record_with_the_last_localization() -> None:
    llm = auditor(localize=[4, 3])
    record = run(llm, agent(fixed_at=()), rounds=2, rollback_points=2)
    assert record.status is AttributionStatus.UNVERIFIED
    assert record.step_index == 3 and record.rounds == 2
    assert "no intervention flipped the outcome under control in 2 round(s)" in record.reason
    assert not any(a.flipped for a in record.replays)
    assert record.mode == "replay"


def test_malformed_json_gets_one_repair_retry_then_a_recorded_stage_error() -> None:
    llm = ScriptedLLM(by_stage={"localize": ["this is not json", "{still: broken"]})
    record = run(llm, agent())
    assert record.status is AttributionStatus.UNVERIFIED and record.step_index is None
    assert [e.stage for e in record.errors] == ["localize"]
    assert "after one repair attempt" in record.errors[0].message
    (call,) = record.llm_calls
    assert call.stage == "localize" and call.attempts == 2 and not call.ok
    repair = llm.requests[1]
    assert repair.messages[-2].content == "this is not json"
    assert repair.messages[-1].content.startswith("That reply was not valid: the reply holds no JSON object")


def test_malformed_then_valid_json_succeeds_on_the_repair() -> None:
    base = auditor(localize=[3])
    llm = ScriptedLLM(by_stage={"localize": ["```json\n{oops```"]}, respond=base._respond)
    record = run(llm, agent(fixed_at=(3,)))
    assert record.status is AttributionStatus.VERIFIED
    assert record.llm_calls[0].attempts == 2 and record.llm_calls[0].ok


def test_out_of_range_step_is_sent_back_once() -> None:
    base = auditor(localize=[3])
    bad = {"error_step": 99, "confidence": 0.5, "reasoning": "x", "what_should_have_been_done": "y"}
    llm = ScriptedLLM(by_stage={"localize": [bad]}, respond=base._respond)
    record = run(llm, agent(fixed_at=(3,)))
    assert "error_step must be a step number from 1 to 5, got 99" in llm.requests[1].messages[-1].content
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 3


def test_cost_sums_per_stage() -> None:
    llm = auditor(localize=[3])
    record = run(llm, agent(fixed_at=(2,)), rollback_points=2)
    by_stage = {c.stage: c for c in record.cost}
    assert {s: c.calls for s, c in by_stage.items()} == {
        "localize": 1,
        "classify": 1,
        "diagnose": 1,
        "gate": 2,
    }
    assert record.total_calls == len(record.llm_calls) == len(llm.requests)
    expected_prompt = sum(sum(len(m.content) for m in r.messages) // 4 for r in llm.requests)
    assert sum(c.prompt_tokens for c in record.cost) == expected_prompt
    assert record.total_tokens == sum(c.prompt_tokens + c.completion_tokens for c in record.llm_calls)


def test_no_adapter_means_localization_only() -> None:
    record = run(auditor(localize=[4]), None)
    assert record.mode == "localization_only" and record.status is AttributionStatus.UNVERIFIED
    assert record.step_index == 4 and "no replay adapter" in record.reason
    assert record.effect is None and record.fidelity is None


def test_correct_answer_is_skipped_without_llm_calls() -> None:
    llm = auditor()
    pipeline = ReflectPipeline(llm, verifier=OracleVerifier())
    record = pipeline.attribute(five_step_trace(), expected="41", replay=None)
    assert record.status is AttributionStatus.SKIPPED and not llm.requests


def test_replay_and_llm_failures_are_recorded_not_raised() -> None:
    def broken(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        raise RuntimeError("agent crashed")

    llm = auditor(localize=[3])
    record = run(llm, ScriptedReplayAdapter(broken, deterministic=True), rounds=2)
    assert record.status is AttributionStatus.UNVERIFIED and record.step_index is not None
    # round 2's localizer names step 3 again and is refused: recorded, the search stops
    assert {e.stage for e in record.errors} == {"replay", "relocalize"}
    assert record.replays and all(a.error == "agent crashed" for a in record.replays)
    # an endpoint failure in a later stage keeps what was reached
    failing = ScriptedLLM(
        by_stage={"classify": [LLMError("endpoint down"), LLMError("endpoint down")]}, respond=auditor()._respond
    )
    record = run(failing, agent(fixed_at=(3,)))
    assert record.status is AttributionStatus.VERIFIED
    assert [e.stage for e in record.errors] == ["classify"]


def test_parallel_tool_call_turn_cannot_be_split() -> None:
    from reflect_otel.errors import ReplayError
    from reflect_otel.replay import check_rollback_point
    from reflect_otel.testing import make_step

    steps = (
        make_step(1, span_id="a" * 16, tool="x", tool_call_id="c1"),
        make_step(2, span_id="a" * 16, tool="y", tool_call_id="c2"),
        make_step(3, span_id="b" * 16, reasoning="done"),
    )
    trace = StructuredTrace(trace_id="1" * 32, steps=steps)
    check_rollback_point(trace, 0)
    check_rollback_point(trace, 2)
    with pytest.raises(ReplayError, match="parallel tool calls"):
        check_rollback_point(trace, 1)
    with pytest.raises(ReplayError, match="outside"):
        check_rollback_point(trace, 3)


def test_a_root_cause_that_names_the_answer_is_withheld_and_the_rest_of_the_plan_is_given() -> None:
    """In the oracle regime the auditor sees the answer, so its root cause names it. That text reaches no replay
    unless it is injected: the guidance is given without it, and the plan, step and error type are kept."""
    naming = {
        "root_cause": f"it added 6 and 7; multiplying gives {EXPECTED}",
        "correction_instruction": "multiply 6 by 7",
        "forbidden_actions": ["add", f"answer before checking it is {EXPECTED}"],
        "expected_next_tool": None,
        "confidence": 0.9,
    }
    llm = auditor(localize=[3], plan=naming)
    adapter = agent(fixed_at=(3,))
    record = run(llm, adapter, rollback_points=1)
    assert [r.stage for r in llm.requests].count("diagnose") == 1  # not sent back, not failed
    assert not record.errors
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 3
    assert record.error_type is ErrorType.INCORRECT_PROBLEM_IDENTIFICATION
    assert record.root_cause == naming["root_cause"]  # the record keeps the auditor's words
    (given,) = [p.injection for p in adapter.proposals if p.injection]  # the others: the localization test's
    assert "multiply 6 by 7" in given and "- add" in given
    assert EXPECTED not in given and "Diagnosis:" not in given
    assert record.intervention is not None and record.intervention.injection == given
    assert record.intervention.plan.root_cause == "" and record.intervention.plan.forbidden_actions == ("add",)
    withheld = [(c.kind.value, c.finding.split(",")[0], c.refused) for c in record.corrections if c.refused]
    reason = f"it carries the expected answer '{EXPECTED}': it would flip a replay from any step"
    assert withheld == [
        ("guidance", "the plan's root cause", reason),
        ("guidance", "the plan's forbidden action 2", reason),
    ]


def test_a_plan_whose_instruction_states_the_answer_gives_no_guidance_and_says_why() -> None:
    leaking = {
        "root_cause": "it added instead of multiplying",
        "correction_instruction": f"Answer {EXPECTED} by multiplying 6 and 7",
        "forbidden_actions": [],
        "expected_next_tool": "final_answer",
        "confidence": 0.9,
    }
    llm = auditor(localize=[3], plan=leaking)
    adapter = agent(fixed_at=(3,))
    record = run(llm, adapter, rollback_points=2, rounds=1)
    assert [r.stage for r in llm.requests].count("diagnose") == 1 and not record.errors
    assert adapter.proposals == [] and adapter.calls == []  # nothing was given, so nothing replayed, not even a control
    (refused,) = [c for c in record.corrections if c.refused]
    assert refused.finding.startswith("the plan's correction instruction, withheld from the guidance: Answer 42")
    assert refused.refused is not None and f"carries the expected answer '{EXPECTED}'" in refused.refused
    assert record.status is AttributionStatus.UNVERIFIED and record.step_index == 3  # the localization is kept
    assert "the plan's instruction carries the expected answer" in record.reason


def test_a_point_whose_control_answers_right_is_shown_once_then_left(shared_data: Path) -> None:
    """A deterministic control that answers right with no intervention makes every flip at its rollback point not
    attributable: one intervention shows it, then the budget goes to other points, not to more corrections there
    (found dry-running BIG-Bench-Mistake: the auditor's corrected thought, then the agent's own proposals, each
    replayed at such a point)."""
    from benchmarks.evaluation.loaders import load_benchmark
    from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter

    item = load_benchmark("bbm", shared_data, limit=1)[0]
    step = min(item.trace.steps[-1].index, 3)
    proposals = 0

    def respond(request: ScriptedRequest) -> Any:
        nonlocal proposals
        if request.stage == "agent_replay":  # right from any prefix, told anything or nothing
            proposals += request.temperature is not None
            return {"steps": [f"Another way {proposals}."], "answer": item.expected}
        if request.stage == "localize":
            return {"error_step": step, "confidence": 0.8, "reasoning": "r", "what_should_have_been_done": "w"}
        if request.stage == "diagnose":
            return {"root_cause": "r", "correction_instruction": "redo the step", "forbidden_actions": [],
                    "corrected_thought": "A corrected step.", "confidence": 0.9}  # fmt: skip
        if request.stage == "gate":
            return {"is_faithful": True, "violation_reason": None, "violation_type": None}
        if request.stage == "classify":
            return {
                "error_type": "formatting_error",
                "confidence": 0.5,
                "explanation": "e",
                "suggested_correction": "c",
            }
        return {"reasoning": "r", "error_type": "formatting_error", "explanation": "e"}

    llm = ScriptedLLM(respond=respond)
    config = ReflectConfig(rounds=1, rollback_points=2, max_replays=None, proposal_samples=2)
    pipeline = ReflectPipeline(llm, verifier=BBMVerifier(), config=config)
    record = pipeline.attribute(item.trace, expected=item.expected, replay=ReasoningReplayAdapter(llm))
    assert record.status is AttributionStatus.NOT_ATTRIBUTABLE, record.reason
    # each point: its control, then one intervention; never a second correction where the control already flips
    assert controls(record) == [step - 1, step - 2] and interventions(record) == [step - 1, step - 2]
    # proposals sampled once per point, for its resampled decision (tried first); the auditor's thought never ran
    assert proposals == 2 * config.proposal_samples
    assert record.obstacle is not None and record.obstacle.value == "control_flipped"


def test_a_control_that_names_the_runs_option_by_its_text_reproduces_the_run() -> None:
    # a chain of thought whose run answered "(B)" and whose replays answer with option B's text: the same answer
    question = "At the end, Claire has the\nOptions:\n(A) green ball.\n(B) orange ball.\n(C) red ball."
    steps = [{"reasoning": "Claire swaps with Bob."}, {"reasoning": "So the answer is (B)", "is_final_answer": True}]
    trace = make_trace(question, steps)
    again = ScriptedReplayAdapter(  # left alone it answers as its run did, in words
        lambda trace, point, injection: [{"reasoning": "So the answer is the orange ball", "is_final_answer": True}],
        deterministic=True,
    )
    llm = auditor(localize=[1])
    record = ReflectPipeline(llm, verifier=BBMVerifier(), config=ReflectConfig(rounds=1, rollback_points=1)).attribute(
        trace, expected="(A)", replay=again
    )
    (control,) = [a for a in record.replays if a.arm is ReplayArm.CONTROL]
    assert control.verdict is not None and control.verdict.extracted_answer == "(B)"
    assert control.reproduced and record.fidelity is not None and record.fidelity.reproduced == 1


# -- what a skeptic accepts as verified: a change of effect, no sensitivity, nothing written with the answer ---------
_TOOLS = tuple(
    ToolDefinition(name=name, parameters={"type": "object", "properties": props, "required": list(props)})
    for name, props in {
        "read": {"x": {"type": "integer"}},
        "add": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "multiply": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "double": {"v": {"type": "integer"}},
    }.items()
)


def _auditor_writing(call: dict[str, Any], *, localize: int = 3) -> ScriptedLLM:
    """The scripted auditor, localizing ``localize``, whose diagnosis writes ``call`` as the corrected step."""
    base = auditor(localize=[localize])

    def respond(request: ScriptedRequest) -> Any:
        out = base._respond(request)  # type: ignore[misc]
        return {**out, "corrected_call": call} if request.stage == "diagnose" else out

    return ScriptedLLM(respond=respond)


def _reflect(llm: ScriptedLLM, adapter: ReplayAdapter, **config: Any) -> AttributionRecord:
    settings = {"rounds": 1, "rollback_points": 1, "proposal_samples": 1, "max_replays": None, **config}
    trace = five_step_trace().model_copy(update={"tools": _TOOLS})
    return ReflectPipeline(llm, verifier=OracleVerifier(), config=ReflectConfig(**settings)).attribute(
        trace, expected=EXPECTED, replay=adapter
    )


MULTIPLY = {"tool": "multiply", "arguments": {"a": 6, "b": 7}}


def test_any_executed_call_flipping_the_run_makes_the_point_sensitive_and_nothing_there_verifies() -> None:
    """The placebo's nt-1356 and nt-1342: any call executed at the step flipped the run (the agent got more turns).
    The sensitivity arm (the step's own call, its arguments reordered) flips too: not attributable, sensitive."""

    def any_action_fixes(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        acted = point > 0 and not trace.steps[point - 1].reasoning  # an executed action carries no thought
        return [{"reasoning": f"The answer is {42 if acted else 41}", "is_final_answer": True}]

    tools = {"multiply": lambda a, b: a * b, "add": lambda a, b: a + b}
    adapter = ScriptedReplayAdapter(any_action_fixes, tools=tools, deterministic=True)
    record = _reflect(_auditor_writing(MULTIPLY), adapter, actions=True)
    assert record.status is AttributionStatus.NOT_ATTRIBUTABLE, record.reason
    assert record.obstacle is not None and record.obstacle.value == "sensitive"
    assert record.effect is not None and record.effect.sensitivity is not None
    assert record.effect.text() == "intervention flipped 1 of 1, control 0 of 1, sensitivity 1 of 1"
    assert "changed in text only (its arguments in reverse order) flips the run too" in record.reason
    (sensitive,) = [a for a in record.replays if a.arm is ReplayArm.SENSITIVITY]
    assert sensitive.correction is None and sensitive.change is not None and sensitive.change.value == "same_effect"


def test_a_call_that_gives_the_step_its_own_result_back_flips_nothing_that_counts() -> None:
    """Seed 48's nt-58: another call text, the same rows; the greedy continuation took another path. The flip is not
    the step's change of effect: not attributable, no change of effect."""

    def text_sensitive(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        call = trace.steps[point - 1] if point else None
        lucky = call is not None and call.tool_args.get("b") == 6  # add(7, 6): the same sum, another text
        return [{"reasoning": f"The answer is {42 if lucky else 41}", "is_final_answer": True}]

    adapter = ScriptedReplayAdapter(
        text_sensitive, tools={"add": lambda a, b: a + b, "multiply": lambda a, b: a * b}, deterministic=True
    )
    record = _reflect(_auditor_writing({"tool": "add", "arguments": {"a": 7, "b": 6}}), adapter, actions=True)
    assert record.status is AttributionStatus.NOT_ATTRIBUTABLE, record.reason
    assert record.obstacle is not None and record.obstacle.value == "no_change_of_effect"
    (flip,) = [a for a in record.replays if a.arm is ReplayArm.INTERVENTION and a.flipped]
    assert flip.change is not None and flip.change.value == "same_effect" and not flip.changed_step
    assert "produced what the original step produced" in record.reason


def test_a_call_the_run_made_later_or_in_place_of_its_answer_is_never_tried() -> None:
    """Wrong-step nt-801 and nt-849: the run's own later call at an earlier step; and any call in place of the answer
    turn (the placebo's nt-1356). Both are refused before any replay, saying why."""
    adapter = agent(fixed_at=(1, 2, 3, 4))
    later = {"tool": "double", "arguments": {"v": 13}}  # step 4's call, at step 3
    record = _reflect(_auditor_writing(later), adapter, actions=True)
    (moved,) = [c for c in record.corrections if c.source == "llm" and c.kind.value == "action"]
    assert moved.refused == "the replacement is a call the run itself made at a later step, moved earlier"
    assert all(a.correction is None or a.correction.replacement is None or a.correction.replacement.tool_name !=
               "double" for a in record.replays)  # fmt: skip
    answer_turn = _reflect(_auditor_writing(MULTIPLY, localize=5), adapter, actions=True)
    (refused,) = [c for c in answer_turn.corrections if c.source == "llm" and c.kind.value == "action"]
    assert refused.step_index == 5 and refused.refused is not None and "answer turn" in refused.refused
    assert all(a.rollback_point != 4 for a in answer_turn.replays)  # step 5 is never replaced


def test_a_decisive_step_is_localized_only_when_the_same_source_elsewhere_does_not_flip() -> None:
    # the auditor's call fixes the run at step 3 only: asked for step 2's corrected call (the nearest other step),
    # it writes the same multiplication, which there changes the step's effect and does not flip the run
    localized = _reflect(_auditor_writing(MULTIPLY), agent(fixed_at=(3,)), actions=True)
    assert localized.status is AttributionStatus.VERIFIED and localized.step_index == 3
    test = localized.localization_test
    assert test is not None and test.outcome.value == "localized" and test.step_index == 2
    assert localized.claim == "localized"
    assert test.control is not None and test.intervention is not None and test.intervention.flips == 0
    assert [(a.arm.value, a.rollback_point) for a in localized.replays][-2:] == [("control", 1), ("localization", 1)]
    # the same call fixes the run at step 2 too: the run turns on more than step 3; decisive, not localized
    decisive = _reflect(_auditor_writing(MULTIPLY), agent(fixed_at=(2, 3)), actions=True)
    assert decisive.status is AttributionStatus.VERIFIED and decisive.claim == "decisive"
    assert decisive.localization_test is not None and decisive.localization_test.outcome.value == "not_localized"


@pytest.mark.parametrize("method", ["reflect", "control-wrong-step", "dover", "reflexion"])
def test_no_prompt_that_writes_what_a_replay_executes_shows_the_expected_answer(method: str) -> None:
    """The oracle regime shows the localizer the answer; the texts and calls a replay executes (the diagnosis and
    its corrected call, the gate's choice of proposals, DoVer's interventions, Reflexion's memory) are written
    without it, nor from the words of the stages that saw it."""
    from reflect_otel.attribution.methods import METHODS

    others = {
        "reflect": {"reflection": "multiply the two numbers"},
        "reflexion_extract": {"error_step": 3, "responsible_agent": None, "reason": "r",
                              "error_type": "tool_error", "confidence": 0.5},
        "dover_hypotheses": {"hypotheses": [{"step": 3, "hypothesis": "h", "intervention": "multiply"}]},
    }  # fmt: skip
    scripted = auditor(localize=[3])

    def respond(request: ScriptedRequest) -> Any:
        return others[request.stage] if request.stage in others else scripted._respond(request)  # type: ignore[misc]

    llm = ScriptedLLM(respond=respond)
    config = ReflectConfig(rounds=1, rollback_points=2, max_replays=None, proposal_samples=1)
    trace = five_step_trace().model_copy(update={"tools": _TOOLS})
    METHODS[method].build(llm, OracleVerifier(), config).attribute(trace, expected="42", replay=agent())
    writers = {"diagnose", "gate", "dover_hypotheses", "reflect"}
    written = [r for r in llm.requests if r.stage in writers]
    assert written, [r.stage for r in llm.requests]
    for request in written:  # "42" appears nowhere in the run: only as the expected answer
        assert "42" not in request.text, request.stage
        # nor the classifier's suggestion ("multiply instead"), which was written with the answer in view
        assert request.stage != "diagnose" or "multiply instead" not in request.text
    localized = [r for r in llm.requests if r.stage in {"localize", "reflexion_extract"}]
    assert method == "dover" or any("42" in r.text for r in localized)  # the oracle regime, for localizing only


def test_a_run_whose_answer_is_undecided_is_not_attributed() -> None:
    """An answer naming the right value among others ("either 41 or 42") is no failure: nothing is replayed."""
    trace = five_step_trace().model_copy(update={"final_answer": "It is either 41 or 42"})
    adapter = agent(fixed_at=(2,))
    record = ReflectPipeline(auditor(localize=[3]), verifier=OracleVerifier()).attribute(
        trace, expected=EXPECTED, replay=adapter
    )
    assert record.status is AttributionStatus.SKIPPED and "undecided" in record.reason
    assert adapter.calls == [] and record.replays == ()


def test_a_localization_test_records_what_it_executed_a_guided_step_included() -> None:
    """The record's correction for the localization test: the one whose replacement changed the step, else the first
    that ran (a guided step has no replacement and ran), never the empty frame of a resampling or guidance trial."""
    from reflect_otel.attribution.search import _tried
    from reflect_otel.attribution.trial import Decision, Trial, TrialResult
    from reflect_otel.record import Correction, InterventionKind, ReplayAttempt, StepChange
    from reflect_otel.trace import StepAction

    frame = Correction(source="resample", kind=InterventionKind.GUIDANCE, step_index=2)
    trial = Trial(frame)
    guided = frame.model_copy(update={"replays": 1})
    nothing = TrialResult(trial, Decision.NO_FLIP, "", corrections=(frame,))
    assert _tried(trial, nothing, ()) is frame  # nothing ran: the frame is all there is
    assert _tried(trial, TrialResult(trial, Decision.NO_FLIP, "", corrections=(guided,)), ()) is guided
    first = StepAction(tool_name="count_rows", arguments={"table": "t0"})
    second = StepAction(tool_name="filter_rows", arguments={"table": "t0", "value": "1st"})
    ran = [
        Correction(source="resample", kind=InterventionKind.ACTION, step_index=2, replacement=r, replays=1)
        for r in (first, second)
    ]
    changed = ReplayAttempt(round=1, rollback_point=1, injection="", correction=ran[1], change=StepChange.CHANGED)
    assert _tried(trial, TrialResult(trial, Decision.NO_FLIP, "", corrections=tuple(ran)), (changed,)) is ran[1]
