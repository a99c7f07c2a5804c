"""Attribute names, in one place.

OpenInference's names are re-exported from ``openinference.semconv.trace`` so the rest of the code never spells
them as string literals; ours live in :class:`ReflectAttributes`. Indexed attributes such as
``llm.output_messages.0.message.tool_calls.1.tool_call.id`` are built from the prefixes below. Spans by the OTel
GenAI conventions are translated to these names in :mod:`reflect_otel.reading.genai`, which says which version it follows.
"""

from __future__ import annotations

from openinference.semconv.trace import (
    AnnotationAttributes,
    MessageAttributes,
    MessageContentAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
    ToolAttributes,
    ToolCallAttributes,
)

__all__ = [
    "INPUT_MESSAGES_PREFIX",
    "OPENAI_AGENTS_SCOPE",
    "OUTPUT_MESSAGES_PREFIX",
    "AnnotationAttributes",
    "GenAIEvaluation",
    "LangGraphMetadataKeys",
    "MessageAttributes",
    "MessageContentAttributes",
    "OpenInferenceSpanKindValues",
    "PydanticAIAttributes",
    "ReflectAttributes",
    "ReflectMetrics",
    "SpanAttributes",
    "ToolAttributes",
    "ToolCallAttributes",
    "VercelAIAttributes",
]

INPUT_MESSAGES_PREFIX = SpanAttributes.LLM_INPUT_MESSAGES + "."
"""``llm.input_messages.`` followed by ``N.message.*``."""

OUTPUT_MESSAGES_PREFIX = SpanAttributes.LLM_OUTPUT_MESSAGES + "."
"""``llm.output_messages.`` followed by ``N.message.*``."""

OPENAI_AGENTS_SCOPE = "openinference.instrumentation.openai_agents"
"""The instrumentation scope of OpenInference's OpenAI Agents SDK instrumentation: a run it recorded that ended on a
tool's result without an error stopped there by the agent's ``tool_use_behavior`` (:mod:`reflect_otel.reading.assembly`)."""


class LangGraphMetadataKeys:
    """Keys LangGraph writes into the JSON of the OpenInference ``metadata`` attribute."""

    THREAD_ID = "thread_id"
    """The checkpointer thread the run belongs to; needed to fork its checkpoints on replay."""
    STEP = "langgraph_step"
    """The superstep number; equals ``metadata["step"]`` of the checkpoint written after that superstep."""
    NODE = "langgraph_node"
    """The graph node that ran the span."""
    CHECKPOINT_NS = "langgraph_checkpoint_ns"
    """The checkpoint namespace; non-empty segments before ``:`` name enclosing subgraph nodes."""


class VercelAIAttributes:
    """The ``ai.*`` attributes the Vercel AI SDK writes with ``experimental_telemetry`` (read in
    :mod:`reflect_otel.reading.vercel_ai`; v4 to v6 names, the older beside the newer)."""

    OPERATION_ID = "ai.operationId"
    """``ai.generateText``, ``ai.generateText.doGenerate``, ``ai.toolCall``, ...: what the span is."""
    FUNCTION_ID = "ai.telemetry.functionId"
    """The name the application gave the call (``experimental_telemetry.functionId``)."""
    MODEL_ID = "ai.model.id"
    PROMPT = "ai.prompt"
    """The call's prompt as given: JSON ``{"system", "prompt"}`` or ``{"system", "messages"}``."""
    PROMPT_MESSAGES = "ai.prompt.messages"
    """A model call's messages, JSON, in the SDK's provider-neutral prompt format."""
    PROMPT_TOOLS = "ai.prompt.tools"
    """The tools offered, each a JSON text."""
    RESPONSE_TEXT = "ai.response.text"
    RESPONSE_REASONING = "ai.response.reasoning"
    RESPONSE_OBJECT = "ai.response.object"
    RESPONSE_TOOL_CALLS = "ai.response.toolCalls"
    """JSON list of ``{toolCallId, toolName, input}`` (``args`` before v5)."""
    RESPONSE_MODEL = "ai.response.model"
    USAGE_INPUT_TOKENS = ("ai.usage.inputTokens", "ai.usage.promptTokens")
    USAGE_OUTPUT_TOKENS = ("ai.usage.outputTokens", "ai.usage.completionTokens")
    TOOL_CALL_NAME = "ai.toolCall.name"
    TOOL_CALL_ID = "ai.toolCall.id"
    TOOL_CALL_ARGS = ("ai.toolCall.args", "ai.toolCall.input")
    TOOL_CALL_RESULT = ("ai.toolCall.result", "ai.toolCall.output")


class PydanticAIAttributes:
    """Attributes pydantic-ai's own instrumentation writes beside the GenAI ones (read in
    :mod:`reflect_otel.reading.tool_definitions`)."""

    MODEL_REQUEST_PARAMETERS = "model_request_parameters"
    """A model call's request parameters, JSON: ``function_tools`` and ``output_tools``, each definition with its
    ``kind`` (``function``, or ``output``: a tool whose arguments are the run's output and whose call ends it)."""


class ReflectAttributes:
    """Attributes reflect-otel writes on the spans it emits, and the one it reads from an agent's spans."""

    EXPECTED_ANSWER = "reflect.expected_answer"
    """Set by an agent (or a canary, or a test) on its run's root span: the answer the run should give. A run that
    carries it is judged against it instead of by the proxy verifier. Read, never written, by reflect-otel."""

    ERROR_STEP_INDEX = "reflect.attribution.step_index"
    """1-based index of the decisive error step in the trace's ``StructuredTrace``."""
    ERROR_SPAN_ID = "reflect.attribution.span_id"
    """Hex span id of the LLM span that decided the decisive step."""
    ERROR_TYPE = "reflect.attribution.error_type"
    """Error category of the decisive step (the paper's 11-category taxonomy)."""
    STATUS = "reflect.attribution.status"
    """``verified`` when a targeted replay flipped the outcome, else ``unverified``."""
    ROLLBACK_POINT = "reflect.attribution.rollback_point"
    """How many original steps the replay that flipped the outcome kept (it regenerated the next one, the decisive
    step)."""
    CONFIDENCE = "reflect.attribution.confidence"
    """Measured only, in ``[0, 1]``: for a verified attribution, the share of the replays from its rollback point
    that flipped the outcome; absent otherwise (never the auditor's self-report)."""
    CONFIDENCE_SAMPLES = "reflect.attribution.confidence_samples"
    """How many replays ``reflect.attribution.confidence`` counts."""
    TRACE_ID = "reflect.attribution.trace_id"
    """Hex id of the attributed trace (the evaluator span is in it, as a child of the decisive span)."""
    METHOD = "reflect.attribution.method"
    """reflect, or the baseline that produced the record."""
    MODE = "reflect.attribution.mode"
    """replay, or localization_only."""
    CORRECTED_ANSWER = "reflect.attribution.corrected_answer"
    """The answer of the replay that flipped the outcome."""
    VERIFIED_BY_SOURCE = "reflect.attribution.verified_by.source"
    """Where the correction that verified the attribution came from: ``llm`` or ``evidence:<rule>``."""
    VERIFIED_BY_KIND = "reflect.attribution.verified_by.kind"
    """How it was applied: ``action`` (executed in place of the step) or ``guidance`` (injected text)."""
    REPLACEMENT_CALL = "reflect.attribution.replacement_call"
    """The call executed in place of the decisive step by the verifying action replay (``tool({...})``)."""
    EFFECT = "reflect.attribution.effect"
    """The controlled test in words: ``intervention flipped k of n, control j of n``."""
    EFFECT_INTERVENTION_FLIPS = "reflect.attribution.effect.intervention.flips"
    """Replays of the intervention that flipped the outcome to correct."""
    EFFECT_INTERVENTION_REPLAYS = "reflect.attribution.effect.intervention.replays"
    """Replays of the intervention that ran to an answer."""
    EFFECT_CONTROL_FLIPS = "reflect.attribution.effect.control.flips"
    """Control replays (same prefix, no intervention) that flipped the outcome."""
    EFFECT_CONTROL_REPLAYS = "reflect.attribution.effect.control.replays"
    """Control replays that ran to an answer."""
    FIDELITY_CONTROLS = "reflect.attribution.fidelity.controls"
    """Control replays of this attribution that ran to an answer."""
    FIDELITY_REPRODUCED = "reflect.attribution.fidelity.reproduced"
    """Of those, how many reproduced the run's original answer (replay fidelity)."""
    EFFECT_SENSITIVITY_FLIPS = "reflect.attribution.effect.sensitivity.flips"
    """Sensitivity replays (the step changed in text, not in effect, from the same prefix) that flipped the outcome."""
    EFFECT_SENSITIVITY_REPLAYS = "reflect.attribution.effect.sensitivity.replays"
    """Sensitivity replays that ran to an answer."""
    CLAIM = "reflect.attribution.claim"
    """What a verified record claims: ``localized`` (the same correction source at another step did not flip the
    run) or ``decisive`` (the step decides the run under replay; whether the error is there alone was not shown)."""
    LOCALIZATION_TEST = "reflect.attribution.localization_test"
    """The localization test's outcome: ``localized``, ``not_localized`` or ``untested``."""
    OBSTACLE = "reflect.attribution.obstacle"
    """A not-attributable record: why its flip was not credited (``sensitive``, ``control_flipped``,
    ``no_change_of_effect``, ...)."""
    EVALUATION_ANNOTATOR_KIND = "reflect.evaluation.annotator_kind"
    """On a ``gen_ai.evaluation.result`` record: who judged, as Phoenix and OpenInference name it (``LLM`` when a
    model was asked, ``CODE`` otherwise)."""
    VERDICT_VERIFIER = "reflect.verdict.verifier"
    """On a run's ``gen_ai.evaluation.result`` record: the verifier that judged its answer (``oracle``, ``self``,
    ``consistency``, ...)."""
    VERDICT_BASIS = "reflect.verdict.basis"
    """What a verdict without an expected answer rests on (the combined verifier's deciding check)."""
    REPLAY = "reflect.replay"
    """True on the root span of a replay run that reflect-otel made: our collectors skip such traces (they are
    evidence inside an attribution record, not runs of the application), and other backends can filter on it."""


class GenAIEvaluation:
    """The OTel GenAI semantic conventions' evaluation event (open-telemetry/semantic-conventions-genai,
    ``model/gen-ai/events.yaml``): a log record named :attr:`EVENT`, parented to the evaluated span."""

    EVENT = "gen_ai.evaluation.result"
    NAME = "gen_ai.evaluation.name"
    """Required: the name of the evaluation metric."""
    SCORE_VALUE = "gen_ai.evaluation.score.value"
    """Conditionally required (if applicable): the score, a double."""
    SCORE_LABEL = "gen_ai.evaluation.score.label"
    """Conditionally required (if applicable): a low-cardinality reading of the score."""
    EXPLANATION = "gen_ai.evaluation.explanation"
    """Recommended: the evaluator's free-form explanation."""
    RESPONSE_ID = "gen_ai.response.id"
    """Recommended when available: the evaluated completion's id, for a record with no span to parent it to."""
    ERROR_TYPE = "error.type"
    """Conditionally required if the evaluation ended in an error: the class of the error."""


class ReflectMetrics:
    """Metric names; the Grafana dashboard's Prometheus queries use them with ``_total`` appended."""

    TRACES_SEEN = "reflect.traces.seen"
    TRACES_FLAGGED = "reflect.traces.flagged"
    TRACES_UNCERTAIN = "reflect.traces.uncertain"
    """Runs the verifier could not judge (UNCERTAIN): attributed only with ``attribute_uncertain``."""
    TRACES_ATTRIBUTED = "reflect.traces.attributed"
    TRACES_VERIFIED = "reflect.traces.verified"
    ATTRIBUTIONS_BY_ERROR_TYPE = "reflect.attributions"
    """Counter with an ``error_type`` attribute."""
    LLM_TOKENS = "reflect.llm.tokens"
    """Counter with ``stage`` and ``direction`` (prompt or completion) attributes."""
    LLM_REQUESTS = "reflect.llm.requests"
    """Counter of model requests with a ``stage`` attribute: each request once (a repair retry is one;
    ``agent_replay`` is the agent's)."""
    EXPORT_FAILURES = "reflect.export.failures"
    """Counter of record exports that failed, with an ``exporter`` attribute (``store`` for the store)."""
