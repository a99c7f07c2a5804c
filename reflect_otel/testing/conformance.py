"""The conformance suite every replay adapter must pass.

Give it a :class:`ConformanceCase`: a recorded run of an agent with a bug, an injection that repairs it, a way to
judge answers, a probe of what the agent's model was sent, and an action that repairs it. ``run_conformance``
asserts, at every rollback point of the run, for both kinds of intervention: that the prefix is kept exactly; for
guidance, that the injection reaches the first new model call; for an action, that the adapter executed it for
real as the first regenerated step (its result is the tool's, not the trace's) and the model continued from it;
that the continuation is captured and stitched after the prefix, and the fix flips the answer; and that a rollback
point inside one LLM turn's parallel tool calls is refused. Every replay is asked as a
:class:`~reflect_otel.replay.ReplayRequest`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reflect_otel.errors import ReplayError
from reflect_otel.replay import InjectionRole, ReplayAdapter, ReplayRequest, ReplayResult
from reflect_otel.trace import StepAction, StructuredTrace

__all__ = ["ConformanceCase", "allowed_points", "check_action", "check_replay", "run_conformance"]


@dataclass
class ConformanceCase:
    adapter: ReplayAdapter
    trace: StructuredTrace
    fix: str
    """An injection that repairs the run."""
    is_correct: Callable[[str | None], bool]
    model_requests: Callable[[], Sequence[str]]
    """Every request the agent's model received so far, as text (the probe)."""
    injection_role: InjectionRole = InjectionRole.SYSTEM
    action: StepAction | None = None
    """A concrete step that repairs the run wherever it is executed (None: the adapter takes no actions)."""
    action_result: str | None = None
    """What executing ``action`` for real returns (a tool call's result); checked against the first new step."""


def allowed_points(trace: StructuredTrace) -> list[int]:
    """Rollback points that do not split a turn of parallel tool calls."""
    points = [0]
    for p in range(1, len(trace.steps)):
        before, after = trace.steps[p - 1], trace.steps[p]
        if not (before.span_id == after.span_id and before.tool_call_id and after.tool_call_id):
            points.append(p)
    return points


def _mid_turn_points(trace: StructuredTrace) -> list[int]:
    return [p for p in range(1, len(trace.steps)) if p not in allowed_points(trace)]


def check_replay(case: ConformanceCase, point: int) -> ReplayResult:
    """One replay from ``point`` with the fix, checked against the contract."""
    sent_before = len(case.model_requests())
    result = case.adapter.replay(ReplayRequest.intervention(case.trace, point, case.fix, role=case.injection_role))
    steps = result.trace.steps
    assert result.rollback_point == point, "the result names its rollback point"
    assert steps[:point] == case.trace.steps[:point], f"point {point}: the original steps 1..{point} are kept exactly"
    assert [s.index for s in steps] == list(range(1, len(steps) + 1)), "steps are renumbered 1..n"
    assert len(steps) > point, f"point {point}: the continuation was captured"
    assert result.continuation == steps[point:], "the continuation follows the prefix"
    assert result.trace.trace_id != case.trace.trace_id, "the replay is a new trace"
    assert result.prefix_verified, f"point {point}: the first new model call did not get exactly the prefix + injection"
    new_requests = case.model_requests()[sent_before:]
    assert new_requests, f"point {point}: the agent's model was called"
    assert case.fix in new_requests[0], f"point {point}: the injection did not reach the first new model call"
    assert case.is_correct(result.final_answer), (
        f"point {point}: the fix did not flip the answer ({result.final_answer!r})"
    )
    return result


def check_action(case: ConformanceCase, point: int) -> ReplayResult:
    """One replay from ``point`` executing ``case.action`` as step ``point + 1``, checked against the contract."""
    action = case.action
    assert action is not None, "the case has no action"
    sent_before = len(case.model_requests())
    result = case.adapter.replay(ReplayRequest.intervention(case.trace, point, action=action))
    steps = result.trace.steps
    assert steps[:point] == case.trace.steps[:point], f"action at {point}: the original steps 1..{point} are kept"
    assert [s.index for s in steps] == list(range(1, len(steps) + 1)), "steps are renumbered 1..n"
    assert len(steps) > point + 1, f"action at {point}: the agent continued after the action"
    first = result.continuation[0]
    if action.tool_name is not None:
        assert (first.tool_name, first.tool_args) == (action.tool_name, action.arguments), (
            f"action at {point}: the first regenerated step is the action ({first.tool_name}({first.tool_args}))"
        )
        if case.action_result is not None:
            assert first.tool_result == case.action_result, (
                f"action at {point}: the action's result is the tool's ({first.tool_result!r})"
            )
    else:
        assert first.reasoning.strip() == action.text.strip(), f"action at {point}: the thought is step {point + 1}"
    assert result.prefix_verified, f"action at {point}: the first new model call did not get the prefix + action"
    assert case.model_requests()[sent_before:], f"action at {point}: the agent's model continued the run"
    assert case.is_correct(result.final_answer), f"action at {point}: the action did not flip the answer"
    return result


def run_conformance(case: ConformanceCase, points: Sequence[int] | None = None) -> list[ReplayResult]:
    """Every check, at every allowed rollback point (or ``points``), guidance then (when the case has one) the
    action; returns the replays."""
    assert not case.is_correct(case.trace.final_answer), "the recorded run must be wrong for the suite to mean much"
    chosen = points if points is not None else allowed_points(case.trace)
    results = [check_replay(case, point) for point in chosen]
    if case.action is not None:
        results += [check_action(case, point) for point in chosen]
    for point in _mid_turn_points(case.trace):
        try:
            case.adapter.replay(ReplayRequest.intervention(case.trace, point, case.fix))
        except ReplayError as error:
            assert "parallel tool calls" in str(error)
        else:
            raise AssertionError(f"point {point} splits a turn of parallel tool calls and must be refused")
    for bad in (-1, len(case.trace.steps)):
        # built unvalidated: a request checks only that its point is not negative; the adapter checks it on the trace
        unchecked = ReplayRequest.model_construct(trace=case.trace, rollback_point=bad, injection=case.fix)
        try:
            case.adapter.replay(unchecked)
        except ReplayError:
            pass
        else:
            raise AssertionError(f"rollback point {bad} is out of range and must be refused")
    return results
