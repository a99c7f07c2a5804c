"""Each baseline's LLM call count matches its definition on traces of known length."""

from __future__ import annotations

from typing import Any

import pytest

from reflect_otel.attribution._replayer import NEUTRAL_INJECTION
from reflect_otel.attribution.baselines import BASELINES, binary_search_calls
from reflect_otel.config import ReflectConfig
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.prompts import WITHHELD
from reflect_otel.record import AttributionStatus
from reflect_otel.testing import (
    ScriptedLLM,
    ScriptedProposingAdapter,
    ScriptedReplayAdapter,
    ScriptedRequest,
    make_trace,
)
from reflect_otel.trace import StructuredTrace

T = 8


def trace_of(length: int) -> StructuredTrace:
    steps = [{"tool": "step", "args": {"i": i}, "result": str(i), "reasoning": f"doing {i}"} for i in range(1, length)]
    return make_trace(
        "q?", [*steps, {"reasoning": "The answer is wrong", "is_final_answer": True}], final_answer="wrong"
    )


def answers(
    flag_at: int | None = None, halves: list[str] | None = None, reflection: str = "I should have checked step 3"
) -> ScriptedLLM:
    halves = list(halves or [])
    localized = iter([4, 3, 2])

    def respond(request: ScriptedRequest) -> Any:
        stage = request.stage
        if stage == "sbs":
            current = int(request.text.split("Is step ")[1].split(" ")[0])
            return {"is_error": current == flag_at, "reason": "checked"}
        if stage == "bs":
            return {"half": halves.pop(0) if halves else "first", "reason": "there"}
        if stage == "bs_reason":
            return {"reason": "because", "error_type": "goal_deviation", "confidence": 0.5}
        if stage in ("aao", "reflexion_extract"):
            return {
                "error_step": 3,
                "responsible_agent": None,
                "reason": "r",
                "error_type": "tool_error",
                "confidence": 0.6,
            }
        if stage == "reflect":
            return {"reflection": reflection}
        if stage == "localize":
            step = next(localized)
            return {"error_step": step, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": "w"}
        if stage == "gate":
            return {"is_faithful": True, "violation_reason": None, "violation_type": None}
        if stage == "dover_hypotheses":
            return {
                "hypotheses": [
                    {"step": 2, "hypothesis": "h1", "intervention": "do x"},
                    {"step": 5, "hypothesis": "h2", "intervention": "do y"},
                ]
            }
        if stage == "classify":
            return {"error_type": "tool_error", "confidence": 0.4, "explanation": "e", "suggested_correction": "s"}
        raise AssertionError(stage)

    return ScriptedLLM(respond=respond)


def attribute(method: str, llm: ScriptedLLM, length: int = T, replay: Any = None, **config: Any) -> Any:
    baseline = BASELINES[method](llm, verifier=OracleVerifier(), config=ReflectConfig(**config))
    return baseline.attribute(trace_of(length), expected="right", replay=replay)


def never_flips() -> ScriptedReplayAdapter:
    return ScriptedReplayAdapter(lambda trace, point, injection: [{"reasoning": "The answer is still wrong"}])


def test_all_at_once_is_one_call() -> None:
    llm = answers()
    record = attribute("aao", llm)
    assert len(llm.requests) == record.total_calls == 1 and record.step_index == 3


@pytest.mark.parametrize(("flag_at", "calls", "step"), [(5, 5, 5), (1, 1, 1), (None, T, T)])
def test_step_by_step_calls_until_the_first_flag(flag_at: int | None, calls: int, step: int) -> None:
    llm = answers(flag_at=flag_at)
    record = attribute("sbs", llm)
    assert record.total_calls == calls and record.step_index == step


@pytest.mark.parametrize(
    "halves", [["first"] * 3, ["second"] * 3, ["first", "second", "first"], ["second", "first", "second"]]
)
def test_binary_search_is_log2_plus_one(halves: list[str]) -> None:
    llm = answers(halves=halves)
    record = attribute("bs", llm)
    assert record.total_calls == binary_search_calls(T) == 4
    expected = {"first,first,first": 1, "second,second,second": 8, "first,second,first": 3, "second,first,second": 6}
    assert record.step_index == expected[",".join(halves)]


def test_binary_search_on_one_step_only_asks_the_reason() -> None:
    assert attribute("bs", answers(), length=1).total_calls == 1 == binary_search_calls(1)


@pytest.mark.parametrize("method", ["reflexion", "reflexion-nogt"])
def test_reflexion_is_two_calls_and_nogt_withholds_the_answer(method: str) -> None:
    llm = answers()
    record = attribute(method, llm)
    assert record.total_calls == 2 and record.step_index == 3
    shown = llm.requests[0].text
    assert ("right" in shown) == (method == "reflexion") and (WITHHELD in shown) == (method == "reflexion-nogt")


@pytest.mark.parametrize("flips", [True, False])
def test_reflexion_retries_from_the_start_with_its_reflection_and_verifies_no_step(flips: bool) -> None:
    llm = answers()
    retry = ScriptedReplayAdapter(
        lambda trace, point, injection: [{"reasoning": f"The answer is {'right' if flips else 'still wrong'}"}]
    )
    record = attribute("reflexion", llm, replay=retry)
    [call] = retry.calls
    assert call.rollback_point == 0 and "I should have checked step 3" in call.injection  # a new trial, with memory
    assert record.total_calls == 2 and record.step_index == 3  # the step its reflection blames
    assert record.status is AttributionStatus.UNVERIFIED and record.confidence is None  # a retry tests no step
    assert [a.flipped for a in record.replays] == [flips]
    assert record.corrected_answer == ("The answer is right" if flips else None)


@pytest.mark.parametrize("memory", ["I should have checked step 3; the answer is Right", "Next time answer Right."])
def test_a_reflexion_memory_that_carries_or_states_the_answer_is_never_replayed(memory: str) -> None:
    retry = never_flips()
    record = attribute("reflexion", answers(reflection=memory), replay=retry)
    assert retry.calls == [] and record.replays == ()
    (refused,) = record.corrections
    assert refused.source == "reflexion" and refused.refused is not None
    assert "the retry was not run" in record.reason


def resampling_agent() -> ScriptedProposingAdapter:
    """Greedy; left alone it answers as the run did; its resampled steps differ from the run's but fix nothing."""
    return ScriptedProposingAdapter(
        lambda trace, point, injection: [{"reasoning": "The answer is wrong", "is_final_answer": True}],
        lambda trace, point, injection, sample, temperature: {"tool": "step", "args": {"i": 100 + point}},
        tools={"step": lambda i: str(i)},
        deterministic=True,
    )


def test_ics_localizes_once_per_round_and_resamples_with_no_hint_under_control() -> None:
    llm = answers()
    adapter = resampling_agent()
    record = attribute("ics", llm, replay=adapter, rounds=3, rollback_points=1)
    # one localization per round, each naming a new step; the agent resamples that step with no hint
    assert [loc.step_index for loc in record.localizations] == [4, 3, 2]
    assert record.total_calls == 3 and [p.injection for p in adapter.proposals] == ["", "", ""]
    assert [c.rollback_point for c in adapter.calls] == [3, 3, 2, 2, 1, 1]  # a control, then the resample
    assert [c.action is None for c in adapter.calls] == [True, False] * 3
    assert all(WITHHELD in r.text for r in llm.requests)
    assert record.status is AttributionStatus.UNVERIFIED


def test_dover_validates_each_hypothesis_under_control_without_relocalizing() -> None:
    llm = answers()
    follows_y = ScriptedReplayAdapter(
        lambda trace, point, injection: [
            {"reasoning": "The answer is right" if injection == "do y" else "The answer is wrong"}
        ],
        tools={"step": lambda i: str(i)},  # as the run recorded its results
        deterministic=True,
    )
    record = attribute("dover", llm, replay=follows_y)
    # each hypothesis's step: the control from its prefix, then its intervention; the flip, then its sensitivity arm
    assert [(c.rollback_point, c.injection) for c in follows_y.calls] == [
        (1, ""),
        (1, "do x"),
        (4, ""),
        (4, "do y"),
        (4, NEUTRAL_INJECTION),  # this agent regenerates its step: a text that asks for nothing, where "do y" was
    ]
    assert [r.stage for r in llm.requests] == ["dover_hypotheses", "classify", "gate", "gate"]
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 5
    assert record.effect is not None
    assert record.effect.text() == "intervention flipped 1 of 1, control 0 of 1, sensitivity 0 of 1"
    unsupported = attribute("dover", answers(), replay=never_flips())
    assert unsupported.status is AttributionStatus.UNVERIFIED and unsupported.step_index == 2


@pytest.mark.parametrize(("method", "step"), [("first-step", 1), ("last-step", T)])
def test_position_baselines_call_nothing(method: str, step: int) -> None:
    llm = answers()
    record = attribute(method, llm)
    assert record.total_calls == 0 and not llm.requests and record.step_index == step
