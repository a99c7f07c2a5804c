"""The replay request and the keyword form third-party adapters written before it still use."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from reflect_otel.errors import ReplayError
from reflect_otel.replay import (
    BudgetedReplay,
    InjectionRole,
    ProposedStep,
    ReplayRequest,
    ReplayResult,
    proposer,
    replay_with,
    resampler,
)
from reflect_otel.testing import make_trace
from reflect_otel.trace import StepAction, StructuredTrace

TRACE = make_trace("2 + 3?", [{"reasoning": "2 + 3 = 6"}, {"reasoning": "So the answer is 6"}])


class KeywordAdapter:
    """An adapter written for the keyword form; it keeps what it was called with."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def replay(
        self, trace: StructuredTrace, *, rollback_point: int, injection: str, injection_role: InjectionRole
    ) -> ReplayResult:  # no action keyword: written before actions existed
        self.calls.append({"replay": rollback_point, "injection": injection, "role": injection_role})
        return ReplayResult(trace=trace, rollback_point=rollback_point, final_answer="5", prefix_verified=True)

    def propose(self, trace: StructuredTrace, **asked: Any) -> tuple[ProposedStep, ...]:
        self.calls.append({"propose": asked})
        return (ProposedStep(action=StepAction(text="2 + 3 = 5")),)

    def resample(self, trace: StructuredTrace, *, samples: int, temperature: float) -> tuple[ReplayResult, ...]:
        self.calls.append({"resample": samples, "temperature": temperature})
        run = ReplayResult(trace=trace, rollback_point=0, final_answer="5", prefix_verified=True)
        return (run,) * samples


def test_the_named_constructors_say_what_each_common_request_changes() -> None:
    fix = ReplayRequest.intervention(TRACE, 1, "add again", role=InjectionRole.USER)
    assert (fix.rollback_point, fix.injection, fix.injection_role, fix.action, fix.temperature) == (
        1,
        "add again",
        InjectionRole.USER,
        None,
        None,
    )
    control = ReplayRequest.control(TRACE, 1)
    assert (control.rollback_point, control.injection, control.action) == (1, "", None)
    rerun = ReplayRequest.resampling(TRACE, 0.7)
    assert (rerun.rollback_point, rerun.injection, rerun.temperature) == (0, "", 0.7)
    assert control.proposal_temperature == 0.0 and rerun.proposal_temperature == 0.7
    with pytest.raises(ValidationError):
        ReplayRequest(trace=TRACE, rollback_point=-1)
    with pytest.raises(ValidationError):
        fix.injection = "y"  # type: ignore[misc]  # frozen


def test_an_adapter_of_the_keyword_form_is_called_the_old_way() -> None:
    adapter = KeywordAdapter()
    result = replay_with(adapter, ReplayRequest.intervention(TRACE, 1, "add again"))  # type: ignore[arg-type]
    assert result.final_answer == "5"
    assert adapter.calls[-1] == {"replay": 1, "injection": "add again", "role": InjectionRole.SYSTEM}
    source = proposer(adapter)  # type: ignore[arg-type]
    assert source is not None
    (proposal,) = source.propose(ReplayRequest(trace=TRACE, rollback_point=1, temperature=0.5), samples=2)
    assert proposal.action.text == "2 + 3 = 5"
    assert adapter.calls[-1] == {
        "propose": {
            "rollback_point": 1,
            "injection": "",
            "injection_role": InjectionRole.SYSTEM,
            "samples": 2,
            "temperature": 0.5,
        }
    }
    budgeted = BudgetedReplay(adapter, 3)  # type: ignore[arg-type]
    assert resampler(budgeted) is budgeted
    assert len(budgeted.resample(ReplayRequest.resampling(TRACE, 0.9), samples=2)) == 2
    assert adapter.calls[-1] == {"resample": 2, "temperature": 0.9} and budgeted.remaining == 1
    budgeted.replay(ReplayRequest.control(TRACE, 1))
    with pytest.raises(ReplayError, match="spent"):
        budgeted.replay(ReplayRequest.control(TRACE, 1))


def test_a_keyword_form_adapter_is_not_asked_what_its_form_cannot_say() -> None:
    adapter = KeywordAdapter()
    with pytest.raises(ReplayError, match="keyword form"):
        replay_with(adapter, ReplayRequest(trace=TRACE, rollback_point=1, temperature=0.7))  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # an action reaches an adapter that takes none: its own error, as before
        replay_with(adapter, ReplayRequest.intervention(TRACE, 1, action=StepAction(text="2 + 3 = 5")))  # type: ignore[arg-type]


def test_an_adapters_options_are_one_value_and_a_keyword_names_one_of_them() -> None:
    from reflect_otel.replay_adapters.http import HTTPReplayAdapter, HTTPReplayOptions

    told = HTTPReplayOptions(proposes=True, deterministic=True)
    adapter = HTTPReplayAdapter("http://127.0.0.1:9/replay", options=told, deterministic=False)
    assert (adapter.proposes, adapter.deterministic, adapter.resamples) == (True, False, False)  # the keyword wins
    with pytest.raises(TypeError, match=r"unknown replay adapter option.*propose\b.*the options are"):
        HTTPReplayAdapter("http://127.0.0.1:9/replay", propose=True)  # type: ignore[call-arg]  # mypy names it too


def test_each_adapters_keywords_are_its_options_fields_so_a_type_checker_sees_a_misspelt_one() -> None:
    import dataclasses

    from reflect_otel.replay_adapters._tool_loop import ToolLoopOptionKeywords, ToolLoopOptions
    from reflect_otel.replay_adapters.http import HTTPReplayOptionKeywords, HTTPReplayOptions
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayOptionKeywords, LangGraphReplayOptions

    for options, keywords in (
        (LangGraphReplayOptions, LangGraphReplayOptionKeywords),
        (ToolLoopOptions, ToolLoopOptionKeywords),
        (HTTPReplayOptions, HTTPReplayOptionKeywords),
    ):
        fields = {field.name: field.type for field in dataclasses.fields(options)}
        spelt = {name: getattr(kind, "__forward_arg__", kind) for name, kind in keywords.__annotations__.items()}
        assert fields == spelt, options.__name__  # the same names, the same types as written
