"""What a trial replays (:func:`candidates`): an action as given; or, for guidance, the agent's own decisions at the
step with the text in context, proposed by the adapter (:class:`~reflect_otel.replay.ProposesSteps`), sampled, and
screened before any costs a replay: a final answer, the original step, a pure tool's call the prefix made (see
:func:`reflect_otel.attribution.corrections.refusal`), a call the run made at a later step
(:func:`reflect_otel.attribution.effects.screened_change`), or a call already replayed there is refused,
and a proposal made under a plan is judged by the faithfulness gate (a hard gate refuses an unfaithful one)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from reflect_otel.attribution import corrections
from reflect_otel.attribution._run import AttributionRun
from reflect_otel.attribution.effects import same_result, screened_change
from reflect_otel.attribution.trial import GateFn, Trial
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.record import Correction, GateDecider, GateVerdict, InterventionKind, Stage, StepChange
from reflect_otel.replay import (
    ProposedStep,
    ReplayAdapter,
    ReplayRequest,
    previewer,
    proposer,
    pure_tools,
    result_normaliser,
)
from reflect_otel.trace import Step, StepAction, StepKind, StructuredTrace

__all__ = [
    "ALREADY_REPLAYED",
    "Candidate",
    "EffectScreen",
    "Screening",
    "candidates",
    "judge",
    "replayed_already",
]

ALREADY_REPLAYED = "the same call was already replayed at this step"


@dataclass(frozen=True, slots=True)
class Candidate:
    """An intervention ready to replay: the action to execute (None: the agent regenerates the step itself in the
    replay), the position of its correction among those considered, and the gate's verdict on a proposal made under
    a plan."""

    index: int
    action: StepAction | None
    gate: GateVerdict | None = None


def judge(
    trial: Trial, proposed: StepAction, original: Step, gate: GateFn | None, mode: GateMode
) -> GateVerdict | None:
    """The gate's verdict on a new step p made under a plan; None for bare resampling (no plan to follow). With the
    gate off nothing is judged, and an unjudged step cannot verify."""
    if trial.plan is None:
        return None
    if mode is GateMode.OFF or gate is None:
        return GateVerdict(
            is_faithful=False,
            violation_reason="the gate is off: a guidance flip is recorded, never verified",
            decided_by=GateDecider.SKIPPED,
        )
    return gate(trial.plan, as_step(proposed, trial.step), original)


def candidates(
    trial: Trial, screening: Screening, *, replayed_here: Collection[str]
) -> tuple[list[Candidate], list[Correction]]:
    """The interventions to replay for ``trial``, in order, and every correction considered for it (the candidates
    point into that list). ``replayed_here``: the keys (:meth:`StepAction.key`) of the actions already replayed at
    the trial's rollback point; an action among them is refused, given or proposed. ``screening.effects`` refuses a
    replacement that changes nothing, or repeats another's result."""
    run, effects = screening.run, screening.effects
    if trial.is_action:
        refused = replayed_already(trial, replayed_here)
        action = trial.correction.replacement
        if refused is None and action is not None:
            why = effects.refusal(action, trial.step)
            refused = trial.correction.model_copy(update={"refused": why}) if why else None
        return ([], [refused]) if refused else ([Candidate(0, action)], [trial.correction])
    source = proposer(screening.adapter)
    if source is None:  # the agent regenerates the step itself in the replay; judged after the fact
        return [Candidate(0, None)], [trial.correction]
    config = screening.config
    try:
        asked = ReplayRequest(
            trace=run.trace,
            rollback_point=trial.rollback_point,
            injection=trial.injection,
            injection_role=config.injection_role,
            temperature=config.proposal_temperature,
        )
        proposals = source.propose(asked, samples=config.proposal_samples)
    except Exception as error:  # the adapter or the agent may fail in any way
        run.error(Stage.PROPOSE, error, trial.round)
        return [], []
    return _screened(trial, proposals, screening, replayed_here)


class EffectScreen:
    """What a replacement would produce at its step, where the adapter can preview it
    (:class:`~reflect_otel.replay.PreviewsSteps`): one whose result is the original step's, or the same as another
    replacement's already kept there, would test nothing new and is refused before a replay is spent on it."""

    def __init__(self, trace: StructuredTrace, adapter: ReplayAdapter) -> None:
        self.trace = trace
        self.source = previewer(adapter)
        self.normalise = result_normaliser(adapter)
        self._kept: dict[int, list[tuple[str, str]]] = {}  # per step: (result, the replacement that gave it)

    def refusal(self, action: StepAction, step: int) -> str | None:
        """Why ``action`` at ``step`` would test nothing new, or None (also when no preview can tell)."""
        if self.source is None or action.tool_name is None or not 1 <= step <= len(self.trace.steps):
            return None
        result = self.source.preview(self.trace, rollback_point=step - 1, action=action)
        if result is None:
            return None
        original = self.trace.steps[step - 1]
        if original.tool_name == action.tool_name and same_result(
            original.tool_result, result, tool_name=action.tool_name, normalise=self.normalise
        ):
            return f"{StepChange.SAME_EFFECT.text} (previewed before any replay)"
        kept = self._kept.setdefault(step, [])
        for earlier, rendered in kept:
            if same_result(earlier, result, tool_name=action.tool_name, normalise=self.normalise):
                return f"it returns what {rendered[:120]} returns there, which is tested already (previewed)"
        kept.append((result, action.render()))
        return None


@dataclass(frozen=True)
class Screening:
    """What screens the interventions of one attribution's trials: the run, its replay adapter, the settings, the
    faithfulness gate (None: off), and the screen of what replacements would produce (kept across trials)."""

    run: AttributionRun
    adapter: ReplayAdapter
    config: ReflectConfig
    gate: GateFn | None
    effects: EffectScreen

    @classmethod
    def of(
        cls, run: AttributionRun, adapter: ReplayAdapter, config: ReflectConfig, gate: GateFn | None = None
    ) -> Screening:
        """The screening of ``run``'s trials, with a new :class:`EffectScreen`."""
        return cls(run, adapter, config, gate, EffectScreen(run.trace, adapter))


def replayed_already(trial: Trial, replayed_here: Collection[str]) -> Correction | None:
    """``trial``'s own action refused as replayed at its rollback point already (``replayed_here``: the keys of the
    actions replayed there), or None: guidance, or an action new there."""
    action = trial.correction.replacement if trial.is_action else None
    if action is not None and action.key() in replayed_here:
        return trial.correction.model_copy(update={"refused": ALREADY_REPLAYED})
    return None


def _screened(
    trial: Trial, proposals: Sequence[ProposedStep], screening: Screening, replayed_here: Collection[str]
) -> tuple[list[Candidate], list[Correction]]:
    run, config, gate, effects = screening.run, screening.config, screening.gate, screening.effects
    pure = pure_tools(screening.adapter)
    original = run.trace.steps[trial.step - 1]
    seen: set[str] = set()
    kept: list[Candidate] = []
    considered: list[Correction] = []
    for number, proposal in enumerate(proposals, start=1):
        key = proposal.action.key()
        if key in seen:
            continue
        seen.add(key)
        correction = Correction(
            source=f"proposal:{trial.correction.source}",
            kind=InterventionKind.ACTION,
            step_index=trial.step,
            original=StepAction.of_step(original),
            replacement=proposal.action,
            finding=f"the agent's own decision at step {trial.step}"
            + (" with the correction in context" if trial.injection else " (resampled, no hint)")
            + f", proposal {number} of {len(proposals)}"
            + (f" ({proposal.note})" if proposal.note else ""),
        )
        refused = _refusal(correction, proposal, run, pure)
        if refused is None and key in replayed_here:
            refused = ALREADY_REPLAYED
        if refused is None:
            refused = effects.refusal(proposal.action, trial.step)
        verdict = None if refused else judge(trial, proposal.action, original, gate, config.gate)
        if refused is None and verdict is not None and not verdict.is_faithful and config.gate is GateMode.HARD:
            refused = (
                f"the gate judged it unfaithful to the plan ({verdict.violation_type}: {verdict.violation_reason})"
            )
        if refused is not None:
            considered.append(correction.model_copy(update={"refused": refused}))
            continue
        kept.append(Candidate(len(considered), proposal.action, verdict))
        considered.append(correction)
    return kept, considered


def _refusal(correction: Correction, proposal: ProposedStep, run: AttributionRun, pure: Collection[str]) -> str | None:
    if proposal.is_final_answer:
        return "the agent answered at once: a final answer proves nothing about the step"
    screened = screened_change(proposal.action, run.trace, correction.step_index)
    if screened is not None:
        return screened.text
    return corrections.refusal(correction, run.trace, expected=None, pure=pure)


def as_step(action: StepAction, index: int) -> Step:
    """A proposed action as the step it would be (for the gate)."""
    return Step(
        index=index,
        span_id="proposal",
        kind=StepKind.TOOL_CALL if action.tool_name else StepKind.REASONING,
        tool_name=action.tool_name,
        tool_args=dict(action.arguments),
        reasoning=action.text,
    )
