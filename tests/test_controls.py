"""The paper's faithfulness controls (RQ3): a placebo plan (and corrected call) written for another failure, and the
run's own plan and corrected calls at another step; both REFLECT's pipeline otherwise, actions included, so their
flips are comparable with its flips."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.attribution._replayer import NEUTRAL_INJECTION
from reflect_otel.attribution.controls import NO_PLACEBO, NO_WRONG_STEP, PlanPool, auditor_model, plan_of, wrong_step
from reflect_otel.attribution.methods import METHODS
from reflect_otel.attribution.pipeline import MOVED_EARLIER
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.record import (
    AttributionMode,
    AttributionRecord,
    AttributionStatus,
    Correction,
    InterventionKind,
    LLMCall,
    LocalizationOutcome,
    RepairPlan,
)
from reflect_otel.testing import ScriptedLLM, ScriptedReplayAdapter, ScriptedRequest, make_trace
from reflect_otel.trace import StepAction, StructuredTrace

OWN_INSTRUCTION = "Filter the Position column on '1st', the value the table has."


def five_steps(question: str = "Where was the last 1st place?") -> StructuredTrace:
    calls = [{"tool": "lookup", "args": {"table": "t0", "row": i}, "result": f"row {i}"} for i in range(1, 5)]
    return make_trace(question, [*calls, {"reasoning": "Nowhere.", "is_final_answer": True}], final_answer="Nowhere.")


def auditor(
    step: int | Sequence[int], call: dict[str, Any] | None = None, root_cause: str = "the filter value"
) -> ScriptedLLM:
    """Localizes ``step`` (a sequence: one per round, in order); its diagnosis writes ``call`` as the corrected step
    when given."""
    steps = deque([step] if isinstance(step, int) else step)

    def respond(request: ScriptedRequest) -> Any:
        localized = steps.popleft() if request.stage == "localize" and len(steps) > 1 else steps[0]
        replies: dict[str, dict[str, Any]] = {
            "localize": {"error_step": localized, "confidence": 0.7, "reasoning": "r",
                         "what_should_have_been_done": "w"},
            "classify": {"error_type": "tool_error", "confidence": 0.6, "explanation": "e",
                         "suggested_correction": "s"},
            "diagnose": {"root_cause": root_cause, "correction_instruction": OWN_INSTRUCTION,
                         "forbidden_actions": [], "expected_next_tool": None, "expected_next_arguments": None,
                         "confidence": 0.8},
            "gate": {"is_faithful": True, "violation_reason": None, "violation_type": None},
            "explain": {"reasoning": "r", "error_type": "tool_error", "explanation": "e"},
        }  # fmt: skip
        out = replies[request.stage]
        return {**out, "corrected_call": call} if call is not None and request.stage == "diagnose" else out

    return ScriptedLLM(respond=respond)


def agent_that_follows(instruction: str) -> ScriptedReplayAdapter:
    """A greedy agent that redoes its step (a lookup it did not make) and answers right when the injection carries
    ``instruction``; left alone, it answers as the run did."""
    return ScriptedReplayAdapter(
        lambda trace, point, injection: [
            {"tool": "lookup", "args": {"table": "t0", "row": 99}, "result": "row 99"},
            {"reasoning": "Bangkok" if instruction in injection else "Nowhere.", "is_final_answer": True},
        ],
        tools={"lookup": lambda table, row: f"row {row}"},
        deterministic=True,
    )


OTHER_INSTRUCTION = "Sort the Year column descending before reading the first row."


def other_failure(question: str = "Which year had the most titles?", trace_id: str = "f" * 32) -> PlanPool:
    """A pool holding the plan the auditor wrote for another failure (another trace, another question)."""
    pool = PlanPool()
    pool.add(five_steps(question).model_copy(update={"trace_id": trace_id}), other_record(trace_id))
    return pool


def other_record(trace_id: str = "f" * 32) -> AttributionRecord:
    """The record of another failure, its plan a guidance instruction (no auditor call recorded)."""
    return AttributionRecord(
        trace_id=trace_id,
        method="reflect",
        status=AttributionStatus.UNVERIFIED,
        mode=AttributionMode.REPLAY,
        root_cause="it read the first row unsorted",
        corrections=(
            Correction(source="llm", kind=InterventionKind.GUIDANCE, step_index=2, finding=OTHER_INSTRUCTION),
        ),
    )


def attribute(
    method: str,
    step: int | Sequence[int],
    agent: ScriptedReplayAdapter,
    trace: StructuredTrace | None = None,
    plans: PlanPool | None = None,
    *,
    call: dict[str, Any] | None = None,
    **settings: Any,
) -> Any:
    """One attribution by ``method`` with :func:`auditor` (localizing ``step``, its diagnosis writing ``call``), one
    round, K=1 unless ``settings`` say otherwise, the soft gate."""
    config = ReflectConfig(**{"rounds": 1, "rollback_points": 1, "gate": GateMode.SOFT, **settings})
    attributor = METHODS[method].build(auditor(step, call), OracleVerifier(), config, plans)
    return attributor.attribute(trace or five_steps(), expected="Bangkok", replay=agent)


def test_the_wrong_step_is_two_steps_away_and_never_the_answer() -> None:
    trace = five_steps()  # steps 1-4 are calls, 5 the answer
    assert [wrong_step(trace, s) for s in (1, 2, 3, 4)] == [3, 4, 1, 2]
    short = make_trace("q", [{"tool": "a", "args": {}, "result": "r"}, {"reasoning": "x", "is_final_answer": True}])
    assert wrong_step(short, 1) is None
    two = make_trace(
        "q",
        [
            *[{"tool": "a", "args": {"n": i}, "result": "r"} for i in (1, 2)],
            {"reasoning": "x", "is_final_answer": True},
        ],
    )
    assert [wrong_step(two, s) for s in (1, 2)] == [2, 1]  # no step two away: the one next to it


def test_wrong_step_injects_the_runs_own_plan_two_steps_from_the_localized_one() -> None:
    agent = agent_that_follows(OWN_INSTRUCTION)
    record = attribute("control-wrong-step", 2, agent)
    control, resampled, call, sensitivity = agent.calls
    assert control.rollback_point == 3 and control.injection == ""  # the control from the same prefix
    assert resampled.rollback_point == 3 and resampled.injection == ""  # the agent's own step 4, resampled first
    assert call.rollback_point == 3 and OWN_INSTRUCTION in call.injection  # regenerates step 4, not step 2
    # this agent cannot propose (it redoes the step in the replay): the sensitivity arm injects a text that asks
    # for nothing where the plan was
    assert sensitivity.action is None and sensitivity.injection == NEUTRAL_INJECTION
    assert [(c.source, c.kind.value, c.step_index) for c in record.corrections] == [
        ("resample", "guidance", 4),
        ("control:wrong-step", "guidance", 4),
    ]
    # the same rule as REFLECT's: the plan at the wrong step flipped the run, its control and its sensitivity arm
    # did not
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 4


def test_wrong_step_does_not_replay_a_run_without_such_a_step() -> None:
    agent = agent_that_follows(OWN_INSTRUCTION)
    short = make_trace("q", [{"tool": "a", "args": {}, "result": "r"}, {"reasoning": "x", "is_final_answer": True}])
    record = attribute("control-wrong-step", 1, agent, short)
    assert agent.calls == [] and record.status is AttributionStatus.UNVERIFIED
    assert NO_WRONG_STEP in record.reason


def test_the_wrong_step_is_never_a_step_an_earlier_round_localized() -> None:
    trace = five_steps()  # steps 1-4 are calls
    assert wrong_step(trace, 3) == 1 and wrong_step(trace, 3, {1}) == 4  # 1 was localized: the next one, 4
    assert wrong_step(trace, 1, {3}) == 2 and wrong_step(trace, 1, {2, 3}) is None


def two_calls() -> StructuredTrace:
    return make_trace(
        "q",
        [
            {"tool": "lookup", "args": {"table": "t0", "row": 1}, "result": "row 1"},
            {"tool": "lookup", "args": {"table": "t0", "row": 2}, "result": "row 2"},
            {"reasoning": "Nowhere.", "is_final_answer": True},
        ],
    )


def test_wrong_step_does_not_test_the_step_round_one_localized_and_says_round_two_tested_nothing() -> None:
    """Two calls; round 1 localizes step 2 (the control tests step 1), round 2 localizes step 1: its only other step,
    2, is round 1's localization, the right step by the localizer's own account, so round 2 tests nothing."""
    agent = agent_fixed_by(99)  # nothing fixes this run: both rounds run
    record = attribute("control-wrong-step", [2, 1], agent, two_calls(), call=CALL, rounds=2)
    assert [loc.step_index for loc in record.localizations] == [2, 1]
    assert {(a.round, a.rollback_point) for a in record.replays} == {(1, 0)}  # step 1 only, never step 2
    assert all(call.rollback_point == 0 for call in agent.calls) and agent.calls
    # round 1: step 2's corrected call is never moved earlier, to step 1 (a later step's call repaired sooner
    # flips a run wherever it is executed); step 1 is tested by its resampled decision and the plan instead
    (moved,) = [c for c in record.corrections if c.refused == MOVED_EARLIER]
    assert (moved.kind.value, moved.step_index) == ("action", 2)
    idle = [c for c in record.corrections if c.refused is not None and c.refused != MOVED_EARLIER]
    assert idle and all(NO_WRONG_STEP in (c.refused or "") for c in idle)
    assert {(c.kind.value, c.step_index) for c in idle} == {("action", 1), ("guidance", 1)}  # round 2's, refused
    assert record.status is AttributionStatus.UNVERIFIED
    assert f"round 2 tested nothing ({NO_WRONG_STEP})" in record.reason


def test_wrong_step_moves_past_a_step_an_earlier_round_localized_to_the_next_one() -> None:
    """Round 1 localizes step 1 (the control tests step 3); round 2 localizes step 3: step 1, two away, was round
    1's localization, so the control tests step 4."""
    agent = agent_fixed_by(99)
    record = attribute("control-wrong-step", [1, 3], agent, call=CALL, rounds=2)
    assert [loc.step_index for loc in record.localizations] == [1, 3]
    tested = {(a.round, a.rollback_point + 1) for a in record.replays if a.arm.value == "intervention"}
    assert tested == {(1, 3), (2, 4)}


def test_placebo_injects_a_plan_written_for_another_failure_in_place_of_the_auditors() -> None:
    agent = agent_that_follows(OWN_INSTRUCTION)
    record = attribute("control-placebo", 2, agent, plans=other_failure())
    _control, call = agent.calls
    assert OTHER_INSTRUCTION in call.injection and OWN_INSTRUCTION not in call.injection
    assert call.rollback_point == 1  # the localized step, as REFLECT's guidance
    assert record.status is AttributionStatus.UNVERIFIED and call.action is None
    assert [r.stage for r in record.llm_calls][:3] == ["localize", "classify", "diagnose"]  # paid for as REFLECT's


def test_a_placebo_only_run_skips_its_first_failure_and_gives_the_next_the_plan_written_for_it() -> None:
    pool, first_agent = PlanPool(), agent_that_follows(OWN_INSTRUCTION)
    first = attribute("control-placebo", 2, first_agent, plans=pool)
    assert first.status is AttributionStatus.SKIPPED and first.reason == NO_PLACEBO
    assert first_agent.calls == [] and first.replays == ()  # nothing replayed
    assert [r.stage for r in first.llm_calls][:3] == ["localize", "classify", "diagnose"]  # its auditor was asked
    # a later failure (another question) of the same run gets the plan the auditor wrote for the first
    later = five_steps("Which year had the most titles?").model_copy(update={"trace_id": "b" * 32})
    agent = agent_that_follows(OWN_INSTRUCTION)
    record = attribute("control-placebo", 2, agent, trace=later, plans=pool)
    assert record.status is not AttributionStatus.SKIPPED
    assert any(OWN_INSTRUCTION in call.injection for call in agent.calls)


def test_a_placebo_is_never_the_plan_written_for_the_same_failure() -> None:
    trace = five_steps()
    assert other_failure(trace_id=trace.trace_id).other_than(trace) is None  # the same trace
    assert other_failure(question=trace.question.upper()).other_than(trace) is None  # the same question
    assert other_failure().other_than(trace) is not None


def test_a_placebo_draws_only_plans_its_own_auditor_model_wrote() -> None:
    """A store written with another auditor model holds that model's plans, not the same auditor's: the placebo
    does not draw them (a record with no auditor call recorded is taken as any model's)."""
    trace = five_steps()
    by_other = PlanPool()
    record = other_record()
    call = LLMCall(stage="diagnose", model="gpt-other", prompt_tokens=1, completion_tokens=1, seconds=0.1, attempts=1,
                   ok=True)  # fmt: skip
    by_other.add(five_steps("Which year had the most titles?").model_copy(update={"trace_id": "f" * 32}),
                 record.model_copy(update={"llm_calls": (call,)}))  # fmt: skip
    assert auditor_model(record.model_copy(update={"llm_calls": (call,)})) == "gpt-other"
    assert by_other.other_than(trace, model="qwen2.5-coder-1.5b-instruct") is None
    assert by_other.other_than(trace, model="gpt-other") is not None
    assert other_failure().other_than(trace, model="qwen2.5-coder-1.5b-instruct") is not None  # model not recorded
    # the same failure audited by both models (a store written with two): each model's plan is kept for its own
    # placebo, whichever came first
    ours = RepairPlan(root_cause="it filtered the wrong column", correction_instruction="Filter the Year column.")
    by_other.keep("f" * 32, "Which year had the most titles?", ours, model="qwen2.5-coder-1.5b-instruct")
    assert len(by_other) == 2
    assert by_other.other_than(trace, model="qwen2.5-coder-1.5b-instruct") == ours
    drawn = by_other.other_than(trace, model="gpt-other")
    assert drawn is not None and drawn.correction_instruction == OTHER_INSTRUCTION


def test_the_plan_of_a_record_is_its_auditors_and_a_placebos_record_gives_none() -> None:
    plan = other_failure().other_than(five_steps())
    assert plan is not None and plan.correction_instruction == OTHER_INSTRUCTION and plan.root_cause
    placebo = AttributionRecord(
        trace_id="e" * 32, method="control-placebo", status=AttributionStatus.UNVERIFIED, mode=AttributionMode.REPLAY,
        root_cause="x", corrections=(Correction(source="control:placebo", kind=InterventionKind.GUIDANCE,
                                                step_index=1, finding="another failure's plan"),),
    )  # fmt: skip
    assert plan_of(placebo) is None
    baseline = AttributionRecord(trace_id="d" * 32, method="aao", status=AttributionStatus.UNVERIFIED,
                                 mode=AttributionMode.LOCALIZATION_ONLY)  # fmt: skip
    assert plan_of(baseline) is None


def test_a_part_of_a_plan_withheld_from_the_guidance_is_never_a_placebos_instruction() -> None:
    """REFLECT's root cause names its answer, so that part is withheld and recorded as a refused correction; the
    plan a placebo later draws from the record is the instruction its guidance carried, not the refusal."""
    config = ReflectConfig(rounds=1, rollback_points=1, gate=GateMode.SOFT)
    llm = auditor(2, root_cause="the last 1st place was in Bangkok")
    record = (
        METHODS["reflect"]
        .build(llm, OracleVerifier(), config)
        .attribute(five_steps(), expected="Bangkok", replay=agent_that_follows("nothing it is told"))
    )
    assert record.corrections[0].refused is not None and "the plan's root cause" in record.corrections[0].finding
    plan = plan_of(record)
    assert plan is not None and plan.correction_instruction == OWN_INSTRUCTION
    pool = PlanPool()
    pool.add(five_steps(), record)
    drawn = pool.other_than(five_steps("Which year had the most titles?").model_copy(update={"trace_id": "e" * 32}))
    assert drawn is not None and drawn.correction_instruction == OWN_INSTRUCTION


def test_services_sharing_a_pool_give_the_placebo_the_plan_reflect_wrote_for_an_earlier_failure() -> None:
    config = ReflectConfig(rounds=1, rollback_points=1, gate=GateMode.SOFT)
    first = five_steps("Which year had the most titles?").model_copy(update={"trace_id": "a" * 32})
    reflect = AttributionService(auditor(2), METHODS["reflect"], verifier=OracleVerifier(), config=config)
    reflect.process(first, expected="Bangkok", replay=agent_that_follows("never"))
    assert len(reflect.plans) == 1
    agent = agent_that_follows("never")
    placebo = AttributionService(
        auditor(2), METHODS["control-placebo"], verifier=OracleVerifier(), config=config, plans=reflect.plans
    )
    outcome = placebo.process(five_steps(), expected="Bangkok", replay=agent)
    assert outcome.record is not None and outcome.record.status is not AttributionStatus.SKIPPED
    assert any(OWN_INSTRUCTION in call.injection for call in agent.calls)  # the plan written for the other failure


def test_a_placebo_started_on_a_store_draws_on_the_plans_stored_before_it(tmp_path: Path) -> None:
    from reflect_otel.exporters.duckdb_store import DuckDBStore

    config = ReflectConfig(rounds=1, rollback_points=1, gate=GateMode.SOFT)
    first = five_steps("Which year had the most titles?").model_copy(update={"trace_id": "a" * 32})
    store = DuckDBStore(tmp_path / "s.duckdb")
    reflect = AttributionService(auditor(2), METHODS["reflect"], verifier=OracleVerifier(), config=config, store=store)
    reflect.process(first, expected="Bangkok", replay=agent_that_follows("never"))
    store.close()
    # another process, later: a placebo on the same store, sharing no pool with the service that wrote the plan
    store = DuckDBStore(tmp_path / "s.duckdb")
    placebo = AttributionService(
        auditor(2), METHODS["control-placebo"], verifier=OracleVerifier(), config=config, store=store
    )
    assert len(placebo.plans) == 1
    agent = agent_that_follows("never")
    outcome = placebo.process(five_steps(), expected="Bangkok", replay=agent)
    assert outcome.record is not None and outcome.record.status is not AttributionStatus.SKIPPED
    assert any(OWN_INSTRUCTION in call.injection for call in agent.calls)  # the plan stored for the other failure
    # a service of another method does not read the store for plans it never draws on
    other = AttributionService(auditor(2), METHODS["reflect"], verifier=OracleVerifier(), config=config, store=store)
    assert len(other.plans) == 0
    store.close()


def test_a_store_that_cannot_be_read_leaves_the_placebo_with_no_plan_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from reflect_otel.exporters.duckdb_store import DuckDBStore

    class Unreadable(DuckDBStore):
        def recent_records(self, limit: int, *, excluding: str = "") -> list[tuple[str, AttributionRecord]]:
            raise OSError("the disk went away")

    store = Unreadable(tmp_path / "s.duckdb")
    placebo = AttributionService(auditor(2), METHODS["control-placebo"], verifier=OracleVerifier(), store=store)
    assert len(placebo.plans) == 0
    assert "the stored plans could not be read" in caplog.text
    outcome = placebo.process(five_steps(), expected="Bangkok", replay=agent_that_follows("never"))
    assert outcome.record is not None and outcome.record.reason == NO_PLACEBO  # as on an empty store
    store.close()


def test_the_plan_pool_keeps_the_latest_failures_and_draws_the_same_plan_whatever_the_order() -> None:
    """A long-running service feeds the pool every failure: it keeps the last ``max_plans``, dropping the oldest."""

    def plan(n: int) -> RepairPlan:
        return RepairPlan(root_cause=f"cause {n}", correction_instruction=f"instruction {n}")

    failures = [(f"{n:032x}", f"question {n}", plan(n)) for n in range(1, 8)]
    pool = PlanPool(max_plans=3)
    for trace_id, question, written in failures:
        pool.keep(trace_id, question, written)
    pool.keep(failures[-1][0], "question 7", plan(99))  # the first plan kept for a failure stays
    assert len(pool) == 3 and pool.max_plans == 3
    traces = [five_steps(f"asked {n}").model_copy(update={"trace_id": f"{n:031x}e"}) for n in range(40)]
    drawn = [pool.other_than(t) for t in traces]
    assert {p.correction_instruction for p in drawn if p} == {"instruction 5", "instruction 6", "instruction 7"}
    reversed_pool = PlanPool(max_plans=3)
    for trace_id, question, written in reversed(failures[-3:]):
        reversed_pool.keep(trace_id, question, written)
    assert [reversed_pool.other_than(t) for t in traces] == drawn  # the draw depends on the pool, not its order
    assert PlanPool().max_plans == 1000


CALL = {"tool": "lookup", "arguments": {"table": "t0", "row": 7}}


def agent_fixed_by(row: int) -> ScriptedReplayAdapter:
    """A greedy agent that answers right when the table's row ``row`` was looked up in the replay, else as the run."""

    def continue_with(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        looked = any(s.tool_args.get("row") == row for s in trace.steps[point - 1 : point] if point)
        return [{"reasoning": "Bangkok" if looked else "Nowhere.", "is_final_answer": True}]

    return ScriptedReplayAdapter(continue_with, tools={"lookup": lambda table, row: f"row {row}"}, deterministic=True)


def test_wrong_step_executes_the_auditors_corrected_call_at_the_wrong_step() -> None:
    agent = agent_fixed_by(7)
    record = attribute("control-wrong-step", 2, agent, call=CALL)
    acted = [c for c in agent.calls if c.action is not None]
    assert acted[0].rollback_point == 3  # step 4 replaced, not step 2
    assert acted[0].action is not None and acted[0].action.arguments == CALL["arguments"]
    action = next(c for c in record.corrections if c.kind is InterventionKind.ACTION)
    assert (action.source, action.step_index, action.original and action.original.arguments) == (
        "control:wrong-step",
        4,
        {"table": "t0", "row": 4},
    )
    # the same rule as REFLECT's: the call at the wrong step flipped the run and its control did not
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 4
    # but the same source (the auditor's corrected call, asked for step 3) flips the run at step 3 too: a call that
    # answers verifies wherever it is executed, so the record claims the step decisive, not localized
    test = record.localization_test
    assert test is not None and test.outcome is LocalizationOutcome.NOT_LOCALIZED and test.step_index == 3
    assert record.claim == "decisive"
    assert [c.rollback_point for c in acted] == [3, 3, 2]  # the intervention, its sensitivity arm, the test at 3


def test_placebo_executes_the_corrected_call_written_for_another_failure_not_its_own() -> None:
    pool = PlanPool()
    other = AttributionRecord(
        trace_id="f" * 32,
        method="reflect",
        status=AttributionStatus.UNVERIFIED,
        mode=AttributionMode.REPLAY,
        root_cause="it read the wrong row",
        corrections=(
            Correction(
                source="llm",
                kind=InterventionKind.ACTION,
                step_index=1,
                replacement=StepAction(tool_name="lookup", arguments={"table": "t0", "row": 30}),
            ),
        ),
    )
    pool.add(five_steps("Which year had the most titles?").model_copy(update={"trace_id": "f" * 32}), other)
    agent = agent_fixed_by(7)
    record = attribute("control-placebo", 2, agent, plans=pool, call=CALL)
    acted = [c.action for c in agent.calls if c.action is not None]
    assert [a.arguments for a in acted if a is not None] == [{"table": "t0", "row": 30}]  # the other failure's call
    assert all(c.source == "control:placebo" for c in record.corrections)  # no evidence rule's call
    assert record.status is not AttributionStatus.VERIFIED  # the other failure's call does not fix this run


def test_a_placebo_whose_drawn_call_is_refused_says_a_plan_was_drawn() -> None:
    """The drawn plan is a call alone, and that call carries this failure's answer: nothing is tested, and the
    record says why (the plan had no instruction, its call was refused), not that no plan was written yet."""
    pool = PlanPool()
    other = AttributionRecord(
        trace_id="f" * 32, method="reflect", status=AttributionStatus.UNVERIFIED, mode=AttributionMode.REPLAY,
        root_cause="it read the wrong row",
        corrections=(Correction(source="llm", kind=InterventionKind.ACTION, step_index=1,
                                replacement=StepAction(tool_name="lookup", arguments={"table": "t0", "row": 777})),),
    )  # fmt: skip
    pool.add(five_steps("Which year had the most titles?").model_copy(update={"trace_id": "f" * 32}), other)
    agent = agent_fixed_by(7)
    record = (
        METHODS["control-placebo"]
        .build(auditor(2, call=CALL), OracleVerifier(), ReflectConfig(rounds=1, rollback_points=1), pool)
        .attribute(five_steps(), expected="777", replay=agent)
    )
    refused = [c for c in record.corrections if c.kind is InterventionKind.ACTION]
    assert refused and all(c.refused and "expected answer" in c.refused for c in refused)
    assert record.status is AttributionStatus.UNVERIFIED and not agent.calls
    assert NO_PLACEBO not in record.reason and "no instruction to inject" in record.reason


def test_wrong_step_never_runs_a_correction_written_for_another_step_than_the_localized_one() -> None:
    """An evidence correction of the wrong step itself is REFLECT's own test of that step: the control skips it."""

    def rule(trace: StructuredTrace, step: Any, context: str) -> list[Correction]:
        return [
            Correction(
                source="evidence:test",
                kind=InterventionKind.ACTION,
                step_index=step.index,
                original=StepAction.of_step(step),
                replacement=StepAction(
                    tool_name="lookup", arguments={"table": "t0", "row": 7 + 10 * (step.index != 2)}
                ),
            )
        ]

    agent = ScriptedReplayAdapter(
        agent_fixed_by(99)._continue, tools={"lookup": lambda table, row: f"row {row}"}, deterministic=True,
        correction_rules=(rule,),
    )  # fmt: skip
    record = attribute("control-wrong-step", 2, agent, max_corrections=10)
    actions = [c for c in record.corrections if c.kind is InterventionKind.ACTION]
    # step 2's correction, moved to step 4; step 4's own (and steps 1 and 3's) never tried
    assert [(c.source, c.step_index) for c in actions] == [("evidence:test", 4)]
    assert [(c.rollback_point, c.action and c.action.arguments["row"]) for c in agent.calls if c.action] == [(3, 7)]


def test_wrong_step_guidance_is_never_where_reflects_own_guidance_is_tried() -> None:
    """Two calls before the answer, localized at step 2: the only other step, 1, is in REFLECT's window (K=2), so the
    control injects no plan there; nor does it move step 2's corrected call to step 1 (never earlier): it tests
    nothing, and says why."""
    two = make_trace(
        "q",
        [
            {"tool": "lookup", "args": {"table": "t0", "row": 1}, "result": "row 1"},
            {"tool": "lookup", "args": {"table": "t0", "row": 2}, "result": "row 2"},
            {"reasoning": "Nowhere.", "is_final_answer": True},
        ],
    )
    agent = agent_fixed_by(99)
    record = attribute("control-wrong-step", 2, agent, two, call=CALL, rollback_points=2)
    first = record.corrections[0]
    assert (first.kind.value, first.step_index, first.refused) == ("action", 2, MOVED_EARLIER)
    assert agent.calls == [] and record.status is AttributionStatus.UNVERIFIED
