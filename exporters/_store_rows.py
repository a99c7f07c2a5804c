"""What every store backend writes: the rows of a trace, verdict, record or job, as columns by table, each write
owning the rows of its key (so a write replaces what was stored under it), and the counters of what was written."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, get_args

from reflect_otel.errors import InputError
from reflect_otel.record import AttributionRecord, LLMCall, ReplayAttempt
from reflect_otel.store import AttributionJob, JobStatus, StoreStats, moves_on
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = [
    "CALL_COLUMNS",
    "COUNTERS",
    "JOB_STATUSES",
    "KEYS",
    "PARENT",
    "REPLAY_COLUMNS",
    "Columns",
    "StoreStats",
    "Write",
    "as_columns",
    "job_rows",
    "job_state",
    "later_jobs",
    "migrations_to_apply",
    "record_rows",
    "trace_rows",
    "verdict_rows",
]  # fmt: skip


def ts(ns: int | None) -> datetime | None:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC) if ns else None


def agent_of(trace: StructuredTrace) -> str:
    if trace.agent:
        return trace.agent
    names = Counter(s.agent for s in trace.steps if s.agent)
    return names.most_common(1)[0][0] if names else trace.source.framework


COUNTERS = {"trace": "traces", "verdict": "verdicts", "record": "records", "job": "jobs"}

KEYS = {
    "traces": ("trace_id",),
    "steps": ("trace_id",),
    "verdicts": ("trace_id", "verifier"),
    "attributions": ("trace_id", "method"),
    "replays": ("trace_id", "method"),
    "llm_calls": ("trace_id", "method"),
    "attribution_jobs": ("trace_id",),
}


PARENT = {"trace": "traces", "verdict": "verdicts", "record": "attributions", "job": "attribution_jobs"}
"""The table holding one row per key of each kind of write; its other tables hold rows only beside that row."""

Columns = dict[str, list[Any]]
REPLAY_COLUMNS = (
    "trace_id", "method", "seq", "round", "rollback_point", "localized_step", "gate_retry", "sample", "faithful",
    "violation_type", "flipped", "final_answer", "error", "correction_source", "correction_kind", "replaced_step",
    "original_call", "replacement_call", "arm", "changed_step", "reproduced", "change",
)  # fmt: skip
CALL_COLUMNS = (
    "trace_id", "method", "seq", "stage", "model", "prompt_tokens", "cached_prompt_tokens", "completion_tokens",
    "seconds", "attempts", "ok",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Write:
    """The rows one trace, verdict or record owns, as columns by table; ``key`` identifies them (the same in every
    table)."""

    kind: str
    key: tuple[str, ...]
    tables: dict[str, Columns]


def as_columns(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Columns:
    return {name: [row[name] for row in rows] for name in names}


def trace_rows(trace: StructuredTrace) -> Write:
    parent = {
        "trace_id": trace.trace_id,
        "session_id": trace.session_id,
        "agent": agent_of(trace),
        "framework": trace.source.framework,
        "collector": trace.source.collector,
        "question": trace.question,
        "final_answer": trace.final_answer,
        "step_count": len(trace.steps),
        "warning_count": len(trace.warnings),
        "start_time": ts(trace.start_time_ns),
        "end_time": ts(trace.end_time_ns),
        "ingested_at": datetime.now(UTC),
        "metadata": json.dumps(trace.metadata),
        "trace_json": trace.model_dump_json(),
    }
    steps = trace.steps
    columns: Columns = {
        "trace_id": [trace.trace_id] * len(steps),
        "step_index": [s.index for s in steps],
        "span_id": [s.span_id for s in steps],
        "tool_span_id": [s.tool_span_id for s in steps],
        "kind": [s.kind.value for s in steps],
        "agent": [s.agent for s in steps],
        "tool_name": [s.tool_name for s in steps],
        "tool_args": [json.dumps(s.tool_args, default=str) if s.tool_args else "{}" for s in steps],
        "tool_result": [s.tool_result for s in steps],
        "reasoning": [s.reasoning for s in steps],
        "is_final_answer": [s.is_final_answer for s in steps],
        "status": [s.status.value for s in steps],
        "prompt_tokens": [s.prompt_tokens for s in steps],
        "completion_tokens": [s.completion_tokens for s in steps],
        "model_name": [s.model_name for s in steps],
    }
    return Write("trace", (trace.trace_id,), {"traces": as_columns([parent], list(parent)), "steps": columns})


def verdict_rows(trace_id: str, verdict: Verdict) -> Write:
    row = {
        "trace_id": trace_id,
        "verifier": verdict.verifier,
        "is_correct": verdict.is_correct,
        "label": verdict.label,
        "score": verdict.score,
        "confidence": verdict.confidence,
        "extracted_answer": verdict.extracted_answer,
        "reasoning": verdict.reasoning,
        "created_at": datetime.now(UTC),
        "basis": verdict.basis,
        "confidence_low": verdict.measured.low if verdict.measured is not None else None,
        "confidence_high": verdict.measured.high if verdict.measured is not None else None,
        "confidence_runs": verdict.measured.judged if verdict.measured is not None else None,
        "resamples": verdict.consistency.finished if verdict.consistency is not None else None,
        "resamples_agreeing": verdict.consistency.agreeing if verdict.consistency is not None else None,
    }
    return Write("verdict", (trace_id, verdict.verifier), {"verdicts": as_columns([row], list(row))})


JOB_STATUSES = frozenset(get_args(JobStatus))


def later_jobs(writes: Sequence[Write], stored: Mapping[str, tuple[str, int]]) -> list[Write]:
    """The job writes of ``writes`` that do not take their job back (:func:`~reflect_otel.store.moves_on`):
    ``stored`` maps a trace id to its stored (status, attempts)."""
    return [write for write in writes if moves_on(*job_state(write), stored.get(write.key[0]))]


def job_state(write: Write) -> tuple[str, int]:
    """A job write's (status, attempts)."""
    row = write.tables["attribution_jobs"]
    return row["status"][0], row["attempts"][0] or 0


def job_rows(job: AttributionJob) -> Write:
    row = {
        "trace_id": job.trace_id,
        "status": job.status,
        "attempts": job.attempts,
        "expected_answer": job.expected_answer,
        "reason": job.reason,
        "updated_at": datetime.now(UTC),
    }
    return Write("job", (job.trace_id,), {"attribution_jobs": as_columns([row], list(row))})


def _effect_columns(record: AttributionRecord) -> dict[str, Any]:
    """The controlled test behind the record (both arms, each with its Wilson interval) and replay fidelity."""
    effect, fidelity = record.effect, record.fidelity
    arms: dict[str, Any] = {}
    for name in ("intervention", "control", "sensitivity"):
        arm = getattr(effect, name) if effect is not None else None
        arms |= {
            f"effect_{name}_replays": arm.replays if arm else None,
            f"effect_{name}_flips": arm.flips if arm else None,
            f"effect_{name}_low": arm.low if arm else None,
            f"effect_{name}_high": arm.high if arm else None,
        }
    return {
        "effect_step": effect.step_index if effect else None,
        **arms,
        "effect_p_value": effect.p_value if effect else None,
        "fidelity_controls": fidelity.controls if fidelity else None,
        "fidelity_reproduced": fidelity.reproduced if fidelity else None,
        "claim": record.claim,
        "localization_test": record.localization_test.outcome.value if record.localization_test else None,
        "obstacle": record.obstacle.value if record.obstacle else None,
    }


def _attribution_row(record: AttributionRecord) -> dict[str, Any]:
    """The record's one row of ``attributions`` (without its key)."""
    verified_by = record.verified_by
    return {
        "status": record.status.value,
        "mode": record.mode.value,
        "step_index": record.step_index,
        "span_id": record.span_id,
        "error_type": record.error_type.value if record.error_type else None,
        "confidence": record.confidence,
        "confidence_samples": record.confidence_samples,
        "auditor_confidence": record.auditor_confidence,
        "explanation": record.explanation,
        "root_cause": record.root_cause,
        "rollback_point": record.intervention.rollback_point if record.intervention else None,
        "corrected_answer": record.corrected_answer,
        "rounds": record.rounds,
        "reason": record.reason,
        "llm_calls": record.total_calls,  # model requests, the agent's included
        "tokens": record.total_tokens,
        "seconds": sum(c.seconds for c in record.cost),
        "created_at": record.created_at,
        "record_json": record.model_dump_json(),
        "verified_by_source": verified_by.source if verified_by else None,
        "verified_by_kind": verified_by.kind.value if verified_by else None,
        **_effect_columns(record),
        "agent_calls": record.agent_calls,
    }


def _replay_row(seq: int, a: ReplayAttempt) -> dict[str, Any]:
    """One replay of the record, a row of ``replays`` (without its key)."""
    return {
        "seq": seq,
        "round": a.round,
        "rollback_point": a.rollback_point,
        "localized_step": a.localized_step,
        "gate_retry": a.gate_retry,
        "sample": a.sample,
        "faithful": a.gate.is_faithful if a.gate else None,
        "violation_type": a.gate.violation_type if a.gate else None,
        "flipped": a.flipped,
        "final_answer": a.final_answer,
        "error": a.error,
        "correction_source": a.correction.source if a.correction else None,
        "correction_kind": a.correction.kind.value if a.correction else None,
        "replaced_step": a.rollback_point + 1 if a.correction else None,
        "original_call": a.correction.original.render() if a.correction and a.correction.original else None,
        "replacement_call": a.correction.replacement.render() if a.correction and a.correction.replacement else None,
        "arm": a.arm.value,
        "changed_step": a.changed_step,
        "reproduced": a.reproduced,
        "change": a.change.value if a.change is not None else None,
    }


def _call_row(seq: int, c: LLMCall) -> dict[str, Any]:
    """One model call of the record, a row of ``llm_calls`` (without its key)."""
    return {
        "seq": seq,
        "stage": c.stage,
        "model": c.model,
        "prompt_tokens": c.prompt_tokens,
        "cached_prompt_tokens": c.cached_prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "seconds": c.seconds,
        "attempts": c.attempts,
        "ok": c.ok,
    }


def record_rows(record: AttributionRecord) -> Write:
    key: dict[str, Any] = {"trace_id": record.trace_id, "method": record.method}
    parent = key | _attribution_row(record)
    replays = [key | _replay_row(seq, a) for seq, a in enumerate(record.replays)]
    calls = [key | _call_row(seq, c) for seq, c in enumerate(record.llm_calls)]
    return Write(
        "record",
        (record.trace_id, record.method),
        {
            "attributions": as_columns([parent], list(parent)),
            "replays": as_columns(replays, REPLAY_COLUMNS),
            "llm_calls": as_columns(calls, CALL_COLUMNS),
        },
    )


def migrations_to_apply(current: int, migrations: Sequence[str]) -> list[tuple[int, list[str]]]:
    """(version, its statements) for each schema version after ``current`` in a backend's ``migrations``; raises
    :class:`InputError` naming the fix when the store is newer than this reflect-otel."""
    if current > len(migrations):
        raise InputError(
            f"the store was written by a newer reflect-otel (schema {current} > {len(migrations)}); upgrade"
        )
    return [
        (version, [s for s in migrations[version - 1].split(";") if s.strip()])
        for version in range(current + 1, len(migrations) + 1)
    ]
