"""What REFLECT and the baselines share: the run's bookkeeping (recorded LLM calls, stage errors, the record's
cost), the typed record constructor, and the one error boundary."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from reflect_otel.config import ReflectConfig
from reflect_otel.errors import LLMError
from reflect_otel.flagging.consistency import render_consistency
from reflect_otel.flagging.evidence import find_evidence, render_findings
from reflect_otel.flagging.verifiers import Verifier, bound_to
from reflect_otel.llm.base import StructuredLLM, prompt_budget
from reflect_otel.llm.recording import CallLog, RecordingLLM
from reflect_otel.prompts import PromptContext
from reflect_otel.record import (
    AttributionMode,
    AttributionRecord,
    AttributionStatus,
    Correction,
    Effect,
    ErrorType,
    Fidelity,
    Intervention,
    Localization,
    LocalizationTest,
    Obstacle,
    ReplayAttempt,
    StageError,
    stage_costs,
)
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = ["AttributionRun", "MethodBase", "is_correct"]

_log = logging.getLogger("reflect_otel.attribution.methods")


class AttributionRun:
    """One attribution of one trace: its LLM (recording every call), its verifier (calling that LLM, so audits of
    the original run and of every replay are recorded and budgeted too), the errors met, and the record at the end."""

    def __init__(
        self,
        method: str,
        llm: StructuredLLM,
        trace: StructuredTrace,
        config: dict[str, Any],
        verifier: Verifier,
        original_verdict: Verdict | None = None,
    ) -> None:
        self.method = method
        self.trace = trace
        self.original_verdict = original_verdict
        """The run's verdict when the caller judged it already (triage); the record's default."""
        self.log = CallLog()
        self.llm = RecordingLLM(llm, self.log)
        self.verifier = bound_to(verifier, self.llm)
        self.errors: list[StageError] = []
        self.config = {"llm_model": llm.model_name, **config}

    def error(self, stage: str, error: BaseException, round_: int | None = None) -> None:
        message = str(error) or type(error).__name__
        self.errors.append(StageError(stage=stage, message=message[:2000], round=round_))

    def record(
        self,
        *,
        status: AttributionStatus,
        mode: AttributionMode,
        step_index: int | None,
        reason: str = "",
        span_id: str | None = None,
        error_type: ErrorType | None = None,
        auditor_confidence: float | None = None,
        explanation: str = "",
        root_cause: str = "",
        intervention: Intervention | None = None,
        replays: Sequence[ReplayAttempt] = (),
        corrections: Sequence[Correction] = (),
        effect: Effect | None = None,
        fidelity: Fidelity | None = None,
        obstacle: Obstacle | None = None,
        localization_test: LocalizationTest | None = None,
        corrected_answer: str | None = None,
        original_verdict: Verdict | None = None,
        rounds: int = 0,
        localizations: Sequence[Localization] = (),
    ) -> AttributionRecord:
        """The record, with the run's cost, calls and errors. ``span_id`` defaults to the span of ``step_index``
        in the run's trace. ``auditor_confidence`` is the auditor's own figure; a verified record's confidence is
        measured: the share of its intervention's replays that flipped (``effect``)."""
        calls = self.log.calls
        measured = effect.intervention if effect is not None and status is AttributionStatus.VERIFIED else None
        if span_id is None and step_index is not None and 1 <= step_index <= len(self.trace.steps):
            span_id = self.trace.steps[step_index - 1].span_id
        return AttributionRecord(
            trace_id=self.trace.trace_id,
            method=self.method,
            status=status,
            mode=mode,
            step_index=step_index,
            span_id=span_id,
            reason=reason,
            error_type=error_type,
            confidence=measured.rate if measured is not None else None,
            confidence_samples=measured.replays if measured is not None else None,
            auditor_confidence=auditor_confidence,
            explanation=explanation,
            root_cause=root_cause,
            intervention=intervention,
            replays=tuple(replays),
            corrections=tuple(corrections),
            effect=effect,
            fidelity=fidelity,
            obstacle=obstacle,
            localization_test=localization_test,
            original_answer=self.trace.final_answer,
            corrected_answer=corrected_answer,
            original_verdict=original_verdict or self.original_verdict,
            rounds=rounds,
            localizations=tuple(localizations),
            cost=stage_costs(calls),
            llm_calls=calls,
            errors=tuple(self.errors),
            config=self.config,
        )

    def prompt_context(
        self,
        of: StructuredTrace,
        expected: str | None,
        *,
        include_expected: bool,
        domain_context: str,
        config: ReflectConfig,
    ) -> PromptContext:
        """The prompts' shared context for ``of`` under ``config`` (a :class:`~reflect_otel.config.ReflectConfig`)."""
        return PromptContext.of(
            of,
            expected,
            include_expected=include_expected,
            domain_context=domain_context,
            domain_context_label=config.domain_context_label,
            max_chars=config.max_field_chars,
            budget=prompt_budget(self.llm),
            layout=config.prompt_layout,
            evidence=self._evidence(of) if config.evidence_in_prompts else "",
        )

    def _evidence(self, of: StructuredTrace) -> str:
        """The evidence checks' findings on ``of``; on the original run, also its consistency check's resamples
        (where they departed from it: localization evidence) when its verdict carries one (a run the evidence
        flagged is resampled too where its replays are judged by the agent's consensus)."""
        findings = render_findings(find_evidence(of))
        check = self.original_verdict.consistency if self.original_verdict is not None else None
        if check is None or of.trace_id != self.trace.trace_id:
            return findings
        return "\n".join(part for part in (findings, render_consistency(check)) if part)


class MethodBase:
    """What REFLECT and every baseline hold (the LLM, the verifier that judges answers and replays, the settings),
    and how each attribution starts."""

    method = "method"

    def __init__(self, llm: StructuredLLM, *, verifier: Verifier, config: ReflectConfig | None = None) -> None:
        self.llm = llm
        self.verifier = verifier
        self.config = config or ReflectConfig()

    def start(self, trace: StructuredTrace, verdict: Verdict | None = None) -> AttributionRun:
        settings = self.config.model_dump(mode="json") | {"verifier": self.verifier.name}
        return AttributionRun(self.method, self.llm, trace, settings, self.verifier, verdict)

    def guarded(
        self, run: AttributionRun, mode: AttributionMode, work: Callable[[], AttributionRecord]
    ) -> AttributionRecord:
        """``work()``, the one error boundary of every method: a stage's :class:`LLMError` or any other exception
        (a bug, an adapter's surprise) becomes a recorded outcome with what was reached, never an exception."""
        try:
            return work()
        except LLMError as error:
            run.error(self.method, error)
            reason = f"{self.method} failed; see errors"
        except Exception as error:
            _log.exception("%s on trace %s failed", self.method, run.trace.trace_id)
            run.error(self.method, error)
            reason = f"internal error: {error}"
        return run.record(status=AttributionStatus.UNVERIFIED, mode=mode, step_index=None, reason=reason)


def is_correct(verdict: Verdict | None) -> bool:
    return verdict is not None and verdict.is_correct is True
