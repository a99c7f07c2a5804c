"""The attribution service: what happens to one trace, written once for the decorator, the CLI and eval.

``process(trace)``: (optionally) verify the run first and stop when it is not flagged; attribute it with the
chosen method, with a replay adapter when one can re-run the agent; write trace, verdict and record to the store;
count them in the metrics; send the record to every exporter (:class:`~reflect_otel.store.CompositeRecordExporter`).
One error policy: the method never raises (it records its failures); an exporter that fails, the store included,
is named with its cause in the record's ``errors`` and counted (``reflect.export.failures``), and never stops the
others or the run.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypedDict, Unpack

from reflect_otel.attribution.controls import PLACEBO_METHOD, STORED_RECORDS, PlanPool
from reflect_otel.attribution.methods import MethodSpec
from reflect_otel.config import ReflectConfig
from reflect_otel.errors import ReplayError
from reflect_otel.flagging.verifiers import Verifier, bound_to, bound_to_runs, is_undecided, takes_runs
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.budget import BudgetedLLM, TokenBudget
from reflect_otel.llm.recording import CallLog, RecordingLLM, recording_agent_calls
from reflect_otel.record import AGENT_REPLAY_STAGE, AttributionMode, AttributionRecord, AttributionStatus, StageError
from reflect_otel.replay import BudgetedReplay, ReplayAdapter, ReplayRequest, ReplayResult, TakesTaskContext, resampler
from reflect_otel.store import (
    AttributionStore,
    CompositeRecordExporter,
    ExportFailure,
    ExportResult,
    ReadsRecords,
    RecordExporter,
    StoreRecordExporter,
)
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = [
    "EXPORT_STAGE",
    "STORE_EXPORTER",
    "AttributionMetrics",
    "AttributionService",
    "Outcome",
    "ReplayFinder",
    "ServiceOptions",
    "ServiceWiring",
]

EXPORT_STAGE = "export"
"""The stage named in a record's ``errors`` for an exporter that failed."""
STORE_EXPORTER = "store"
"""The store's name among the exporters (in ``errors`` and the ``exporter`` label of ``reflect.export.failures``)."""

_log = logging.getLogger("reflect_otel.attribution.service")

ReplayFinder = Callable[[StructuredTrace, StructuredLLM], "ReplayAdapter | None"]
"""Finds an adapter that can re-run the agent of a trace (or None: the attribution is localization-only)."""


class AttributionMetrics(Protocol):
    """What the service counts (``reflect_otel.exporters.metrics.AttributionMetrics`` implements it)."""

    def trace_seen(self, trace: StructuredTrace, *, flagged: bool, uncertain: bool = False) -> None: ...

    def record_attributed(self, record: AttributionRecord) -> None: ...

    def export_failed(self, exporter: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one trace."""

    verdict: Verdict | None
    """The first verdict on the run (the triage verdict, else the one the method reached)."""
    flagged: bool
    """Judged wrong (and so attributed, unless a budget stopped it)."""
    record: AttributionRecord | None
    """None when the run was not flagged in triage."""
    budget_skipped: bool = False
    tokens: int = 0
    """Tokens spent on this trace, the triage verdict's included (counted by the budget, when there is one)."""
    export_failures: tuple[ExportFailure, ...] = ()
    """Each export that failed (also in the record's ``errors``)."""


@dataclass(slots=True)
class _TraceRun:
    """What the processing of one trace carries from stage to stage."""

    trace: StructuredTrace
    expected: str | None
    replay: ReplayAdapter | None
    domain_context: str
    llm: StructuredLLM
    """The service's model, through the trace's token budget when there is one."""
    budgeted: BudgetedLLM | None
    agent_calls: CallLog = field(default_factory=CallLog)
    """Calls a found adapter's agent made on our model (the agent's cost, counted in the record)."""
    triage_calls: CallLog = field(default_factory=CallLog)
    """Calls the verdict made before the method ran."""

    @property
    def tokens(self) -> int:
        """Tokens this trace spent so far through its budget (0 without one)."""
        return self.budgeted.used if self.budgeted is not None else 0

    def with_calls(self, record: AttributionRecord) -> AttributionRecord:
        """``record`` with the triage's calls before its own and the agent's after them."""
        return record.with_calls(before=self.triage_calls.calls, after=self.agent_calls.calls)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceWiring:
    """What an :class:`AttributionService` is wired to, and how it treats runs (see the service)."""

    verifier: Verifier
    proxy: Verifier | None = None
    config: ReflectConfig | None = None
    store: AttributionStore | None = None
    exporters: Mapping[str, RecordExporter] | None = None
    metrics: AttributionMetrics | None = None
    replay_finder: ReplayFinder | None = None
    budget: TokenBudget | None = None
    triage: bool = False
    skip_correct: bool = False
    max_replays: int | None = None
    plans: PlanPool | None = None


class ServiceOptions(TypedDict, total=False):
    """:class:`ServiceWiring` as keyword arguments of :class:`AttributionService`."""

    verifier: Verifier
    proxy: Verifier | None
    config: ReflectConfig | None
    store: AttributionStore | None
    exporters: Mapping[str, RecordExporter] | None
    metrics: AttributionMetrics | None
    replay_finder: ReplayFinder | None
    budget: TokenBudget | None
    triage: bool
    skip_correct: bool
    max_replays: int | None
    plans: PlanPool | None


class AttributionService:
    """One trace in, verdict and attribution out, stored and exported.

    ``verifier`` judges runs with an expected answer; runs without one go to ``proxy`` when it is given (the
    plan-anchored verifier), else to ``verifier`` too. ``triage`` verifies every run first and attributes only the
    flagged ones (online mode); it never flags a run the oracle judged undecided
    (:func:`~reflect_otel.flagging.verifiers.is_undecided`). ``skip_correct`` judges every run first too, and records a run
    judged right or undecided as skipped (with its verdict) without attributing it; any other run the verifier cannot
    judge is attributed. With neither,
    every trace given is attributed (the method itself skips a correct one where it checks). ``replay_finder`` supplies an adapter when the caller passes none, told the run's domain
    context when it writes its agent's prompt itself (:class:`TakesTaskContext`). ``max_replays`` caps the replays
    of one trace, controls included, found adapter or passed, so every method compared gets the same budget (None:
    the configuration's ``max_replays``). ``budget`` caps the tokens
    per trace and per hour: a flagged run met with a spent hourly budget is stored, not attributed. Every model
    call made for a trace (the triage audit, the method's stages, the audits of its replays, and the calls of a
    found adapter's agent on this model) goes through that budget and into the record's ``llm_calls`` and
    ``cost``, once. An adapter the caller passes runs its agent on the agent's own model: that is the agent's cost.
    """

    def __init__(
        self,
        llm: StructuredLLM,
        method: MethodSpec,
        wiring: ServiceWiring | None = None,
        /,
        **options: Unpack[ServiceOptions],
    ) -> None:
        """``wiring``, or the same settings as keywords (``verifier=...`` at least): a keyword overrides ``wiring``."""
        wired = dataclasses.replace(wiring, **options) if wiring is not None else ServiceWiring(**options)
        max_replays, plans = wired.max_replays, wired.plans
        self.llm = llm
        self.method = method
        self.verifier = wired.verifier
        self.proxy = wired.proxy
        self.config = wired.config or ReflectConfig()
        self.store = store = wired.store
        self.exporters = dict(wired.exporters or {})
        self._fanout = CompositeRecordExporter(self.exporters)
        self._stored = StoreRecordExporter(store, wait_millis=10_000) if store is not None else None
        self.metrics = wired.metrics
        self.replay_finder = wired.replay_finder
        self.budget = wired.budget
        self.triage = wired.triage
        self.skip_correct = wired.skip_correct
        if max_replays is not None and max_replays < 1:
            raise ValueError("max_replays must be at least 1 (None: the configuration's)")
        self.max_replays = max_replays if max_replays is not None else self.config.max_replays
        if self.max_replays is not None and self.max_replays != self.config.max_replays:
            # the record's configuration says the cap its replays ran under
            self.config = self.config.model_copy(update={"max_replays": self.max_replays})
        self.plans = plans if plans is not None else self._stored_plans()
        """The plans the auditor wrote for the failures this service attributed (the placebo control draws on
        them), and for a placebo on a store that reads its records back, those stored before it started; pass one
        pool to every service of an evaluation to share them."""

    def _stored_plans(self) -> PlanPool:
        pool = PlanPool()
        if self.method.name != PLACEBO_METHOD or not isinstance(self.store, ReadsRecords):
            return pool  # only the placebo draws on plans; reading records costs a start
        try:
            pool.add_stored(self.store.recent_records(STORED_RECORDS, excluding=PLACEBO_METHOD))
        except Exception:  # a store that cannot be read: the placebo starts with no plan, as on an empty store
            _log.warning("the stored plans could not be read; the placebo starts with none", exc_info=True)
        return pool

    def verifier_for(self, expected: str | None) -> Verifier:
        return self.verifier if expected is not None or self.proxy is None else self.proxy

    def process(
        self,
        trace: StructuredTrace,
        *,
        expected: str | None = None,
        replay: ReplayAdapter | None = None,
        domain_context: str = "",
        trace_stored: bool = False,
    ) -> Outcome:
        """Verify (in triage), attribute, store, count and export one trace (``trace_stored``: the caller wrote the
        trace to the store already, and it is not written again). Never raises for what a method or an exporter
        meets; a store rejects bad content by counting it (see :class:`AttributionStore`). The calls an
        agent's :class:`~reflect_otel.llm.recording.AgentCallRecorder` model makes meanwhile (its replays and
        proposals) are counted in the record as the agent's, as a found adapter's agent's are."""
        if self.store is not None and not trace_stored:
            self.store.write_trace(trace)  # once, whatever becomes of the run
        # one budget for everything this trace costs: the triage audit, the method's calls, the audits of replays
        budgeted = BudgetedLLM(self.llm, self.budget) if self.budget is not None else None
        run = _TraceRun(
            trace,
            None if self.method.withholds_expected else expected,
            replay,
            domain_context,
            budgeted if budgeted is not None else self.llm,
            budgeted,
        )
        with recording_agent_calls(run.agent_calls):  # a found adapter's agent runs on our model: this trace's cost
            return self._process(run)

    def _process(self, run: _TraceRun) -> Outcome:
        verifier = self.verifier_for(run.expected)
        verdict: Verdict | None = None
        if self.triage or self.skip_correct:
            verdict = self._judge(self._bound_judge(verifier, run), run)
            settled = self._triaged(run, verdict) if self.triage else self._skipped_if_right(run, verdict)
            if settled is not None:
                return settled
        if self.budget is not None and self.budget.hour_is_spent:
            record = run.with_calls(_budget_skip(run.trace, self.method.name, verdict, self.budget.per_hour))
            outcome = Outcome(verdict, True, record, budget_skipped=True, tokens=record.total_tokens)
            return self._finish(run.trace, verdict, record, outcome)
        return self._attribute(run, verifier, verdict)

    def _found(self, run: _TraceRun) -> ReplayAdapter | None:
        """The adapter the replay finder gives for the run (its agent on this trace's model), told the domain."""
        if self.replay_finder is None:
            return None
        adapter = self.replay_finder(run.trace, RecordingLLM(run.llm, run.agent_calls, stage=AGENT_REPLAY_STAGE))
        if run.domain_context and isinstance(adapter, TakesTaskContext):
            adapter = adapter.with_task_context(run.domain_context)
        return adapter

    def _bound_judge(self, verifier: Verifier, run: _TraceRun) -> Verifier:
        """``verifier``, given the agent's resamples when it checks consistency (the run's adapter, else a found one;
        none past the hourly budget, which it then names)."""
        if not takes_runs(verifier):
            return verifier
        if run.replay is None:
            run.replay = self._found(run)
        source = resampler(run.replay) if run.replay is not None else None
        if source is not None and self.budget is not None and self.budget.hour_is_spent:
            source = _SpentHour(self.budget.per_hour)
        return bound_to_runs(verifier, source)

    def _triaged(self, run: _TraceRun, verdict: Verdict) -> Outcome | None:
        """Online triage: the verdict stored and counted; the outcome when the run is not flagged, else None."""
        uncertain = verdict.is_correct is None
        # an undecided answer (the oracle's: several values named, none asserted) is no failure to attribute
        flagged = verdict.is_correct is False or (
            uncertain and self.config.attribute_uncertain and not is_undecided(verdict)
        )
        if self.store is not None:
            self.store.write_verdict(run.trace.trace_id, verdict)
        if self.metrics is not None:
            self.metrics.trace_seen(run.trace, flagged=flagged, uncertain=uncertain)
        return None if flagged else Outcome(verdict, False, None, tokens=run.tokens)

    def _skipped_if_right(self, run: _TraceRun, verdict: Verdict) -> Outcome | None:
        """A run judged right or undecided, recorded as skipped; None for any other."""
        if verdict.is_correct is not True and not is_undecided(verdict):
            return None
        record = run.with_calls(_correct_skip(run.trace, self.method.name, verdict))
        return self._finish(run.trace, verdict, record, Outcome(verdict, False, record, tokens=run.tokens))

    def _attribute(self, run: _TraceRun, verifier: Verifier, verdict: Verdict | None) -> Outcome:
        replay = run.replay if run.replay is not None else self._found(run)
        if replay is not None and self.max_replays is not None:
            replay = BudgetedReplay(replay, self.max_replays)  # per trace: the same for every method compared
        attributor = self.method.build(run.llm, verifier, self.config, self.plans)
        record = run.with_calls(
            attributor.attribute(
                run.trace, expected=run.expected, replay=replay, domain_context=run.domain_context, verdict=verdict
            )
        )
        checked = record.original_verdict.consistency if verdict is None and record.original_verdict else None
        if self.budget is not None and checked is not None and not run.agent_calls.calls:
            self.budget.spend(checked.agent_tokens)  # the method's own check resampled an agent on its own model
        tokens = run.budgeted.used if run.budgeted is not None else record.total_tokens
        first = verdict or record.original_verdict
        return self._finish(run.trace, first, record, Outcome(first, True, record, tokens=tokens))

    def _judge(self, verifier: Verifier, run: _TraceRun) -> Verdict:
        """The verdict, its model calls in the run's ``triage_calls``. A consistency check's resamples count against
        the hourly budget: through the run's model when the agent ran on it (its calls are in ``agent_calls``), else
        by the tokens its resampled traces report (the agent's own model)."""
        before = len(run.agent_calls.calls)
        verdict = bound_to(verifier, RecordingLLM(run.llm, run.triage_calls)).verify(run.trace, expected=run.expected)
        if self.budget is not None and verdict.consistency is not None and len(run.agent_calls.calls) == before:
            self.budget.spend(verdict.consistency.agent_tokens)
        return verdict

    def _finish(
        self, trace: StructuredTrace, verdict: Verdict | None, record: AttributionRecord, outcome: Outcome
    ) -> Outcome:
        """Store, count and export ``record``: the exporters first, then the store, so that the stored record names
        the exporters that failed; the outcome's record names the store too when it failed."""
        self.plans.add(trace, record)
        if self.metrics is not None:
            self.metrics.record_attributed(record)
        failures = self._fanout.export_each([record], verdict=(trace, verdict) if verdict is not None else None)
        record = _with_failures(record, failures)
        if self.store is not None and self._stored is not None:
            if verdict is not None and not self.triage:  # in triage the verdict was written when it was reached
                self.store.write_verdict(trace.trace_id, verdict)
            failures += self._export_to_store(record)
        for failure in failures:
            if self.metrics is not None:
                self.metrics.export_failed(failure.exporter)
        if not failures:
            return outcome
        record = _with_failures(outcome.record or record, failures)
        return dataclasses.replace(outcome, record=record, export_failures=failures)

    def _export_to_store(self, record: AttributionRecord) -> tuple[ExportFailure, ...]:
        assert self._stored is not None
        try:
            failed = self._stored.export([record]) is not ExportResult.SUCCESS
        except Exception as error:  # a store that raises breaks its contract; the run still goes on
            self._stored.failure = f"{type(error).__name__}: {error}"
            failed = True
        if not failed:
            return ()
        _log.warning("storing the attribution of %s failed: %s", record.trace_id, self._stored.failure)
        return (ExportFailure(STORE_EXPORTER, self._stored.failure),)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the exporters and the store."""
        flushed = self._fanout.force_flush(timeout_millis)
        return (self.store.force_flush(timeout_millis) if self.store is not None else True) and flushed

    def shutdown(self) -> None:
        """Shut the exporters and the store down (the store flushing what it holds)."""
        self._fanout.shutdown()
        if self.store is not None:
            self.store.shutdown()

    def close(self) -> None:
        """Deprecated: :meth:`shutdown`, the OpenTelemetry SDK's name."""
        self.shutdown()


def _with_failures(record: AttributionRecord, failures: tuple[ExportFailure, ...]) -> AttributionRecord:
    """``record`` with each export failure among its ``errors`` (stage ``export``), once."""
    errors = tuple(StageError(stage=EXPORT_STAGE, message=str(failure)) for failure in failures)
    added = tuple(error for error in errors if error not in record.errors)
    return record.model_copy(update={"errors": record.errors + added}) if added else record


class _SpentHour:
    """The resampler while the hourly token budget is spent: it runs the agent no more, and says so (the check's
    verdict then names the budget, not a missing adapter)."""

    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour

    def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
        raise ReplayError(
            f"the hourly token budget ({self.per_hour} tokens) is spent: no agent resample until it frees"
        )


def _correct_skip(trace: StructuredTrace, method: str, verdict: Verdict) -> AttributionRecord:
    judged = (
        "undecided (it names several values without saying which it asserts: neither right nor a failure)"
        if is_undecided(verdict)
        else "right"
    )
    return _skipped(
        trace,
        method,
        verdict,
        f"the answer was judged {judged} by the {verdict.verifier} verifier: nothing to attribute",
    )


def _budget_skip(trace: StructuredTrace, method: str, verdict: Verdict | None, per_hour: int) -> AttributionRecord:
    return _skipped(
        trace,
        method,
        verdict,
        f"the hourly LLM token budget ({per_hour}) is spent: stored and flagged, not attributed; raise "
        "max_tokens_per_hour",
    )


def _skipped(trace: StructuredTrace, method: str, verdict: Verdict | None, reason: str) -> AttributionRecord:
    return AttributionRecord(
        trace_id=trace.trace_id,
        method=method,
        status=AttributionStatus.SKIPPED,
        mode=AttributionMode.NONE,
        original_verdict=verdict,
        original_answer=trace.final_answer,
        reason=reason,
    )
