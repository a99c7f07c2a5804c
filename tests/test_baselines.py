"""Each baseline's LLM call count matches its definition on traces of known length."""

from __future__ import annotations

from typing import Any

import pytest

from reflect_otel.baselines import BASELINES, binary_search_calls
from reflect_otel.config import ReflectConfig
from reflect_otel.prompts import WITHHELD
from reflect_otel.record import AttributionStatus
from reflect_otel.testing import ScriptedLLM, ScriptedReplayAdapter, ScriptedRequest, make_trace
from reflect_otel.trace import StructuredTrace
from reflect_otel.verifiers import OracleVerifier

T = 8


def trace_of(length: int) -> StructuredTrace:
    steps = [{"tool": "step", "args": {"i": i}, "result": str(i), "reasoning": f"doing {i}"} for i in range(1, length)]
    return make_trace(
        "q?", [*steps, {"reasoning": "The answer is wrong", "is_final_answer": True}], final_answer="wrong"
    )


def answers(flag_at: int | None = None, halves: list[str] | None = None) -> ScriptedLLM:
    halves = list(halves or [])

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
            return {"reflection": "I should have checked step 3; the answer is Right"}
        if stage == "localize":
            return {"error_step": 4, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": "w"}
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
    assert "Right" not in call.injection and "the answer is [the answer]" in call.injection  # never the answer
    assert record.total_calls == 2 and record.step_index == 3  # the step its reflection blames
    assert record.status is AttributionStatus.UNVERIFIED and record.confidence is None  # a retry tests no step
    assert [a.flipped for a in record.replays] == [flips]
    assert record.corrected_answer == ("The answer is right" if flips else None)


def test_ics_localizes_once_per_iteration_and_resamples_with_no_hint() -> None:
    llm = answers()
    adapter = never_flips()
    record = attribute("ics", llm, replay=adapter, rounds=3)
    assert record.total_calls == 3 and [c.injection for c in adapter.calls] == ["", "", ""]
    assert [c.rollback_point for c in adapter.calls] == [3, 3, 3]  # bare prefix before the localized step 4
    assert all(WITHHELD in r.text for r in llm.requests)
    assert record.status is AttributionStatus.UNVERIFIED


def test_dover_validates_each_hypothesis_without_relocalizing() -> None:
    llm = answers()
    flips_at_4 = ScriptedReplayAdapter(
        lambda trace, point, injection: [{"reasoning": "The answer is right" if point == 4 else "The answer is wrong"}]
    )
    record = attribute("dover", llm, replay=flips_at_4)
    assert [c.injection for c in flips_at_4.calls] == ["do x", "do y"]
    assert record.total_calls == 2  # hypotheses + classification of the supported one
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 5
    unsupported = attribute("dover", answers(), replay=never_flips())
    assert unsupported.status is AttributionStatus.UNVERIFIED and unsupported.step_index == 2


@pytest.mark.parametrize(("method", "step"), [("first-step", 1), ("last-step", T)])
def test_position_baselines_call_nothing(method: str, step: int) -> None:
    llm = answers()
    record = attribute(method, llm)
    assert record.total_calls == 0 and not llm.requests and record.step_index == step
