"""wtq-live's figures per method, from its typed results rows (:mod:`benchmarks.evaluation.live_rows`): the share of
failed runs flipped and verified, with standard errors, what the verifications rested on, and what the runs cost.
``metrics.json`` is this, as JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.evaluation import _live_records as reading
from benchmarks.evaluation.live_rows import LiveRow, MethodRow
from benchmarks.evaluation.metrics import mean_se
from reflect_otel.attribution.controls import WrongStepControl
from reflect_otel.attribution.methods import METHODS, method_spec
from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.record import AttributionStatus

__all__ = ["live_metrics"]


def live_metrics(rows: Sequence[LiveRow], methods: Sequence[str]) -> dict[str, Any]:
    """Per method, over the failed runs it attributed without a stage failure: the share flipped (a replay
    flipped the answer to the expected one) and verified, and calls, tokens and seconds per run; each with its
    standard error. Runs whose stages failed, and runs skipped, are counted apart, never scored, and listed with
    what they cost (``unscored``); runs whose answer was undecided are counted apart too (``agent_undecided``),
    neither right nor failed. Read from the rows as written (see :mod:`benchmarks.evaluation._live_records`)."""
    failures = [r for r in rows if r.failed]
    return {
        "questions": len(rows),
        "agent_correct": sum(1 for r in rows if r.correct is True),
        "agent_undecided": sum(1 for r in rows if r.correct is None),
        "failed_runs": len(failures),
        "methods": {name: _method_metrics(name, failures) for name in methods},
    }


@dataclass(frozen=True, slots=True)
class _Given:
    """The failed runs given to one method, split as its metrics count them."""

    given: list[tuple[LiveRow, MethodRow]]
    """Every failed run the method attributed, with its row for it."""
    ran: list[MethodRow]
    """Those not skipped."""
    scored_rows: list[tuple[LiveRow, MethodRow]]
    """Those not skipped whose stages did not fail."""

    @property
    def scored(self) -> list[MethodRow]:
        return [m for _, m in self.scored_rows]

    @property
    def verified(self) -> list[MethodRow]:
        return [m for m in self.scored if m.status == AttributionStatus.VERIFIED.value]


def _given(name: str, failures: Sequence[LiveRow]) -> _Given:
    given = [(r, r.methods[name]) for r in failures if name in r.methods]
    ran = [m for _, m in given if m.status != AttributionStatus.SKIPPED.value]
    scored = [(r, m) for r, m in given if m.status != AttributionStatus.SKIPPED.value and not m.failed]
    return _Given(given, ran, scored)


def _method_metrics(name: str, failures: Sequence[LiveRow]) -> dict[str, Any]:
    """One method's figures (keys in the order ``metrics.json`` has always written them)."""
    runs = _given(name, failures)
    metrics = {
        **_run_counts(runs),
        **_verification(name, runs),
        **_replay_costs(runs),
        **_listings(name, runs, failures),
    }
    if name == WrongStepControl.method:
        metrics["targets"] = _wrong_step_targets(runs.scored_rows)
    return metrics


def _run_counts(runs: _Given) -> dict[str, Any]:
    scored = runs.scored
    return {
        "runs": len(runs.given),
        "failed": len(runs.ran) - len(scored),
        "skipped": len(runs.given) - len(runs.ran),  # nothing to test (the placebo before any other plan)
        "scored": len(scored),
        "replayed_runs": sum(1 for m in scored if m.replays),  # a method that replays nothing corrects nothing
        # runs where a correction was replayed at all (a run with control replays only tested nothing)
        "tested_runs": sum(1 for m in scored if _intervention_replays(m)),
        "intervention_replays": mean_se([float(_intervention_replays(m)) for m in scored]),
        # runs where a stage's call failed (e.g. a diagnosis the model could not write to the schema) and the
        # method went on without it: scored, but with less than it asked for
        "stage_errors": sum(1 for m in scored if m.errors),
        "flipped": mean_se([1.0 if m.flip else 0.0 for m in scored]),
    }


def _verification(name: str, runs: _Given) -> dict[str, Any]:
    scored, verified = runs.scored, runs.verified
    controlled = any(reading.is_controlled(m) for m in scored)
    return {
        "verified": mean_se([1.0 if m.status == AttributionStatus.VERIFIED.value else 0.0 for m in scored]),
        # the strict reading: verified where every control at the verifying point gave the run's own answer
        # (None: the records hold no controls, verification was not controlled)
        "verified_reproducing": (
            mean_se([1.0 if reading.verified_reproducing(m) else 0.0 for m in scored]) if controlled else None
        ),
        "withholds_expected": method_spec(name).withholds_expected if name in METHODS else False,
        # of the verified records, those whose corrected answer the expected one confirms (rows written before
        # this was recorded: unknown, so not counted)
        "oracle": {
            "confirmed": sum(1 for m in verified if m.oracle_confirms is True),
            "judged": sum(1 for m in verified if m.oracle_confirms is not None),
        },
        "not_attributable": mean_se(
            [1.0 if m.status == AttributionStatus.NOT_ATTRIBUTABLE.value else 0.0 for m in scored]
        ),
        # what a verified record claims (rows made before the claim existed: none counted as localized)
        "localized": sum(1 for m in verified if m.claim == "localized"),
        "localization_tests": {
            outcome: sum(1 for m in verified if m.localization_test == outcome)
            for outcome in ("localized", "not_localized", "untested")
        },
        # why a not-attributable record's flip was not credited
        "obstacles": {
            obstacle: sum(1 for m in scored if m.obstacle == obstacle)
            for obstacle in sorted({str(m.obstacle) for m in scored if m.obstacle})
        },
    }


def _replay_costs(runs: _Given) -> dict[str, Any]:
    scored = runs.scored
    fidelity = [m.fidelity for m in scored if m.fidelity]
    trajectory = [reading.trajectory_fidelity((r.trace or {}).get("steps") or [], m) for r, m in runs.scored_rows]
    return {
        "sensitivity_replays": mean_se([float(m.sensitivity_replays or 0) for m in scored]),
        "localization_replays": mean_se([float(m.localization_replays or 0) for m in scored]),
        "fidelity": {"reproduced": sum(f[0] for f in fidelity), "controls": sum(f[1] for f in fidelity)},
        "trajectory_fidelity": {
            "repeated": sum(t[0] for t in trajectory),
            "controls": sum(t[1] for t in trajectory),
        },
        "replays": mean_se([float(m.replays) for m in scored]),
        "control_replays": mean_se([float(m.control_replays or 0) for m in scored]),
        # the agent's decisions sampled for proposals (each batch's M), and those the records list (de-duplicated)
        "proposals": mean_se([float(reading.proposals_sampled(m)) for m in scored]),
        "proposals_kept": mean_se([float(reading.proposals_kept(m)) for m in scored]),
        # one agent-model request per decision sampled (at least); outside the replay budget
        "agent_proposal_requests": mean_se([float(reading.proposals_sampled(m)) for m in scored]),
        "llm_calls": mean_se([float(m.llm_calls) for m in scored]),  # the auditor's calls
        "model_requests": mean_se([float(reading.model_requests(m)) for m in scored]),  # repair retries too
        # the agent's requests for its replays and proposals, where the rows' code recorded them
        "agent_requests": _known_mean([reading.agent_requests(m) for m in scored]),
        "tokens": mean_se([float(m.tokens) for m in scored]),
        "cached_share": _cached_share(scored),
        "seconds": mean_se([float(m.seconds) for m in scored]),
    }


def _listings(name: str, runs: _Given, failures: Sequence[LiveRow]) -> dict[str, Any]:
    scored = runs.scored
    verified_by = Counter(f"{m.verified_by['source']} ({m.verified_by['kind']})" for m in scored if m.verified_by)
    return {
        "unscored": [_unscored(r, m) for r, m in runs.given if m.status == AttributionStatus.SKIPPED.value or m.failed],
        "verified_steps": [
            {"question_id": r.question_id, "step": r.methods[name].step}
            for r in failures
            if name in r.methods and r.methods[name].status == AttributionStatus.VERIFIED.value
        ],
        "verified_by": dict(verified_by),
        "corrections": dict(Counter(o for m in scored for o in reading.correction_outcomes(m)).most_common()),
    }


def _unscored(row: LiveRow, method: MethodRow) -> dict[str, Any]:
    """A run given to a method and not scored (skipped, or a stage failed), with what it cost all the same."""
    return {
        "question_id": row.question_id,
        "status": method.status,
        "failed": method.failed,
        "reason": str(reading.record_of(method).get("reason") or ""),
        "llm_calls": method.llm_calls,
        "model_requests": reading.model_requests(method),
        "proposals": reading.proposals_sampled(method),
        "replays": method.replays,
        "tokens": method.tokens,
        "seconds": method.seconds,
    }


def _wrong_step_targets(scored: Sequence[tuple[LiveRow, MethodRow]]) -> dict[str, Any]:
    """Per scored wrong-step record, the steps it placed its corrections at (its targets), each with whether
    REFLECT's record for the same question localized it, and whether another round of its own did (a target is
    never its own round's localized step). A wrong step that is a localized one tests a localization, not a wrong
    step."""
    records: list[dict[str, Any]] = []
    every: list[dict[str, Any]] = []
    for row, method in scored:
        reflect = reading.localized_steps(row.methods.get(ReflectPipeline.method))
        own = reading.localized_steps(method)
        targets: list[dict[str, Any]] = [
            {"step": step, "reflect_localized": step in reflect, "own_round_localized": step in own}
            for step in reading.correction_steps(method)
        ]
        verified = method.status == AttributionStatus.VERIFIED.value
        records.append(
            {"question_id": row.question_id, "targets": targets, "verified_step": method.step if verified else None}
        )
        every += targets
    return {
        "targets": len(every),
        "reflect_localized": sum(1 for t in every if t["reflect_localized"]),
        "own_round_localized": sum(1 for t in every if t["own_round_localized"]),
        "localized": sum(1 for t in every if t["reflect_localized"] or t["own_round_localized"]),
        "records": records,
    }


def _known_mean(values: Sequence[int | None]) -> dict[str, Any] | None:
    """The mean of the values when every row knows its value; None when any does not (older code's rows)."""
    if not values or any(v is None for v in values):
        return None
    return mean_se([float(v) for v in values if v is not None])


def _intervention_replays(method: MethodRow) -> int:
    others = (method.control_replays, method.sensitivity_replays, method.localization_replays)
    return method.replays - sum(count or 0 for count in others)


def _cached_share(rows: Sequence[MethodRow]) -> float | None:
    """Prompt tokens served from the endpoint's cache over all prompt tokens, where the endpoint says."""
    known = [(r.prompt_tokens, r.cached_prompt_tokens) for r in rows if r.cached_prompt_tokens is not None]
    prompt = sum(p or 0 for p, _ in known if p)
    return round(sum(c or 0 for p, c in known if p) / prompt, 3) if prompt else None
