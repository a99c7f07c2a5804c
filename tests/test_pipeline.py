"""REFLECT's semantics (Algorithm 1) with a scripted auditor and a scripted agent."""

from __future__ import annotations

from typing import Any

from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.errors import LLMError
from reflect_otel.pipeline import ReflectPipeline, rollback_points
from reflect_otel.record import AttributionRecord, AttributionStatus, ErrorType
from reflect_otel.testing import ScriptedLLM, ScriptedReplayAdapter
from reflect_otel.testing.examples import EXPECTED, five_step_trace
from reflect_otel.testing.examples import scripted_agent as agent
from reflect_otel.testing.examples import scripted_auditor as auditor
from reflect_otel.trace import StructuredTrace
from reflect_otel.verifiers import OracleVerifier


def run(llm: ScriptedLLM, adapter: ScriptedReplayAdapter | None, **config: Any) -> AttributionRecord:
    """The paper's Algorithm 1 (guidance only) unless a test turns actions on; tests/test_corrections.py covers
    actions."""
    pipeline = ReflectPipeline(llm, verifier=OracleVerifier(), config=ReflectConfig(**{"actions": False, **config}))
    return pipeline.attribute(five_step_trace(), expected=EXPECTED, replay=adapter)


def test_rollback_points_are_the_localized_step_and_those_before() -> None:
    assert rollback_points(5, 3) == [5, 4, 3]
    assert rollback_points(2, 3) == [2, 1]
    assert rollback_points(1, 3) == [1]


def test_success_at_i0_minus_1_is_the_verified_attribution() -> None:
    llm = auditor(localize=[3])
    # the scripted agent gets the kept prefix's length: it answers right when step 2 is regenerated (step 1 kept)
    adapter = agent(lambda kept, _: "42" if kept == 1 else "41")
    record = run(llm, adapter)
    assert record.status is AttributionStatus.VERIFIED
    assert record.step_index == 2
    assert record.span_id == five_step_trace().steps[1].span_id
    assert record.intervention is not None and record.intervention.rollback_point == 1
    assert [c.rollback_point for c in adapter.calls] == [2, 1]  # step 3 then step 2 regenerated; stop at the flip
    assert [a.flipped for a in record.replays] == [False, True]
    assert record.corrected_answer == "The answer is 42"
    assert record.error_type is ErrorType.INCORRECT_PROBLEM_IDENTIFICATION
    assert "adding was the wrong operation" in record.explanation  # refined by the post-correction explanation
    assert record.root_cause == "it added instead of multiplying"
    assert llm.stages() == ["localize", "classify", "diagnose", "gate", "gate", "explain"]
    # the injection is the paper's repair message, naming the localized step
    assert adapter.calls[0].injection.startswith("IMPORTANT - CORRECTION CONTEXT:")
    assert "failed at Step 3" in adapter.calls[0].injection and "- add" in adapter.calls[0].injection


def test_hard_gate_rejects_unfaithful_first_step_and_retry_carries_feedback() -> None:
    plan = {
        "root_cause": "wrong tool",
        "correction_instruction": "call multiply",
        "forbidden_actions": [],
        "expected_next_tool": "multiply",
        "confidence": 0.9,
    }
    llm = auditor(localize=[3], plan=plan)

    def continue_with(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        tool = "multiply" if "GATE RETRY FEEDBACK (retry 1 failed)" in injection else "subtract"
        return [{"tool": tool, "args": {"a": 6, "b": 7}, "result": "42"}, {"reasoning": "The answer is 42"}]

    adapter = ScriptedReplayAdapter(continue_with)
    record = run(llm, adapter, gate=GateMode.HARD, gate_retries=3)
    first, second = record.replays[:2]
    # the first try flipped the answer, but its first step ignored the plan: not accepted as evidence
    assert first.flipped and first.gate is not None and not first.gate.is_faithful
    assert first.gate.violation_type == "ignores_instruction" and first.gate.decided_by == "rule"
    assert "GATE RETRY FEEDBACK (retry 1 failed)" in second.injection
    assert "Previous first regenerated tool: subtract" in second.injection
    assert "expected_next_tool=multiply" in second.injection
    assert second.gate_retry == 1 and second.flipped
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 3
    assert record.intervention is not None and "GATE RETRY FEEDBACK" in record.intervention.injection


def test_soft_gate_logs_but_accepts() -> None:
    llm = auditor(localize=[3], gate_faithful=False)
    record = run(llm, agent(lambda point, _: "42"), gate=GateMode.SOFT)
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 3
    assert record.replays[0].gate is not None and not record.replays[0].gate.is_faithful
    assert len(record.replays) == 1


def test_failed_round_relocalizes_on_the_best_candidate() -> None:
    llm = auditor(localize=[4, 3])
    # round 1 (from step 4's localization) never flips; round 2 flips regenerating step 3 of the candidate trace
    adapter = agent(lambda kept, injection: "42" if len(adapter.calls) > 3 and kept == 2 else "41")
    record = run(llm, adapter, rounds=2, rollback_points=3)
    assert record.status is AttributionStatus.VERIFIED
    assert record.rounds == 2
    assert [loc.step_index for loc in record.localizations] == [4, 3]
    relocalize = [r for r in llm.requests if r.stage == "localize"][1]
    # round 2 audits the best candidate of round 1: the faithful replay that kept the longest prefix (3 steps)
    assert '"try": 3' in relocalize.text and "The answer is 41" in relocalize.text
    assert [c.rollback_point for c in adapter.calls] == [3, 2, 1, 2]


def test_exhaustion_gives_unverified_record_with_last_localization() -> None:
    llm = auditor(localize=[4, 3])
    adapter = agent(lambda point, _: "41")
    record = run(llm, adapter, rounds=2, rollback_points=2)
    assert record.status is AttributionStatus.UNVERIFIED
    assert record.step_index == 3 and record.rounds == 2
    assert "no replay flipped the outcome in 2 round(s)" in record.reason
    assert len(record.replays) == 4 and not any(a.flipped for a in record.replays)
    assert record.mode == "replay"


def test_malformed_json_gets_one_repair_retry_then_a_recorded_stage_error() -> None:
    llm = ScriptedLLM(by_stage={"localize": ["this is not json", "{still: broken"]})
    record = run(llm, agent(lambda point, _: "42"))
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
    record = run(llm, agent(lambda point, _: "42"))
    assert record.status is AttributionStatus.VERIFIED
    assert record.llm_calls[0].attempts == 2 and record.llm_calls[0].ok


def test_out_of_range_step_is_sent_back_once() -> None:
    base = auditor(localize=[3])
    bad = {"error_step": 99, "confidence": 0.5, "reasoning": "x", "what_should_have_been_done": "y"}
    llm = ScriptedLLM(by_stage={"localize": [bad]}, respond=base._respond)
    record = run(llm, agent(lambda point, _: "42"))
    assert "error_step must be a step number from 1 to 5, got 99" in llm.requests[1].messages[-1].content
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 3


def test_cost_sums_per_stage() -> None:
    llm = auditor(localize=[3])
    record = run(llm, agent(lambda kept, _: "42" if kept == 1 else "41"))
    by_stage = {c.stage: c for c in record.cost}
    assert {s: c.calls for s, c in by_stage.items()} == {
        "localize": 1,
        "classify": 1,
        "diagnose": 1,
        "gate": 2,
        "explain": 1,
    }
    assert record.total_calls == len(record.llm_calls) == len(llm.requests)
    assert sum(c.prompt_tokens for c in record.cost) == sum(c.prompt_tokens for c in record.llm_calls)
    expected_prompt = sum(sum(len(m.content) for m in r.messages) // 4 for r in llm.requests)
    assert sum(c.prompt_tokens for c in record.cost) == expected_prompt
    assert record.total_tokens == sum(c.prompt_tokens + c.completion_tokens for c in record.llm_calls)


def test_no_adapter_means_localization_only() -> None:
    record = run(auditor(localize=[4]), None)
    assert record.mode == "localization_only" and record.status is AttributionStatus.UNVERIFIED
    assert record.step_index == 4 and "no replay adapter" in record.reason


def test_correct_answer_is_skipped_without_llm_calls() -> None:
    llm = auditor()
    pipeline = ReflectPipeline(llm, verifier=OracleVerifier())
    record = pipeline.attribute(five_step_trace(), expected="41", replay=None)
    assert record.status is AttributionStatus.SKIPPED and not llm.requests


def test_replay_and_llm_failures_are_recorded_not_raised() -> None:
    def broken(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        raise RuntimeError("agent crashed")

    llm = auditor(localize=[3])
    record = run(llm, ScriptedReplayAdapter(broken), rounds=2)
    assert record.status is AttributionStatus.UNVERIFIED and record.step_index == 3
    assert {e.stage for e in record.errors} == {"replay"}
    assert all(a.error == "agent crashed" for a in record.replays)
    # an endpoint failure in a later stage keeps what was reached
    failing = ScriptedLLM(
        by_stage={"classify": [LLMError("endpoint down"), LLMError("endpoint down")]}, respond=auditor()._respond
    )
    record = run(failing, agent(lambda point, _: "42"))
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
    import pytest

    with pytest.raises(ReplayError, match="parallel tool calls"):
        check_rollback_point(trace, 1)
    with pytest.raises(ReplayError, match="outside"):
        check_rollback_point(trace, 3)


def test_repeated_replays_report_the_flip_rate() -> None:
    outcomes = iter(["42", "41", "42", "41", "41", "41"])
    adapter = agent(lambda point, _: next(outcomes))
    record = run(auditor(localize=[3]), adapter, replay_samples=3, gate=GateMode.SOFT)
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 3
    (rate,) = record.flip_rates
    assert (rate.rollback_point, rate.samples, rate.flips) == (2, 3, 2) and abs(rate.rate - 2 / 3) < 1e-9
    assert [a.sample for a in record.replays] == [0, 1, 2]
    assert len(adapter.calls) == 3  # all samples run to measure the rate, then the flip is accepted


def test_concurrent_replays_attribute_the_same_step_as_sequential_ones() -> None:
    """With replay_concurrency 3 the window's three points replay at once (a barrier only three concurrent
    replays pass); the attributed step is still the nearest that flips, and the record lists attempts in window
    order up to it."""
    import threading

    together = threading.Barrier(3, timeout=10)

    def answer(kept: int, _injection: str) -> str:
        together.wait()  # raises (a failed replay) unless all three run at once
        return "42" if kept <= 1 else "41"  # regenerating step 2 or step 1 flips it

    adapter = agent(answer)
    record = run(auditor(localize=[3]), adapter, rollback_points=3, replay_concurrency=3, gate=GateMode.SOFT)
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 2, record.errors
    assert [a.rollback_point for a in record.replays] == [2, 1]
    assert sorted(c.rollback_point for c in adapter.calls) == [0, 1, 2]  # the third ran too; its result is dropped
    sequential = run(auditor(localize=[3]), agent(lambda kept, _: "42" if kept <= 1 else "41"), rollback_points=3)
    assert (sequential.step_index, [a.rollback_point for a in sequential.replays]) == (2, [2, 1])


def test_a_plan_that_states_the_expected_answer_is_not_shown_it() -> None:
    """A correction that says the answer would flip a replay from any step and prove nothing about the step."""
    plan = {
        "root_cause": f"it added; the answer is {EXPECTED}",
        "correction_instruction": f"Answer {EXPECTED} by multiplying 6 and 7 (not {EXPECTED}0)",
        "forbidden_actions": [],
        "expected_next_tool": "final_answer",
        "expected_next_arguments": {"answer": EXPECTED},
        "confidence": 0.9,
    }
    adapter = agent(lambda kept, _: "41")
    record = run(auditor(localize=[3], plan=plan), adapter)
    # what the plan says: after the failed step's own record (data the agent saw) and before any gate feedback
    shown = "\n".join(c.injection.split("<<<END FAILED_STEP>>>")[-1].split("GATE RETRY")[0] for c in adapter.calls)
    assert adapter.calls and EXPECTED not in shown.replace(
        f"{EXPECTED}0", ""
    )  # a longer number that contains it is not it
    assert "Answer [the answer] by multiplying 6 and 7" in shown and '{"answer": "[the answer]"}' in shown
    assert "the answer is [the answer]" in shown and f"(not {EXPECTED}0)" in shown
    assert record.status is AttributionStatus.UNVERIFIED


def test_an_answer_too_short_to_tell_from_data_is_left_in_the_plan() -> None:
    from reflect_otel import stages
    from reflect_otel.record import RepairPlan

    plan = RepairPlan(correction_instruction="filter Silver = 2, then look up row 2")
    assert stages.without_answer(plan, "2") == plan
    hidden = stages.without_answer(plan.model_copy(update={"root_cause": "Kenya|Spain were missed"}), "Kenya|Spain")
    assert hidden.root_cause == "[the answer]|[the answer] were missed"
