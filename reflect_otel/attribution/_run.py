"""What REFLECT and the baselines share: the run's bookkeeping (recorded LLM calls, stage errors, the record's
cost), the typed record constructor, and the one error boundary."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

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

if TYPE_CHECKING:
    from reflect_otel.replay import ReplayAdapter

__all__ = ["AttributeOptions", "AttributionRun", "Conclusion", "MethodBase", "Tested", "is_correct"]

_log = logging.getLogger("reflect_otel.attribution.methods")


class AttributeOptions(TypedDict, total=False):
    """What every method's ``attribute(trace, **options)`` may be told besides the trace: ``expected``, the correct
    answer when known; ``replay``, the adapter that re-runs the agent (none: the record is localization-only);
    ``domain_context``, the task described for the prompts; ``verdict``, the run's verdict when it was judged
    already (online triage), so that it is not judged, and paid for, twice."""

    expected: str | None
    replay: ReplayAdapter | None
    domain_context: str
    verdict: Verdict | None


@dataclass(frozen=True, slots=True)
class Tested:
    """What a method's tests established, as its record keeps them: the replays run, the corrections it considered
    (refused or replayed), the replays' fidelity, and how many rounds ran with each round's localization."""

    replays: Sequence[ReplayAttempt] = ()
    corrections: Sequence[Correction] = ()
    fidelity: Fidelity | None = None
    rounds: int = 0
    localizations: Sequence[Localization] = ()


@dataclass(frozen=True, slots=True)
class Conclusion:
    """What a method decided about one run: the outcome and the step it names, why, the auditor's reading of that
    step, and the proof when there is one (``intervention``, ``effect``, ``localization_test``,
    ``corrected_answer``) or what explained a flip away (``obstacle``). ``auditor_confidence`` is the auditor's own
    figure; a verified record's confidence is measured from ``effect`` (see :meth:`AttributionRun.record`)."""

    status: AttributionStatus
    mode: AttributionMode
    step_index: int | None = None
    reason: str = ""
    error_type: ErrorType | None = None
    auditor_confidence: float | None = None
    explanation: str = ""
    root_cause: str = ""
    intervention: Intervention | None = None
    effect: Effect | None = None
    obstacle: Obstacle | None = None
    localization_test: LocalizationTest | None = None
    corrected_answer: str | None = None
    tested: Tested = Tested()


@dataclass(frozen=True, slots=True)
class _Ledger:
    """What every view of one attribution adds to: the recorded LLM calls and the stage errors met."""

    log: CallLog = field(default_factory=CallLog)
    errors: list[StageError] = field(default_factory=list)


class AttributionRun:
    """One attribution of one trace: its LLM (recording every call), its verifier (calling that LLM, so audits of
    the original run and of every replay are recorded and budgeted too), the run's verdict when known, the errors
    met, and the record at the end. The verifier and verdict are fixed: :meth:`judged` gives a new view of the same
    attribution (the same calls and errors) with others."""

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
        """The run's verdict when it is known (judged by the caller, in triage, or by :meth:`judged`)."""
        self._ledger = _Ledger()
        self.llm = RecordingLLM(llm, self._ledger.log)
        self.verifier = bound_to(verifier, self.llm)
        self.config = {"llm_model": llm.model_name, **config}

    @property
    def log(self) -> CallLog:
        return self._ledger.log

    @property
    def errors(self) -> list[StageError]:
        return self._ledger.errors

    def judged(self, verifier: Verifier, verdict: Verdict) -> AttributionRun:
        """This attribution judged: the same trace, LLM, calls and errors, with ``verifier`` (already bound to this
        run's LLM, or bound now) judging replays and ``verdict`` the run's."""
        view = copy.copy(self)
        view.verifier = bound_to(verifier, self.llm)
        view.original_verdict = verdict
        return view

    def error(self, stage: str, error: BaseException, round_: int | None = None) -> None:
        message = str(error) or type(error).__name__
        self.errors.append(StageError(stage=stage, message=message[:2000], round=round_))

    def record(self, conclusion: Conclusion) -> AttributionRecord:
        """The record of ``conclusion``, with the run's verdict, cost, calls and errors. Its span is the span of the
        step it names in the run's trace; a verified record's confidence is measured: the share of its
        intervention's replays that flipped (``effect``)."""
        c, tested, calls = conclusion, conclusion.tested, self.log.calls
        measured = c.effect.intervention if c.effect is not None and c.status is AttributionStatus.VERIFIED else None
        step = c.step_index
        span_id = (
            self.trace.steps[step - 1].span_id if step is not None and 1 <= step <= len(self.trace.steps) else None
        )
        return AttributionRecord(
            trace_id=self.trace.trace_id,
            method=self.method,
            status=c.status,
            mode=c.mode,
            step_index=step,
            span_id=span_id,
            reason=c.reason,
            error_type=c.error_type,
            confidence=measured.rate if measured is not None else None,
            confidence_samples=measured.replays if measured is not None else None,
            auditor_confidence=c.auditor_confidence,
            explanation=c.explanation,
            root_cause=c.root_cause,
            intervention=c.intervention,
            replays=tuple(tested.replays),
            corrections=tuple(tested.corrections),
            effect=c.effect,
            fidelity=tested.fidelity,
            obstacle=c.obstacle,
            localization_test=c.localization_test,
            original_answer=self.trace.final_answer,
            corrected_answer=c.corrected_answer,
            original_verdict=self.original_verdict,
            rounds=tested.rounds,
            localizations=tuple(tested.localizations),
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
        return run.record(Conclusion(AttributionStatus.UNVERIFIED, mode, reason=reason))


def is_correct(verdict: Verdict | None) -> bool:
    return verdict is not None and verdict.is_correct is True
