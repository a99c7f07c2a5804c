"""Manual replay: your own change of one step of a failed run, tested under the rule every attribution's
corrections are tested under (:mod:`reflect_otel.attribution.controlled_replay`).

``replay_from(trace, step, call=..., replay=adapter, expected=...)`` (or ``reflect-otel replay TRACE --step N
--call CALL``) replays the run from step ``step`` through its replay adapter with the change: a call executed in
place of the step (``call``, written as the report and the demo print one: ``search_books({"text": "orchard"})``),
a thought in its place (``text``), or the agent's own decision at the step resampled ``resample`` times
(each distinct decision executed). From the same prefix it replays the control (the step left alone) and, before a
flip is credited, the sensitivity arm (the step changed in text only), all out of one replay budget. The outcome is
an :class:`~reflect_otel.record.AttributionRecord` of method ``manual``, stored, shown and exported like any record:
verified (decisive: changed as you asked, the step's effect changed and the run answered right, and neither the
control nor the sensitivity arm did; with ``resample``, localized when the agent's own resampled step at another step
does not flip the run), not attributable, or unverified; its ``reason`` says what the rule concluded
(:func:`conclusion`). A change that changes nothing (the original call, a call whose preview returns what the step
returned, a thought with the step's words) is said so, and replays nothing or counts for nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reflect_otel.attribution._run import AttributeOptions, Conclusion, MethodBase
from reflect_otel.attribution.effects import same_content
from reflect_otel.attribution.methods import MethodSpec
from reflect_otel.attribution.pipeline import resampled_elsewhere, resampling
from reflect_otel.attribution.search import Diagnosis, Round, SearchContext, search
from reflect_otel.attribution.trial import GateFn, Trial, TrialResult
from reflect_otel.config import ReflectConfig
from reflect_otel.errors import ConfigError
from reflect_otel.flagging.verifiers import OracleVerifier, Verifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.reading.tool_definitions import available_tools
from reflect_otel.record import (
    AttributionMode,
    AttributionRecord,
    AttributionStatus,
    Correction,
    InterventionKind,
    Localization,
    ReplayArm,
    ReplayAttempt,
    StepChange,
)
from reflect_otel.replay import ReplayAdapter
from reflect_otel.trace import StepAction, StructuredTrace
from reflect_otel.verdict import shown_answer

if TYPE_CHECKING:
    from reflect_otel.store import AttributionStore, RecordExporter

__all__ = [
    "MANUAL_METHOD",
    "ManualEdit",
    "ManualPolicy",
    "ManualReplay",
    "ReplayFromOptions",
    "StepChange",
    "arm_replays",
    "check_edit",
    "conclusion",
    "manual_method",
    "parse_call",
    "replay_from",
]

MANUAL_METHOD = "manual"
"""The method of a manual replay's record."""

MAX_RESAMPLES = 20
"""The most decisions of the agent's own one manual replay resamples at its step."""

_CALL = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*\((.*)\)\s*$", re.DOTALL)


def parse_call(text: str) -> StepAction:
    """A tool call written as ``name({"argument": value, ...})`` (how the report, the demo and ``show`` print one;
    ``name()`` for none). Raises :class:`ConfigError` saying how to write one."""
    match = _CALL.match(text)
    example = 'search_books({"text": "orchard"})'
    if match is None:
        raise ConfigError(f"--call {text[:200]!r}: write the call as tool(JSON arguments), e.g. {example}")
    name, inside = match.group(1), match.group(2).strip()
    try:
        arguments = json.loads(inside) if inside else {}
    except ValueError as error:
        raise ConfigError(
            f"--call {text[:200]!r}: its arguments are not one JSON object ({error}); e.g. {example}"
        ) from None
    if not isinstance(arguments, dict):
        raise ConfigError(f"--call {text[:200]!r}: its arguments must be one JSON object, e.g. {example}")
    return StepAction(tool_name=name, arguments=arguments)


class ManualEdit(BaseModel):
    """One change of step ``step``: an ``action`` executed in its place (a call, or a thought), or the agent's own
    decision there resampled ``resample`` times."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=1)
    action: StepAction | None = None
    resample: int | None = Field(default=None, ge=1, le=MAX_RESAMPLES)

    @model_validator(mode="after")
    def _one_change(self) -> ManualEdit:
        if (self.action is None) == (self.resample is None):
            raise ValueError("give one change: a call, a text or a number of resamples")
        return self

    @classmethod
    def of(
        cls, step: int, *, call: str | StepAction | None = None, text: str | None = None, resample: int | None = None
    ) -> ManualEdit:
        """The edit from ``call`` (parsed by :func:`parse_call` when text), ``text`` or ``resample``; exactly one.
        Raises :class:`ConfigError` naming the choice."""
        given = [name for name, value in (("call", call), ("text", text), ("resample", resample)) if value is not None]
        if len(given) != 1:
            raise ConfigError("give exactly one change of the step: --call CALL, --text TEXT or --resample K")
        if step < 1:
            raise ConfigError(f"--step {step}: steps are numbered from 1")
        if resample is not None:
            if not 1 <= resample <= MAX_RESAMPLES:
                raise ConfigError(f"--resample {resample}: from 1 to {MAX_RESAMPLES}")
            return cls(step=step, resample=resample)
        if text is not None:
            if not text.strip():
                raise ConfigError("--text: the thought to put in the step's place is empty")
            return cls(step=step, action=StepAction(text=text.strip()))
        action = parse_call(call) if isinstance(call, str) else call
        assert action is not None
        return cls(step=step, action=action)

    def describe(self) -> str:
        """The change in words: ``filter_rows({...}) in place of step 1``."""
        if self.action is None:
            return f"step {self.step} resampled {self.resample} time(s) (the agent's own decision, no hint)"
        if self.action.tool_name is None:
            return f"the thought {self.action.text[:300]!r} in place of step {self.step}"
        return f"{self.action.render()[:300]} in place of step {self.step}"


def check_edit(trace: StructuredTrace, edit: ManualEdit) -> None:
    """Refuse, before anything runs, an edit of a step the run does not have, of its answer turn (a replacement
    there only gives the agent more turns), or a call of a tool the run's agent does not have. Raises
    :class:`ConfigError` naming the choices."""
    steps = trace.steps
    replaceable = [s.index for s in steps if not s.is_final_answer]
    choices = (
        (f"step {replaceable[0]}" if len(replaceable) == 1 else f"steps {replaceable[0]} to {replaceable[-1]}")
        if replaceable
        else "none: the run has no such step"
    )
    if not 1 <= edit.step <= len(steps):
        raise ConfigError(f"--step {edit.step}: the run has {len(steps)} step(s); the ones to change: {choices}")
    if steps[edit.step - 1].is_final_answer:
        raise ConfigError(
            f"--step {edit.step} is the run's answer turn: a change there only gives the agent more turns, which can "
            f"flip a run from anywhere; change a step before it ({choices})"
        )
    action = edit.action
    tools = sorted({t.name for t in available_tools(trace)})
    if action is not None and action.tool_name is not None and tools and action.tool_name not in tools:
        raise ConfigError(f"--call: the run's agent has no tool {action.tool_name!r}; its tools: {', '.join(tools)}")


_NO_COUNTERPART = (
    "a change you wrote has no counterpart at another step, so no localization test: the record says decisive, "
    "not localized"
)


@dataclass(frozen=True)
class ManualPolicy:
    """A search of one round and one trial: the user's change of their step (see the module)."""

    edit: ManualEdit

    def diagnose(self, ctx: SearchContext, rounds: Sequence[Round]) -> Diagnosis | None:
        if rounds:
            return None
        trace, step = ctx.trace, self.edit.step
        localization = Localization(step_index=step, confidence=0.0)  # the user's step: no auditor's reading of it
        original = trace.steps[step - 1]
        if self.edit.action is None:
            trial = resampling(
                step,
                trace,
                round_=1,
                localized=step,
                finding=f"your resample of step {step} (the agent's own, no hint)",
            )
            return Diagnosis(localization, trials=(trial,))
        correction = Correction(
            source=MANUAL_METHOD,
            kind=InterventionKind.ACTION,
            step_index=step,
            original=StepAction.of_step(original),
            replacement=self.edit.action,
            finding=f"your change of step {step}",
        )
        same = self.edit.action.same_as(StepAction.of_step(original)) or (
            self.edit.action.tool_name is None
            and original.tool_name is None
            and same_content(self.edit.action.text, original.reasoning)
        )
        if same:  # nothing to test: the step as it was (a thought in its own words)
            refused = correction.model_copy(update={"refused": StepChange.SAME_STEP.text})
            return Diagnosis(localization, refused=(refused,), note=StepChange.SAME_STEP.text)
        return Diagnosis(localization, trials=(Trial(correction, round=1, localized_step=step),))

    def gate(self, ctx: SearchContext) -> GateFn | None:
        return None  # a change you wrote, or the agent's own resampled step: no plan it must follow

    def elsewhere(self, ctx: SearchContext, verified: TrialResult, step: int) -> tuple[Trial | None, str]:
        """With ``resample``, the agent's own decision at ``step``, resampled: the same source, elsewhere. A change
        the user wrote has none."""
        if self.edit.action is not None:
            return None, _NO_COUNTERPART
        return resampled_elsewhere(ctx, verified, step)


class ManualReplay(MethodBase):
    """The manual replay as a method (:class:`~reflect_otel.attribution.methods.Attributor`): the shared search with
    :class:`ManualPolicy`, its record's ``reason`` the rule's conclusion in words. Asks no model itself (a model
    verifier judges with its own); ``resample`` sets the proposals sampled at the step."""

    method = MANUAL_METHOD

    def __init__(
        self, edit: ManualEdit, llm: StructuredLLM, *, verifier: Verifier, config: ReflectConfig | None = None
    ) -> None:
        config = config or ReflectConfig()
        if edit.resample is not None:
            config = config.model_copy(update={"proposal_samples": edit.resample})
        super().__init__(llm, verifier=verifier, config=config)
        self.edit = edit

    def attribute(self, trace: StructuredTrace, **options: Unpack[AttributeOptions]) -> AttributionRecord:
        expected, replay = options.get("expected"), options.get("replay")
        domain_context, verdict = options.get("domain_context", ""), options.get("verdict")
        run = self.start(trace, verdict)
        run.config["manual_edit"] = self.edit.model_dump(mode="json")
        if replay is None:
            return run.record(
                Conclusion(
                    AttributionStatus.UNVERIFIED,
                    AttributionMode.LOCALIZATION_ONLY,
                    step_index=self.edit.step,
                    reason="nothing was replayed: no replay adapter can re-run this run's agent",
                )
            )
        record = self.guarded(
            run,
            AttributionMode.REPLAY,
            lambda: search(
                run,
                ManualPolicy(self.edit),
                expected=expected,
                replay=replay,
                domain_context=domain_context,
                config=self.config,
            ),
        )
        update: dict[str, Any] = {"auditor_confidence": None}
        if record.status is not AttributionStatus.VERIFIED:
            update["reason"] = conclusion(record)
        return record.model_copy(update=update)


def manual_method(edit: ManualEdit) -> MethodSpec:
    """The manual replay of ``edit`` as a :class:`~reflect_otel.attribution.methods.MethodSpec`, for the attribution service
    (which stores and exports its record as any method's). Needs no model of its own."""

    def build(
        llm: StructuredLLM, verifier: Verifier, config: ReflectConfig, plans: object | None = None
    ) -> ManualReplay:
        return ManualReplay(edit, llm, verifier=verifier, config=config)

    return MethodSpec(MANUAL_METHOD, build, needs_llm=False)


def arm_replays(record: AttributionRecord) -> dict[ReplayArm, list[ReplayAttempt]]:
    """The replays of a manual record's test, by arm (intervention, control, sensitivity), from its step's prefix;
    the localization test's apart."""
    step = _edit_step(record)
    arms: dict[ReplayArm, list[ReplayAttempt]] = {}
    for attempt in record.replays:
        if attempt.rollback_point == step - 1 or attempt.arm is ReplayArm.LOCALIZATION:
            arms.setdefault(attempt.arm, []).append(attempt)
    return arms


def _edit_step(record: AttributionRecord) -> int:
    edit = record.config.get("manual_edit")
    if isinstance(edit, Mapping) and isinstance(edit.get("step"), int):
        return int(edit["step"])
    return record.step_index or 1


def conclusion(record: AttributionRecord) -> str:
    """What the rule concluded from a manual record's replays, in words a user reads after trying a change."""
    step = _edit_step(record)
    arms = arm_replays(record)
    control = _answers(arms.get(ReplayArm.CONTROL, []))
    if record.status is AttributionStatus.VERIFIED:
        sensitivity = _answers(arms.get(ReplayArm.SENSITIVITY, []))
        claim = (
            "localized: the same source at another step did not flip the run"
            if record.claim == "localized"
            else f"decisive, not shown to be the only decisive step: {_localization_reason(record)}"
        )
        return (
            f"changed this way, step {step} changed what it produced and the agent answered "
            f"{shown_answer(record.corrected_answer)}, judged right; from the same prefix the control answered "
            f"{control} and the sensitivity arm (step {step} changed in text only) {sensitivity}: step {step} is "
            f"{claim}"
        )
    if record.status is AttributionStatus.NOT_ATTRIBUTABLE:
        return f"your change flipped the run, but the flip cannot be credited to step {step}: {record.reason}"
    if record.status is AttributionStatus.SKIPPED:
        return f"nothing was replayed: {record.reason}"
    interventions = [a for a in arms.get(ReplayArm.INTERVENTION, []) if a.correction is not None]
    answered = [a for a in interventions if a.error is None]
    if not answered:
        refused = [c.refused for c in record.corrections if c.refused]
        resampled = record.config.get("manual_edit", {}).get("resample")
        if refused and resampled:
            return (
                f"none of the agent's {resampled} resampled decision(s) at step {step} changes the step, so nothing was "
                f"tested: {refused[0]}"
            )
        if refused:
            return f"your change changes nothing at step {step}, so nothing was tested: {refused[0]}"
        failed = [a.error for a in interventions if a.error] + [e.message for e in record.errors]
        if failed:
            return f"the replay failed: {failed[0]}"
        return f"nothing was tested: {record.reason}"
    changed = [a for a in answered if a.change is StepChange.CHANGED]
    if not changed:
        what = answered[0].change.text if answered[0].change is not None else "the replay did not change the step"
        return (
            f"your change did not change what step {step} produced ({what}), so the rule tests nothing by it; the "
            f"replay answered {_answers(answered)}"
        )
    return (
        f"changed this way, step {step} produced something else and the agent still answered wrong "
        f"({_answers(changed)}; the control answered {control}): this change of step {step} does not decide the run"
    )


def _answers(attempts: list[ReplayAttempt]) -> str:
    ran = [a for a in attempts if a.error is None]
    return ", ".join(shown_answer(a.final_answer) for a in ran) if ran else "nothing (it did not run)"


def _localization_reason(record: AttributionRecord) -> str:
    test = record.localization_test
    return test.reason if test is not None and test.reason else "no localization test ran"


class ManualChange(TypedDict, total=False):
    """The one change :func:`replay_from` makes at its step (exactly one given; see :meth:`ManualEdit.of`)."""

    call: str | StepAction
    text: str
    resample: int


@dataclass(frozen=True)
class ReplayFromOptions:
    """How :func:`replay_from` judges and keeps its replay: ``verifier`` (default: the oracle verifier), ``llm`` (the
    auditor, for an edit that needs one), ``config``'s settings, ``max_replays`` (caps the replays, controls and
    sensitivity arms included; default ``config.max_replays``), the run's ``domain_context``, and the ``store`` and
    ``exporters`` the record goes to (left open: the caller closes them)."""

    verifier: Verifier | None = None
    llm: StructuredLLM | None = None
    config: ReflectConfig | None = None
    max_replays: int | None = None
    domain_context: str = ""
    store: AttributionStore | None = None
    exporters: Mapping[str, RecordExporter] | None = None


def replay_from(
    trace: StructuredTrace,
    step: int,
    *,
    replay: ReplayAdapter,
    expected: str | None,
    options: ReplayFromOptions | None = None,
    **change: Unpack[ManualChange],
) -> AttributionRecord:
    """Replay ``trace`` from step ``step`` with one change (``call=``, ``text=`` or ``resample=``; see the module)
    through ``replay``, its run judged against ``expected`` as ``options`` say (:class:`ReplayFromOptions`). The
    record is written to the options' store and sent to their exporters when given, as the attribution service does
    for any method. Raises :class:`ConfigError` for an edit the run cannot take (:func:`check_edit`); anything the
    agent does is recorded, never raised."""
    from reflect_otel.attribution.service import AttributionService
    from reflect_otel.llm.factory import NoModel

    chosen = options or ReplayFromOptions()
    edit = ManualEdit.of(step, **change)
    check_edit(trace, edit)
    service = AttributionService(
        chosen.llm or NoModel(),
        manual_method(edit),
        verifier=chosen.verifier or OracleVerifier(),
        config=chosen.config,
        store=chosen.store,
        exporters=chosen.exporters,
        max_replays=chosen.max_replays,
    )
    outcome = service.process(trace, expected=expected, replay=replay, domain_context=chosen.domain_context)
    if chosen.store is not None:
        chosen.store.force_flush()  # the caller's store and exporters stay open: the caller closes them
    assert outcome.record is not None  # without triage every trace gets a record
    return outcome.record
