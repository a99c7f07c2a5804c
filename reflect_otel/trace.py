"""The trace model every stage works on: :class:`StructuredTrace`, an ordered list of :class:`Step`.

Values are frozen pydantic models with a stable JSON form (``model_dump_json`` / ``model_validate_json``), so a
trace captured by a collector today can be attributed tomorrow by another process.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

__all__ = [
    "EXPECTED_ANSWER_FIELD",
    "ErrorLabel",
    "ReplayMetadata",
    "Step",
    "StepAction",
    "StepKind",
    "StepStatus",
    "StructuredTrace",
    "ToolDefinition",
    "TraceSource",
    "TraceWarning",
    "WarningCode",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_BOOL: TypeAdapter[bool] = TypeAdapter(bool)

EXPECTED_ANSWER_FIELD = "expected_answer"
"""The key of a run's expected answer: in a trace's metadata, and the extra field ``import`` writes beside a trace
in a trace file for datasets that know the correct answer."""


class StepKind(str, Enum):
    """What a step did."""

    TOOL_CALL = "tool_call"
    """The model asked for a tool (or code called one); the step carries its arguments and result."""
    REASONING = "reasoning"
    """Model text with no action: a thought, a plan, a chain-of-thought step, or a code agent's code."""
    MESSAGE = "message"
    """A message passed between agents or to the user that is not the final answer. Among them an agent's answer
    handed back by a call (a sub-agent's ``final_answer`` to its manager, known by how the agent ended, not by the
    tool's name: see :func:`reflect_otel.reading.assembly.steps.mark_handed_back`): it keeps the call's tool, arguments and
    result, but it is no lookup, and evidence checks and correction rules, which read tool calls, leave it alone."""
    FINAL_ANSWER = "final_answer"
    """The step that produced the run's answer."""


class StepStatus(str, Enum):
    """The OTel status of the span(s) behind a step."""

    UNSET = "unset"
    OK = "ok"
    ERROR = "error"


class Step(BaseModel):
    """One decision of the agent, with what it did and what came back.

    ``span_id`` is the span that *decided* the step (the LLM span, or the TOOL span for a tool invoked from code);
    ``tool_span_id`` is the TOOL span that executed it. A label on either maps to this step.

    A step is the run's answer when ``is_final_answer`` is set, which is exactly when ``kind`` is
    ``FINAL_ANSWER``: either one given makes both so (a trace from a file may set only one). Readers test
    ``is_final_answer``.
    """

    model_config = _FROZEN

    index: int = Field(ge=1, description="1-based position in the trace.")
    span_id: str = Field(description="Hex id of the span that decided this step.")
    kind: StepKind
    agent: str | None = Field(default=None, description="Name of the agent that took the step.")
    reasoning: str = Field(default="", description="Model text that led to the action.")
    tool_name: str | None = None
    tool_args: dict[str, Any] = Field(default_factory=dict)
    tool_result: str | None = None
    tool_result_raw: str | None = Field(
        default=None,
        description="The result as recorded, when tool_result was taken out of a wrapper (a function response, a "
        "tool_result block, {'result': ...}); cut short like every text.",
    )
    tool_call_id: str | None = None
    tool_span_id: str | None = Field(default=None, description="Hex id of the TOOL span that executed the call.")
    is_final_answer: bool = False
    start_time_ns: int | None = None
    end_time_ns: int | None = None
    status: StepStatus = StepStatus.UNSET
    status_message: str | None = None
    prompt_tokens: int | None = Field(default=None, description="Counted once per LLM call, on its first step.")
    completion_tokens: int | None = None
    model_name: str | None = None
    model_input: str | None = Field(
        default=None,
        description="The raw request of the LLM call that decided this step (its input.value); replay uses it.",
    )
    logprob: float | None = Field(
        default=None,
        le=0,
        description="The mean log-probability of the tokens the LLM call wrote, where its endpoint returned them "
        "(the recorded response's logprobs); the flagging score may weigh the answer turn's.",
    )
    langgraph_step: int | None = Field(default=None, description="LangGraph superstep that executed the step.")
    langgraph_node: str | None = None

    @property
    def span_ids(self) -> tuple[str, ...]:
        """Every span id that denotes this step."""
        return (self.span_id,) if self.tool_span_id is None else (self.span_id, self.tool_span_id)

    @model_validator(mode="before")
    @classmethod
    def _one_final_answer(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        try:
            flagged = _BOOL.validate_python(data.get("is_final_answer", False))
        except ValidationError:
            return data  # the field's own validation names the error
        if flagged or data.get("kind") == StepKind.FINAL_ANSWER:
            return {**data, "kind": StepKind.FINAL_ANSWER, "is_final_answer": True}
        return data


class ToolDefinition(BaseModel):
    """A tool the agent had, as its instrumentation recorded it (OpenInference ``llm.tools``, OTel GenAI
    ``gen_ai.tool.definitions``, or the ``tools`` of a recorded model request); or, when none was recorded, a tool
    seen called on the trace (``recorded`` False, its schema read from the arguments it was called with)."""

    model_config = _FROZEN

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    parameters: dict[str, Any] = Field(
        default_factory=dict, description="The JSON schema of the tool's arguments (an object schema)."
    )
    recorded: bool = Field(default=True, description="False when inferred from calls seen on the trace.")


class StepAction(BaseModel):
    """A concrete step to take in place of an original one: a call of one of the agent's tools with its arguments,
    or, for a chain of thought (``tool_name`` None), a replacement thought in ``text``."""

    model_config = _FROZEN

    tool_name: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    text: str = ""

    @classmethod
    def of_step(cls, step: Step) -> StepAction:
        """What ``step`` did, as an action."""
        if step.tool_name:
            return cls(tool_name=step.tool_name, arguments=dict(step.tool_args))
        return cls(text=step.reasoning)

    def render(self) -> str:
        """``tool({"arg": value})``, or the thought."""
        if self.tool_name is None:
            return self.text
        return f"{self.tool_name}({json.dumps(self.arguments, ensure_ascii=False, sort_keys=True, default=str)})"

    def key(self) -> str:
        """What the action does, for telling two apart: its rendering without null arguments, at any depth
        (``limit=None`` is the tool's default, as an argument left out is), with whole floats as integers (``1.0``
        recorded for ``1``), and without the surrounding whitespace of a thought."""
        if self.tool_name is None:
            return self.text.strip()
        given = json.dumps(_canonical(self.arguments), ensure_ascii=False, sort_keys=True, default=str)
        return f"{self.tool_name}({given})"

    def same_as(self, other: StepAction) -> bool:
        """Whether the two do the same (:meth:`key`): a replacement differing only by a null argument changes
        nothing."""
        return self.key() == other.key()


def _canonical(value: Any) -> Any:
    """``value`` with null object members left out and whole floats as integers (see :meth:`StepAction.key`)."""
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class TraceSource(BaseModel):
    """Where a trace came from."""

    model_config = _FROZEN

    framework: str = Field(default="unknown", description="langgraph, langchain, openai, smolagents, ... or unknown.")
    instrumentation: tuple[str, ...] = Field(default=(), description="Instrumentation scope names seen.")
    collector: str = Field(default="unknown", description="span_processor, otlp, file, trail or builder.")
    service: str | None = Field(
        default=None, description="The root span's resource service.name: which replay endpoint serves the agent."
    )


class ReplayMetadata(BaseModel):
    """What a replay adapter needs to find the run again (per-step details live on :class:`Step`)."""

    model_config = _FROZEN

    thread_id: str | None = Field(default=None, description="LangGraph checkpointer thread of the run.")
    checkpoint_ns: str | None = Field(default=None, description="Checkpoint namespace of the traced graph.")


class WarningCode(str, Enum):
    """Machine-readable reasons a trace may be incomplete or unreliable."""

    DROPPED_ATTRIBUTES = "dropped_attributes"
    MESSAGE_INDEX_GAP = "message_index_gap"
    ORPHAN_SPANS = "orphan_spans"
    DUPLICATE_SPANS = "duplicate_spans"
    DROPPED_SPANS = "dropped_spans"
    ROOT_NEVER_ENDED = "root_never_ended"
    UNPARSEABLE_VALUE = "unparseable_value"
    UNMAPPED_LABELS = "unmapped_labels"
    NO_STEPS = "no_steps"
    NO_QUESTION = "no_question"
    NO_MESSAGE_CONTENT = "no_message_content"
    NO_MODEL_CALLS = "no_model_calls"
    SECRETS_REDACTED = "secrets_redacted"


class TraceWarning(BaseModel):
    """A problem found while rebuilding the trace; ``message`` says how to fix it at the source."""

    model_config = _FROZEN

    code: WarningCode
    message: str
    span_id: str | None = None


class ErrorLabel(BaseModel):
    """A human annotation of an error, as shipped with public datasets (TRAIL, BIG-Bench Mistake, Who&When)."""

    model_config = _FROZEN

    step_index: int | None = Field(description="The step the label maps to, or None when it maps to no step.")
    span_id: str | None = None
    category: str | None = None
    impact: str | None = None
    description: str | None = None
    evidence: str | None = None


class StructuredTrace(BaseModel):
    """A completed agent run, rebuilt from its spans into ordered steps."""

    model_config = _FROZEN

    trace_id: str
    session_id: str | None = None
    agent: str | None = Field(default=None, description="The agent that ran: the root AGENT span's agent.name or name.")
    root_span_id: str | None = None
    question: str = Field(default="", description="The task input.")
    final_answer: str | None = None
    steps: tuple[Step, ...] = ()
    source: TraceSource = Field(default_factory=TraceSource)
    replay: ReplayMetadata = Field(default_factory=ReplayMetadata)
    warnings: tuple[TraceWarning, ...] = ()
    labels: tuple[ErrorLabel, ...] = Field(default=(), description="Human error labels, when imported with any.")
    start_time_ns: int | None = None
    end_time_ns: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict, description="From the importer: dataset, task, ...")
    tools: tuple[ToolDefinition, ...] = Field(
        default=(), description="The tools the agent had, as recorded by its instrumentation (see ToolDefinition)."
    )

    @field_validator("steps")
    @classmethod
    def _indexes_are_positions(cls, steps: tuple[Step, ...]) -> tuple[Step, ...]:
        for position, step in enumerate(steps, start=1):
            if step.index != position:
                raise ValueError(f"step at position {position} has index {step.index}; indexes must be 1..n in order")
        return steps

    def step_for_span(self, span_id: str) -> Step | None:
        """The first step that ``span_id`` denotes (as deciding LLM span or executing TOOL span), if any."""
        for step in self.steps:
            if span_id in step.span_ids:
                return step
        return None
