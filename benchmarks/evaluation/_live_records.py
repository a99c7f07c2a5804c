"""What a wtq-live method row's record shows, read from the row as it was written (``results.jsonl``: the
``record`` is :meth:`AttributionRecord.model_dump` of the code that ran, which may be older than this one). Only the
fields read here are assumed; rows from before a field existed give None (not known), never a guess.

These readers report; they decide nothing about a record (the verdicts are the attribution's, made when it ran).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks.evaluation.live_rows import MethodRow
from reflect_otel.record import AGENT_REPLAY_STAGE, AttributionStatus, ReplayArm

PROPOSAL_SOURCE = "proposal:"
"""The source prefix of a correction that is one of the agent's sampled decisions (``proposals._screened``)."""
_PROPOSAL_NUMBER = re.compile(r"proposal (\d+) of (\d+)")
"""How the correction's ``finding`` numbers a proposal within its batch: ``proposal 2 of 3``."""


def record_of(method: MethodRow) -> dict[str, Any]:
    """The method's record as it was written ({} for a row without one)."""
    return method.record or {}


def model_requests(method: MethodRow) -> int:
    """The requests made to the auditor's model: each recorded call's ``attempts`` (2 where the reply needed the
    repair retry), not the calls; the agent's own requests, which a record lists too (stage ``agent_replay``), are
    not the auditor's (:func:`agent_requests`). A row whose record has no calls counts its ``llm_calls``."""
    calls = record_of(method).get("llm_calls")
    if not isinstance(calls, list):
        return method.llm_calls
    return sum(int(call.get("attempts") or 1) for call in calls if call.get("stage") != AGENT_REPLAY_STAGE)


def agent_requests(method: MethodRow) -> int | None:
    """The requests the agent sent to the attributor's model for this record (its replays and proposals): the
    record's ``agent_replay`` stage cost. None for a row whose record does not carry it (code from before the agent's
    requests were recorded), never 0 as a guess."""
    record = record_of(method)
    if method.agent_calls is not None:
        return method.agent_calls
    cost = record.get("cost")
    if not isinstance(cost, list) or not any(isinstance(c, dict) and "requests" in c for c in cost):
        return None
    return sum(
        int(c.get("requests") or 0) for c in cost if isinstance(c, dict) and c.get("stage") == AGENT_REPLAY_STAGE
    )


def _proposals(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in record.get("corrections") or [] if str(c.get("source", "")).startswith(PROPOSAL_SOURCE)]


def proposals_kept(method: MethodRow) -> int:
    """The proposals the record lists: a batch's repeats of a decision are dropped before it is recorded."""
    return len(_proposals(record_of(method)))


_REASON_END = re.compile(r"[:(]| '")
"""Where a refusal's general reason ends and its particulars (the gate's words, the answer quoted) begin."""


def correction_outcomes(method: MethodRow) -> list[str]:
    """What became of each correction the record lists: ``replayed`` (one or more replays, an errored one included),
    ``not replayed`` (not refused, yet no replay: the budget, an earlier flip, a failed control or a failed proposal
    stopped it), or ``refused: REASON`` with the refusal's general reason (its text up to its particulars: the gate's
    words, the answer it carries, the step), so refusals count together across runs. A record does not list the
    corrections it never considered (over ``max_corrections``, or at a step already tested)."""
    outcomes: list[str] = []
    for correction in record_of(method).get("corrections") or []:
        refused = correction.get("refused")
        if refused:
            reason = str(refused).removeprefix("the replacement: ")  # an action's leak, worded as its own reason
            outcomes.append("refused: " + _REASON_END.split(reason, maxsplit=1)[0].strip())
        else:
            outcomes.append("replayed" if correction.get("replays") else "not replayed")
    return outcomes


def proposals_sampled(method: MethodRow) -> int:
    """The agent's decisions sampled for proposals: the ``M`` of each batch's ``proposal k of M``. The first decision
    of a batch is always recorded (nothing before it to repeat), and within a batch ``k`` rises, so a batch starts
    where ``k`` does not rise or the step or source changes. A listed proposal without its number counts as one."""
    sampled = 0
    previous: tuple[str, Any, int] | None = None
    for correction in _proposals(record_of(method)):
        found = _PROPOSAL_NUMBER.search(str(correction.get("finding", "")))
        if found is None:
            sampled += 1
            previous = None
            continue
        number, of = int(found.group(1)), int(found.group(2))
        batch = (str(correction.get("source")), correction.get("step_index"))
        if previous is None or previous[:2] != batch or number <= previous[2]:
            sampled += of
        previous = (*batch, number)
    return sampled


def _replays(record: dict[str, Any], arm: ReplayArm) -> list[dict[str, Any]]:
    return [a for a in record.get("replays") or [] if a.get("arm") == arm.value]


def is_controlled(method: MethodRow) -> bool:
    """Whether the record's replays name their arm (controlled verification); older rows' do not."""
    return any("arm" in a for a in record_of(method).get("replays") or [])


def answered_controls(method: MethodRow) -> list[dict[str, Any]]:
    """The record's control replays that ran to an answer (the ones fidelity is counted over)."""
    return [a for a in _replays(record_of(method), ReplayArm.CONTROL) if a.get("error") is None]


def _calls(steps: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (str(s["tool_name"]), json.dumps(s.get("tool_args") or {}, sort_keys=True))
        for s in steps
        if s.get("tool_name") and not s.get("is_final_answer")
    ]


def repeats_trajectory(run_steps: Sequence[dict[str, Any]], control: dict[str, Any]) -> bool | None:
    """Whether a control repeated the run after its prefix: the same tool calls, with the same arguments, in the
    same order, up to the run's end (no call fewer, none more); the answer's wording is answer fidelity's. None when
    the replay did not record its steps."""
    continuation = control.get("continuation")
    if not isinstance(continuation, list):
        return None
    point = int(control.get("rollback_point", 0))
    return _calls(s for s in run_steps if int(s.get("index", 0)) > point) == _calls(continuation)


def trajectory_fidelity(run_steps: Sequence[dict[str, Any]], method: MethodRow) -> tuple[int, int]:
    """(controls that repeated the run's steps, answered controls whose steps were recorded)."""
    judged = [repeats_trajectory(run_steps, a) for a in answered_controls(method)]
    return sum(1 for j in judged if j), sum(1 for j in judged if j is not None)


def verifying_point(record: dict[str, Any]) -> int | None:
    """The rollback point of the test that verified the record (its effect's), else that of its step."""
    effect = record.get("effect")
    if isinstance(effect, dict):
        if effect.get("rollback_point") is not None:
            return int(effect["rollback_point"])
        if effect.get("step_index") is not None:
            return int(effect["step_index"]) - 1
    step = record.get("step_index")
    return int(step) - 1 if step is not None else None


def verified_reproducing(method: MethodRow) -> bool:
    """Verified, and every control replayed at the verifying rollback point gave the run's own answer (the strict
    reading: what was proved fixable is the run's path, not another path the control took)."""
    record = record_of(method)
    if method.status != AttributionStatus.VERIFIED.value:
        return False
    point = verifying_point(record)
    there = [a for a in _replays(record, ReplayArm.CONTROL) if a.get("rollback_point") == point]
    return bool(there) and all(a.get("error") is None and a.get("reproduced") is True for a in there)


def localized_steps(method: MethodRow | None) -> set[int]:
    """The steps a record's rounds localized."""
    if method is None:
        return set()
    return {
        int(loc["step_index"])
        for loc in record_of(method).get("localizations") or []
        if isinstance(loc, dict) and loc.get("step_index") is not None
    }


def correction_steps(method: MethodRow) -> list[int]:
    """The steps a record placed its corrections at (tried or refused), in order: for the wrong-step control, its
    targets."""
    steps: list[int] = []
    for correction in record_of(method).get("corrections") or []:
        step = correction.get("step_index")
        if step is not None and int(step) not in steps:
            steps.append(int(step))
    return steps
