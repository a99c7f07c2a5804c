"""What an attribution produces: :class:`AttributionRecord`, with every replay tried and what it cost."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reflect_otel.trace import Step, StepAction
from reflect_otel.verdict import Verdict

__all__ = [
    "AGENT_REPLAY_STAGE",
    "REFUSED_TEXT_CHARS",
    "AttributionMode",
    "AttributionRecord",
    "AttributionStatus",
    "Classification",
    "Correction",
    "Effect",
    "EffectArm",
    "ErrorType",
    "Fidelity",
    "GateDecider",
    "GateVerdict",
    "Intervention",
    "InterventionKind",
    "LLMCall",
    "Localization",
    "LocalizationOutcome",
    "LocalizationTest",
    "Obstacle",
    "RepairPlan",
    "ReplayArm",
    "ReplayAttempt",
    "Stage",
    "StageCost",
    "StageError",
    "StepChange",
    "stage_costs",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Stage(str, Enum):
    """Who made a recorded model call or met a recorded error. Records and stores keep the value, a plain string
    (``LLMCall.stage``, ``StageCost.stage``, ``StageError.stage`` stay ``str``: an agent's own calls, a baseline's
    method name at its error boundary, and records of earlier versions name stages of their own)."""

    LOCALIZE = "localize"
    RELOCALIZE = "relocalize"
    CLASSIFY = "classify"
    DIAGNOSE = "diagnose"
    GATE = "gate"
    EXPLAIN = "explain"
    PROPOSE = "propose"
    REPLAY = "replay"
    AGENT_REPLAY = "agent_replay"
    """A call the agent made for the attribution, in a replay or asked for a proposal, on a model whose calls are
    recorded (the attributor's own, or one wrapped in :class:`~reflect_otel.llm.recording.AgentCallRecorder`): a
    cost of the attribution, counted with it as the agent's calls, apart from the auditor's."""
    AGENT = "agent"
    """A call of one of the shipped demo agents."""
    VERIFY = "verify"
    PROXY_ANCHORS = "proxy_anchors"
    PROXY_AUDIT = "proxy_audit"
    AAO = "aao"
    SBS = "sbs"
    BS = "bs"
    BS_REASON = "bs_reason"
    REFLECT = "reflect"
    """Reflexion's reflection on the failed run."""
    REFLEXION_EXTRACT = "reflexion_extract"
    DOVER_HYPOTHESES = "dover_hypotheses"

    def __str__(self) -> str:
        return self.value


AGENT_REPLAY_STAGE = Stage.AGENT_REPLAY
"""The same as :attr:`Stage.AGENT_REPLAY`."""


class ErrorType(str, Enum):
    """The paper's 11-category taxonomy (Appendix: Error Taxonomy)."""

    FORMATTING_ERROR = "formatting_error"
    INSTRUCTION_NONCOMPLIANCE = "instruction_noncompliance"
    CONTEXT_HANDLING_FAILURE = "context_handling_failure"
    RESOURCE_ABUSE = "resource_abuse"
    POOR_INFORMATION_RETRIEVAL = "poor_information_retrieval"
    INCORRECT_PROBLEM_IDENTIFICATION = "incorrect_problem_identification"
    HALLUCINATION = "hallucination"
    TOOL_ERROR = "tool_error"
    TASK_ORCHESTRATION = "task_orchestration"
    GOAL_DEVIATION = "goal_deviation"
    INCORRECT_MEMORY_USAGE = "incorrect_memory_usage"


class AttributionStatus(str, Enum):
    VERIFIED = "verified"
    """A controlled replay proved the step: the intervention changed the step and flipped the outcome to correct,
    and a control replay from the same prefix, without the intervention, did not (see :class:`Effect`)."""
    NOT_ATTRIBUTABLE = "not_attributable"
    """An intervention flipped the outcome, but the flip cannot be credited to the step: the control replay from the
    same prefix flipped too, or did not reproduce the run (see ``effect`` and ``fidelity``)."""
    UNVERIFIED = "unverified"
    """The best localization, without intervention evidence (replay failed, or none was possible)."""
    SKIPPED = "skipped"
    """Nothing to attribute (the answer already verifies as correct) or a budget ran out; see ``reason``."""


class AttributionMode(str, Enum):
    """How the attribution could test its hypothesis."""

    REPLAY = "replay"
    """A replay adapter re-ran the agent from kept prefixes with the correction injected."""
    LOCALIZATION_ONLY = "localization_only"
    """No replay adapter could run the agent (or the method does not replay): a localization without evidence."""
    NONE = "none"
    """Nothing was attempted: a budget ran out before attribution (see ``reason``)."""


class GateDecider(str, Enum):
    """Who decided a faithfulness-gate verdict."""

    RULE = "rule"
    """A cheap check: the expected next tool, a forbidden action, or the original action repeated."""
    LLM = "llm"
    """The LLM gate."""
    SKIPPED = "skipped"
    """No check ran: the gate is off, nothing was regenerated, or the LLM gate failed (see the reason)."""
    ACTION = "action"
    """An action replay: the adapter executed the correction itself as the regenerated step (checked to be so)."""


class InterventionKind(str, Enum):
    """How a correction reaches the replayed agent."""

    GUIDANCE = "guidance"
    """The paper's injected message: the plan in words, and the agent regenerates the step itself."""
    ACTION = "action"
    """A concrete step executed in place of the original one (a corrected call, a replacement thought)."""


REFUSED_TEXT_CHARS = 300
"""How much of a refused text a correction keeps (:attr:`Correction.refused_text`)."""


class Correction(BaseModel):
    """One correction REFLECT considered: where it came from, how it was applied, and what it replaced.

    ``source`` is ``llm`` (the auditor's diagnosis) or ``evidence:<rule>`` (computed from the trace, no LLM; see
    :mod:`reflect_otel.attribution.corrections`). An action replaces step ``step_index`` (the replay keeps steps before it);
    guidance is injected at the paper's rollback points around the localized step ``step_index`` (on a replay
    attempt, a guidance correction names the step that replay regenerated, and ``original`` is that step)."""

    model_config = _FROZEN

    source: str
    kind: InterventionKind
    step_index: int = Field(ge=1)
    original: StepAction | None = Field(default=None, description="What the replaced step did.")
    replacement: StepAction | None = Field(default=None, description="The action executed instead (action only).")
    finding: str = Field(default="", description="What in the trace the correction came from.")
    refused: str | None = Field(default=None, description="Why it was never tried (it would prove nothing).")
    refused_text: str = Field(
        default="",
        description=(
            "The start of the text the leak guard refused to give the agent (guidance, a memory), so that a refusal "
            "can be checked; a refused action is its replacement."
        ),
    )
    flipped: bool = False
    replays: int = 0

    @field_validator("refused_text", mode="before")
    @classmethod
    def _bounded(cls, value: object) -> object:
        return value[:REFUSED_TEXT_CHARS] if isinstance(value, str) else value

    @property
    def key(self) -> tuple[object, ...]:
        """Two corrections with the same key are the same test (deduplication)."""
        replacement = self.replacement.key() if self.replacement else None
        return (self.kind, self.step_index if self.kind is InterventionKind.ACTION else None, replacement)


class Localization(BaseModel):
    model_config = _FROZEN

    step_index: int = Field(ge=1)
    confidence: float = Field(ge=0, le=1)
    reasoning: str = ""
    suggested_fix: str = ""


class Classification(BaseModel):
    model_config = _FROZEN

    error_type: ErrorType
    confidence: float = Field(ge=0, le=1)
    explanation: str = ""
    suggested_correction: str = ""


class RepairPlan(BaseModel):
    """The Diagnostician's plan: root cause, instruction, forbidden actions, expected next tool and arguments."""

    model_config = _FROZEN

    root_cause: str = ""
    correction_instruction: str = ""
    forbidden_actions: tuple[str, ...] = ()
    expected_next_tool: str | None = None
    """One of the agent's tools (:func:`reflect_otel.attribution.stages.known_tool`), or None."""
    written_next_tool: str | None = None
    """The expected next tool as the Diagnostician wrote it, when that is not the name of one of the agent's tools:
    ``expected_next_tool`` then holds the one tool it named the start of, or None (it named none, or several)."""
    expected_next_arguments: dict[str, str | int | float | bool] | None = None
    """The expected next tool's arguments, when the Diagnostician named them (beyond the paper's plan)."""
    confidence: float = Field(default=0.0, ge=0, le=1)
    corrected_step: StepAction | None = None
    """The erroneous step as the Diagnostician rewrote it: a call of one of the agent's tools, or a thought."""


class GateVerdict(BaseModel):
    model_config = _FROZEN

    is_faithful: bool
    violation_type: str | None = None
    violation_reason: str | None = None
    decided_by: GateDecider


class ReplayArm(str, Enum):
    """Which arm of a controlled test a replay belongs to."""

    INTERVENTION = "intervention"
    """The step replaced (an action) or regenerated with a correction in context."""
    CONTROL = "control"
    """The same prefix, replayed with no intervention at all: what the agent does from there on its own."""
    LOCALIZATION = "localization"
    """The localization test: the correction source that verified step p, applied at another step of the run."""
    SENSITIVITY = "sensitivity"
    """The same prefix with step p changed in text but not in effect (the original call re-serialised, the original
    thought under a step label), executed as every intervention is: whether any change of text there flips the run."""


class StepChange(str, Enum):
    """What a replacement executed at step p changed (:mod:`reflect_otel.attribution.effects` decides it)."""

    CHANGED = "changed"
    """Its effect differs from the original step's: a different result, or a thought of other content."""
    SAME_EFFECT = "same_effect"
    """Another text, the same effect: the call returned what the original returned (under the tool's
    normalisation), or the thought says what the original said."""
    SAME_STEP = "same_step"
    """The original step itself (its call, or its words)."""
    ANSWER_TURN = "answer_turn"
    """It replaces the run's answer turn: the agent only got more turns."""
    LATER_CALL = "later_call"
    """A call the run itself made at a later step, moved earlier."""
    NOT_EXECUTED = "not_executed"
    """The adapter's first regenerated step is not the replacement it was given."""
    ANSWERED = "answered"
    """The regenerated step is an answer given at once (guidance an adapter regenerates itself)."""

    @property
    def text(self) -> str:
        return _CHANGE_TEXT[self]


_CHANGE_TEXT = {
    StepChange.CHANGED: "the step's effect changed",
    StepChange.SAME_EFFECT: "the replacement produced what the original step produced (no change of effect)",
    StepChange.SAME_STEP: "the replacement is the original step",
    StepChange.ANSWER_TURN: "the replacement takes the place of the run's answer turn (any extra turn can flip a run)",
    StepChange.LATER_CALL: "the replacement is a call the run itself made at a later step, moved earlier",
    StepChange.NOT_EXECUTED: "the adapter did not execute the replacement as given",
    StepChange.ANSWERED: "the regenerated step answers at once (an answer flips a run from anywhere)",
}


class Obstacle(str, Enum):
    """Why a flip was not credited to the step (a not-attributable record says which)."""

    CONTROL_FLIPPED = "control_flipped"
    """The control from the same prefix, with no intervention, answered right too."""
    CONTROL_UNREPRODUCED = "control_unreproduced"
    """The control did not give the run's own answer, and the budget left no room for the controls that would
    check the flip."""
    SENSITIVE = "sensitive"
    """The sensitivity arm (step p changed in text, not in effect) flipped too: the point is chaotic."""
    SENSITIVITY_UNTESTED = "sensitivity_untested"
    """No sensitivity arm could run there (no text-only variant of the step, or no budget for it)."""
    NO_CHANGE_OF_EFFECT = "no_change_of_effect"
    """The flipping replacement did not change the step's effect (see :class:`StepChange`)."""
    NOT_FAITHFUL = "not_faithful"
    """The flipping step did not follow the plan, as the faithfulness gate judged it."""
    SAMPLED_NOT_SIGNIFICANT = "sampled_not_significant"
    """Sampled arms: the intervention did not flip significantly more often than the control."""


class ReplayAttempt(BaseModel):
    """One replay: where, with what, whether the replaced step followed the plan, and the outcome."""

    model_config = _FROZEN

    round: int
    rollback_point: int = Field(description="Original steps 1..rollback_point were kept; the replay resumed after.")
    arm: ReplayArm = ReplayArm.INTERVENTION
    gate_retry: int = Field(default=0, description="0 for the first try; n for the n-th hard-gate retry.")
    sample: int = Field(default=0, description="Which of the repeated continuations at this point (0-based).")
    localized_step: int | None = Field(default=None, description="The step localized in this round.")
    injection: str
    correction: Correction | None = Field(default=None, description="The correction this replay tested.")
    gate: GateVerdict | None = None
    changed_step: bool | None = Field(
        default=None,
        description="Whether the replay's step rollback_point+1 differs from the original one (None for a control).",
    )
    change: StepChange | None = Field(
        default=None,
        description="What the replay's step rollback_point+1 changed (None for a control): only 'changed' can verify.",
    )
    verdict: Verdict | None = None
    flipped: bool = False
    reproduced: bool | None = Field(
        default=None,
        description="A control only: whether it gave the original run's answer (under the judge's normalisation).",
    )
    final_answer: str | None = None
    prefix_verified: bool | None = None
    continuation: tuple[Step, ...] = Field(default=(), description="The regenerated steps after the rollback point.")
    adapter_info: dict[str, str] = Field(default_factory=dict)
    error: str | None = None


class EffectArm(BaseModel):
    """One arm of a controlled test: how many replays ran to an answer, how many flipped the outcome to correct (for
    the intervention, only replays that changed the step as intended count), the answers they gave, and the Wilson
    95% interval ``[low, high]`` of the flip rate."""

    model_config = _FROZEN

    replays: int = Field(ge=0)
    flips: int = Field(ge=0)
    answers: tuple[str | None, ...] = ()
    low: float = Field(ge=0, le=1)
    high: float = Field(ge=0, le=1)

    @property
    def rate(self) -> float | None:
        return self.flips / self.replays if self.replays else None

    def text(self) -> str:
        return f"{self.flips} of {self.replays}"


class Effect(BaseModel):
    """The controlled test behind a record: the intervention at step ``step_index`` against the control from the
    same prefix (steps 1..``rollback_point`` kept) with the same sampling. ``rule`` is the decision rule applied,
    in words (:mod:`reflect_otel.attribution.controlled_replay` documents it)."""

    model_config = _FROZEN

    step_index: int = Field(ge=1)
    rollback_point: int = Field(ge=0)
    intervention: EffectArm
    control: EffectArm
    deterministic: bool = Field(description="The adapter runs continuations greedily: one replay per arm decides.")
    p_value: float | None = Field(
        default=None, description="One-sided Fisher exact test, intervention flips more than control (sampled arms)."
    )
    rule: str = ""
    sensitivity: EffectArm | None = Field(
        default=None,
        description="The sensitivity arm from the same prefix (step p changed in text, not in effect); None where "
        "none ran (see sensitivity_note).",
    )
    sensitivity_variant: StepAction | None = Field(default=None, description="The text-only variant it executed.")
    sensitivity_note: str = Field(default="", description="How the variant differs, or why there is none.")

    def text(self) -> str:
        """``intervention flipped k of n, control j of n[, sensitivity i of n]``, as the report and spans say it."""
        arms = f"intervention flipped {self.intervention.text()}, control {self.control.text()}"
        return arms + (f", sensitivity {self.sensitivity.text()}" if self.sensitivity is not None else "")


class Fidelity(BaseModel):
    """Whether replay works for this agent: of the control replays (no intervention) that ran to an answer, how
    many gave the original run's own answer (``reproduced``), and how many answered right with no intervention at
    all (``flipped``: from such a prefix nothing can be attributed)."""

    model_config = _FROZEN

    controls: int = Field(ge=0)
    reproduced: int = Field(ge=0)
    flipped: int = Field(default=0, ge=0)

    @property
    def rate(self) -> float | None:
        return self.reproduced / self.controls if self.controls else None

    def text(self) -> str:
        flipped = f"; {self.flipped} answered right with no intervention" if self.flipped else ""
        return f"replays of this agent reproduced its run {self.reproduced} of {self.controls} times{flipped}"


class LocalizationOutcome(str, Enum):
    """What the localization test of a decisive step found (see :class:`LocalizationTest`)."""

    LOCALIZED = "localized"
    """The same correction source, applied at another replaceable step, did not flip the run."""
    NOT_LOCALIZED = "not_localized"
    """It flipped the run there too (its control did not): the run turns on more than this step."""
    UNTESTED = "untested"
    """No test could be made (no other replaceable step, nothing from the source there, no budget, or its control
    flipped): the record says decisive, not localized."""


class LocalizationTest(BaseModel):
    """The test behind the claim "localized at step p": the correction source that proved step p decisive, applied
    at another replaceable step ``step_index`` of the run (one no round localized), replayed under control."""

    model_config = _FROZEN

    outcome: LocalizationOutcome
    step_index: int | None = Field(default=None, ge=1, description="The other step tested (None: none).")
    source: str = Field(default="", description="The correction source applied there.")
    reason: str = ""
    correction: Correction | None = None
    intervention: EffectArm | None = None
    control: EffectArm | None = None


class Intervention(BaseModel):
    """What flipped the run: the plan, the text injected (empty for an action) and the correction applied."""

    model_config = _FROZEN

    plan: RepairPlan
    injection: str
    rollback_point: int
    correction: Correction | None = None


class LLMCall(BaseModel):
    """One recorded call of a stage: which stage asked, what it cost, whether it succeeded. ``attempts`` is the
    number of model requests it made (2 when the reply needed the repair retry); the tokens are all of theirs."""

    model_config = _FROZEN

    stage: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int | None = None
    """Prompt tokens served from the endpoint's cache; None where it does not say."""
    seconds: float
    attempts: int
    ok: bool
    error: str | None = None


class StageCost(BaseModel):
    """What one stage's calls cost: ``calls`` of the stage, ``requests`` sent to the model for them (a repair retry
    is a request of its own), and their tokens and seconds."""

    model_config = _FROZEN

    stage: str
    calls: int
    requests: int = Field(ge=0)
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int | None = None
    seconds: float

    @model_validator(mode="before")
    @classmethod
    def _earlier_versions(cls, data: Any) -> Any:
        """A cost written before ``requests`` existed counted calls only: read as one request each (a record
        fills it in from its ``llm_calls``, which hold the attempts)."""
        if isinstance(data, dict) and "requests" not in data:
            data = {**data, "requests": data.get("calls", 0)}
        return data


class StageError(BaseModel):
    """A stage that failed; the record still carries the best result reached."""

    model_config = _FROZEN

    stage: str
    message: str
    round: int | None = None


class AttributionRecord(BaseModel):
    """The answer to "which step caused this failure", with its evidence."""

    model_config = _FROZEN

    trace_id: str
    method: str
    status: AttributionStatus
    reason: str = Field(default="", description="Why the record is unverified or skipped.")
    mode: AttributionMode
    step_index: int | None = None
    span_id: str | None = None
    error_type: ErrorType | None = None
    confidence: float | None = Field(
        default=None,
        description="Measured, or None: for a verified record, the share of its intervention's replays that "
        "flipped the outcome (of confidence_samples replays; see effect); never the auditor's own figure.",
    )
    confidence_samples: int | None = Field(default=None, description="How many replays the confidence counts.")
    auditor_confidence: float | None = Field(
        default=None,
        description="What the auditor said of its own localization: kept for analysis, never shown as confidence "
        "(a model's self-report is not a measured rate).",
    )
    explanation: str = ""
    root_cause: str = ""
    intervention: Intervention | None = None
    replays: tuple[ReplayAttempt, ...] = ()
    corrections: tuple[Correction, ...] = Field(
        default=(), description="Every correction considered, in the order tried; refused ones say why."
    )
    effect: Effect | None = Field(
        default=None,
        description="The controlled test that decided a verified or not-attributable record: the intervention's "
        "arm against the control's, from the same prefix.",
    )
    fidelity: Fidelity | None = Field(
        default=None, description="How often this record's control replays reproduced the run (None: none ran)."
    )
    obstacle: Obstacle | None = Field(
        default=None, description="A not-attributable record: why the flip was not credited to the step."
    )
    localization_test: LocalizationTest | None = Field(
        default=None,
        description="A verified record: the test of whether the same correction source flips the run at another "
        "step (the claim 'localized' rests on it).",
    )
    original_answer: str | None = None
    corrected_answer: str | None = None
    original_verdict: Verdict | None = None
    rounds: int = 0
    localizations: tuple[Localization, ...] = Field(default=(), description="Every localization, in order.")
    cost: tuple[StageCost, ...] = ()
    llm_calls: tuple[LLMCall, ...] = ()
    errors: tuple[StageError, ...] = ()
    config: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @model_validator(mode="before")
    @classmethod
    def _earlier_versions(cls, data: Any) -> Any:
        """Records written before ``auditor_confidence`` existed held the auditor's figure as ``confidence``;
        records written before controlled verification carried ``flip_rates`` (sample counts now in ``effect``)."""
        if not isinstance(data, dict):
            return data
        if "confidence" in data and "auditor_confidence" not in data:
            data = {**data, "confidence": None, "confidence_samples": None, "auditor_confidence": data["confidence"]}
        if "flip_rates" in data:
            data = {k: v for k, v in data.items() if k != "flip_rates"}
        cost = data.get("cost")
        if cost and any(isinstance(c, dict) and "requests" not in c for c in cost):
            data = {**data, "cost": _with_requests(cost, data.get("llm_calls") or ())}
        return data

    @model_validator(mode="after")
    def _measured_when_verified(self) -> AttributionRecord:
        """A verified record read without a measured confidence (an earlier version's) gets it from its effect."""
        if self.confidence is None and self.status is AttributionStatus.VERIFIED and self.effect is not None:
            object.__setattr__(self, "confidence", self.effect.intervention.rate)  # frozen: set once, validating
            object.__setattr__(self, "confidence_samples", self.effect.intervention.replays)
        return self

    @property
    def confidence_text(self) -> str:
        """How the record's confidence was obtained, for people: the controlled test with its counts, or why there
        is none."""
        if self.effect is not None:
            return f"{self.effect.text()} (measured)"
        if self.status is AttributionStatus.VERIFIED:
            return "not measured (a record from before controlled verification)"
        return "not measured (an unverified attribution is the auditor's hypothesis)"

    @property
    def claim(self) -> str | None:
        """What a verified record claims: ``localized`` (decisive, and the same correction source applied at another
        step did not flip the run), else ``decisive`` (the step decides the run under replay; whether the error is
        there alone was not shown). None for a record that is not verified."""
        if self.status is not AttributionStatus.VERIFIED:
            return None
        test = self.localization_test
        return "localized" if test is not None and test.outcome is LocalizationOutcome.LOCALIZED else "decisive"

    @property
    def verified_by(self) -> Correction | None:
        """The correction whose replay verified the attribution, if any."""
        if self.status is not AttributionStatus.VERIFIED or self.intervention is None:
            return None
        return self.intervention.correction

    def with_calls(self, *, before: Sequence[LLMCall] = (), after: Sequence[LLMCall] = ()) -> AttributionRecord:
        """This record with calls made for it outside the method, counted in ``llm_calls`` and ``cost`` like the
        method's own: ``before`` it started (the triage verdict's), and ``after`` its own (the replayed agent's on
        the attributor's model, which the method cannot see)."""
        if not before and not after:
            return self
        merged = (*before, *self.llm_calls, *after)
        return self.model_copy(update={"llm_calls": merged, "cost": stage_costs(merged)})

    @property
    def total_tokens(self) -> int:
        return sum(c.prompt_tokens + c.completion_tokens for c in self.cost)

    @property
    def total_calls(self) -> int:
        """Model requests made for this record, the auditor's and the agent's: each request once (a stage call
        whose reply needed the repair retry made two)."""
        return sum(c.requests for c in self.cost)

    @property
    def auditor_cost(self) -> tuple[StageCost, ...]:
        """The cost of the attributor's own calls: every stage but the replayed agent's."""
        return tuple(c for c in self.cost if c.stage != AGENT_REPLAY_STAGE)

    @property
    def auditor_calls(self) -> int:
        """The auditor's model requests (its stages' calls, each repair retry counted as a request)."""
        return sum(c.requests for c in self.auditor_cost)

    @property
    def agent_calls(self) -> int:
        """The agent's model requests recorded for this record (its replays and proposals, where recorded)."""
        cost = self.agent_replay_cost
        return cost.requests if cost is not None else 0

    @property
    def auditor_tokens(self) -> int:
        return sum(c.prompt_tokens + c.completion_tokens for c in self.auditor_cost)

    @property
    def agent_replay_cost(self) -> StageCost | None:
        """What the replayed agent spent on the attributor's model, when it ran there."""
        return next((c for c in self.cost if c.stage == AGENT_REPLAY_STAGE), None)

    @property
    def annotator_kind(self) -> str:
        """Who made the judgement, as Phoenix and OpenInference annotations name it: ``LLM`` when the method asked
        a model, ``CODE`` when it made no model call of its own (the position floors, a rule; a replay it ran does
        not judge)."""
        return "LLM" if self.auditor_cost else "CODE"

    @property
    def failed(self) -> bool:
        """No attribution because stages failed (see ``errors``): not a measurement of the method, and never scored
        as one."""
        return self.step_index is None and bool(self.errors) and self.status is not AttributionStatus.SKIPPED


def _known_sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _with_requests(cost: Sequence[Any], calls: Sequence[Any]) -> list[Any]:
    """An earlier version's ``cost`` with each stage's requests, from its ``llm_calls``' attempts (each call one
    request where there are none: a record stored without its calls)."""
    attempts: dict[str, int] = defaultdict(int)
    for call in calls:
        stage = call.get("stage") if isinstance(call, dict) else getattr(call, "stage", None)
        tries = call.get("attempts", 1) if isinstance(call, dict) else getattr(call, "attempts", 1)
        if isinstance(stage, str):
            attempts[stage] += tries if isinstance(tries, int) and tries >= 1 else 1
    return [
        {**c, "requests": attempts.get(str(c.get("stage")), c.get("calls", 0)) if calls else c.get("calls", 0)}
        if isinstance(c, dict) and "requests" not in c
        else c
        for c in cost
    ]


def stage_costs(calls: Sequence[LLMCall]) -> tuple[StageCost, ...]:
    """The cost of ``calls`` per stage, in the order the stages were first met; ``requests`` counts their
    attempts (each a model request)."""
    grouped: dict[str, list[LLMCall]] = defaultdict(list)
    for call in calls:
        grouped[call.stage].append(call)
    return tuple(
        StageCost(
            stage=stage,
            calls=len(items),
            requests=sum(c.attempts for c in items),
            prompt_tokens=sum(c.prompt_tokens for c in items),
            completion_tokens=sum(c.completion_tokens for c in items),
            cached_prompt_tokens=_known_sum(c.cached_prompt_tokens for c in items),
            seconds=round(sum(c.seconds for c in items), 6),
        )
        for stage, items in grouped.items()
    )
