"""Bookkeeping shared by REFLECT and the baselines: recorded LLM calls, stage errors, the record's cost."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from reflect_otel.llm.base import CallLog, LLMCall, RecordingLLM, StructuredLLM
from reflect_otel.prompts import PromptContext
from reflect_otel.record import AttributionRecord, AttributionStatus, StageCost, StageError
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict


def stage_costs(calls: tuple[LLMCall, ...]) -> tuple[StageCost, ...]:
    grouped: dict[str, list[LLMCall]] = defaultdict(list)
    for call in calls:
        grouped[call.stage].append(call)
    return tuple(
        StageCost(
            stage=stage,
            calls=len(items),
            prompt_tokens=sum(c.prompt_tokens for c in items),
            completion_tokens=sum(c.completion_tokens for c in items),
            seconds=round(sum(c.seconds for c in items), 6),
        )
        for stage, items in grouped.items()
    )


class AttributionRun:
    """One attribution of one trace: its LLM (recording every call), errors met, and the record at the end."""

    def __init__(self, method: str, llm: StructuredLLM, trace: StructuredTrace, config: dict[str, Any]) -> None:
        self.method = method
        self.trace = trace
        self.log = CallLog()
        self.llm = RecordingLLM(llm, self.log)
        self.errors: list[StageError] = []
        self.config = {"llm_model": llm.model_name, **config}

    def error(self, stage: str, error: BaseException, round_: int | None = None) -> None:
        message = str(error) or type(error).__name__
        self.errors.append(StageError(stage=stage, message=message[:2000], round=round_))

    def record(
        self, *, status: AttributionStatus, mode: str, step_index: int | None, **fields: Any
    ) -> AttributionRecord:
        calls = self.log.calls
        span_id = None
        if step_index is not None and 1 <= step_index <= len(self.trace.steps):
            span_id = self.trace.steps[step_index - 1].span_id
        return AttributionRecord(
            trace_id=self.trace.trace_id,
            method=self.method,
            status=status,
            mode=mode,
            step_index=step_index,
            span_id=fields.pop("span_id", span_id),
            original_answer=self.trace.final_answer,
            cost=stage_costs(calls),
            llm_calls=calls,
            errors=tuple(self.errors),
            config=self.config,
            **fields,
        )


def prompt_context(
    trace: StructuredTrace,
    expected: str | None,
    *,
    include_expected: bool,
    domain_context: str,
    domain_context_label: str,
    max_chars: int,
) -> PromptContext:
    return PromptContext.of(
        trace,
        expected,
        include_expected=include_expected,
        domain_context=domain_context,
        domain_context_label=domain_context_label,
        max_chars=max_chars,
    )


def is_correct(verdict: Verdict | None) -> bool:
    return verdict is not None and verdict.is_correct is True
