"""What the replays of hand-written tool loops (OpenAI, Anthropic) share: the recorded request after a rollback
point, the request the continuation actually sent, content comparison, an action run for real under a TOOL span, and
resampling (``resample``, from :class:`~reflect_otel.replay_adapters._base.ReplayAdapterBase`) when the user's ``resume`` takes a ``temperature`` keyword."""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypedDict, TypeVar, Unpack

from opentelemetry.sdk.trace import TracerProvider

from reflect_otel import _values
from reflect_otel.errors import ReplayError
from reflect_otel.reading.capture import captured
from reflect_otel.reading.semconv import OpenInferenceSpanKindValues, SpanAttributes, ToolCallAttributes
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.replay import ReplayRequest, ReplayResult, check_rollback_point
from reflect_otel.replay_adapters._base import ReplayAdapterBase, with_options
from reflect_otel.replay_adapters._guard import IrreversibleToolError, ToolGuard
from reflect_otel.replay_adapters._stitch import stitch
from reflect_otel.trace import StepAction, StructuredTrace

ExecuteTool = Callable[[str, dict[str, Any]], Any]
"""``execute_tool(name, arguments) -> result``: run one of the loop's tools (its result is sent as text)."""

Resume = TypeVar("Resume")


@dataclass(frozen=True)
class ToolLoopOptions:
    """How a tool loop's adapter replays it: the tools never run again (``irreversible_tools``, unless
    ``allow_irreversible``), the loop's tool executor for actions and previews (``execute_tool``), whether it replays
    greedily (``deterministic``; None: see :attr:`ToolLoopReplay.deterministic`), and the tools that read fixed data
    (``pure_tools``, :class:`~reflect_otel.replay.HasPureTools`)."""

    irreversible_tools: Collection[str] = ()
    allow_irreversible: bool = False
    execute_tool: ExecuteTool | None = None
    deterministic: bool | None = None
    pure_tools: Collection[str] = ()


class ToolLoopOptionKeywords(TypedDict, total=False):
    """:class:`ToolLoopOptions`' fields as constructor keywords, so a type checker names a misspelt one."""

    irreversible_tools: Collection[str]
    allow_irreversible: bool
    execute_tool: ExecuteTool | None
    deterministic: bool | None
    pure_tools: Collection[str]


class ToolLoopReplay(ReplayAdapterBase, Generic[Resume]):
    """What a hand-written loop's adapter holds (the user's ``resume``, the provider the instrumentation was
    installed with, the tool guard, the optional tool executor) and how its replay starts. ``options`` is a
    :class:`ToolLoopOptions`; keywords name single options and take precedence
    (``resume, tracer_provider=p, execute_tool=run``)."""

    loop_name: ClassVar[str]
    """The API in messages: "an action replay of an {loop_name} tool loop ..."."""
    request_api: ClassVar[str]
    """The recorded request's API, for :func:`recorded_request`."""

    def __init__(
        self,
        resume: Resume,
        *,
        tracer_provider: TracerProvider,
        options: ToolLoopOptions | None = None,
        **option: Unpack[ToolLoopOptionKeywords],
    ) -> None:
        chosen = with_options(options or ToolLoopOptions(), option)
        self._deterministic = chosen.deterministic
        self.pure_tools = frozenset(chosen.pure_tools)
        """The loop's tools that read fixed data (:class:`~reflect_otel.replay.HasPureTools`): a repeat of one's call
        the prefix made is refused, and a replacement calling one is previewed with ``execute_tool``
        (:meth:`preview`)."""
        self._resume = resume
        self._provider = tracer_provider
        self._guard = ToolGuard(chosen.irreversible_tools, allow=chosen.allow_irreversible)
        self._execute_tool = chosen.execute_tool

    @property
    def deterministic(self) -> bool:
        """Whether the loop replays greedily, one replay per arm deciding a test: as the caller said (True when the
        loop's model runs at temperature 0 on an endpoint that repeats itself), else without a run to look at, only
        when the adapter makes its replays greedy itself (:attr:`greedy`). :meth:`deterministic_for` says it of a
        run."""
        return self._deterministic if self._deterministic is not None else self.greedy

    @property
    def greedy(self) -> bool:
        """Whether the adapter runs its replays greedily itself: nobody said whether the loop is deterministic, its
        model is on the embedded server (which decodes a request at temperature 0 greedily, one at a time, its reply
        independent of its cache), and ``resume`` takes a ``temperature`` keyword, so each replay is resumed at 0."""
        return self._deterministic is None and self._repeats_itself() and self.resamples

    def deterministic_for(self, trace: StructuredTrace) -> bool:
        """Whether replays of ``trace`` are greedy: as the caller said; else when the adapter makes them greedy
        (:attr:`greedy`), or when the loop's model is on the embedded server and every model request the run
        recorded asked for temperature 0 (a replay resends the loop's requests as the loop makes them)."""
        if self._deterministic is not None:
            return self._deterministic
        if not self._repeats_itself():
            return False
        return self.greedy or _asked_greedily(trace)

    def _repeats_itself(self) -> bool:
        """Whether the loop's model endpoint decodes a request at temperature 0 the same way every time (the
        embedded server, which a loop's client names); the loop adapters that know their client say so."""
        return False

    def preview(self, trace: StructuredTrace, *, rollback_point: int, action: StepAction) -> str | None:
        """What ``action`` returns, run alone by ``execute_tool``, for a tool declared pure (its result does not
        depend on the steps before it); None otherwise (see :class:`~reflect_otel.replay.PreviewsSteps`)."""
        if self._execute_tool is None or action.tool_name not in self.pure_tools:
            return None
        try:
            return _values.as_text(self._execute_tool(action.tool_name, dict(action.arguments)))
        except Exception:  # the loop's tool may fail in any way: a replay will tell
            return None

    @property
    def resamples(self) -> bool:
        """Whether :meth:`resample` can run: the user's ``resume`` takes a ``temperature`` keyword (the loop samples
        its model calls at it). Without one a resample would repeat the loop's own sampling, greedy or not, so the
        adapter does not offer it (:func:`~reflect_otel.replay.resampler` sees ``False``)."""
        return callable(self._resume) and takes_temperature(self._resume)

    def _replay(self, request: ReplayRequest) -> ReplayResult:
        """The loop resumed for ``request``: at its temperature when it has one (a resample, which needs
        :attr:`resamples`), at 0 when the adapter makes its replays greedy (:attr:`greedy`), else as the loop runs."""
        if request.temperature is not None and not self.resamples:
            raise ReplayError(
                f"resampling an {self.loop_name} tool loop needs a resume function that takes a temperature keyword: "
                "resume(..., temperature=t) samples the loop's model calls at t"
            )
        temperature = request.temperature if request.temperature is not None else (0.0 if self.greedy else None)
        return self._continue(request, temperature)

    def _continue(self, request: ReplayRequest, temperature: float | None) -> ReplayResult:
        """The loop resumed after the request's rollback point (its API's messages, the injection, the action);
        ``temperature`` is passed to ``resume`` when given, never otherwise (a replay runs as the loop does)."""
        raise NotImplementedError

    def _sampling(self, temperature: float | None) -> dict[str, float]:
        return {} if temperature is None else {"temperature": temperature}

    def _recorded(self, request: ReplayRequest, *, propose: bool = False) -> dict[str, Any]:
        """The recorded request to resume from, after checking the rollback point and that an action can run (a
        proposal runs none)."""
        check_rollback_point(request.trace, request.rollback_point)
        action = None if propose else request.action
        if action is not None and (action.tool_name is None or self._execute_tool is None):
            raise ReplayError(
                f"an action replay of an {self.loop_name} tool loop needs a tool call and the loop's tool executor: "
                f"pass execute_tool=... to {type(self).__name__}"
            )
        return recorded_request(request.trace, request.rollback_point, api=self.request_api)


def _asked_greedily(trace: StructuredTrace) -> bool:
    """Whether the run recorded model requests and every one asked for temperature 0 (one that says nothing gets
    the endpoint's default, which samples)."""
    asked = [_values.parse_json(step.model_input) for step in trace.steps if step.model_input]
    return bool(asked) and all(isinstance(r, dict) and r.get("temperature") in (0, 0.0) for r in asked)


def takes_temperature(function: Callable[..., Any]) -> bool:
    """Whether ``function`` can be called with a ``temperature`` keyword."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or a C callable: nothing known, nothing assumed
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "temperature" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        for p in parameters
    )


def recorded_request(trace: StructuredTrace, rollback_point: int, *, api: str) -> dict[str, Any]:
    """The recorded request body (``input.value``) of the first LLM call after step ``rollback_point``; it must have
    a ``messages`` list (``api`` names the API in the error)."""
    for step in trace.steps[rollback_point:]:
        if step.model_input:
            request = _values.parse_json(step.model_input)
            if isinstance(request, dict) and isinstance(request.get("messages"), list):
                return request
            raise ReplayError(f"step {step.index}'s recorded model request is not an {api} request")
    raise ReplayError(
        f"no model request is recorded after step {rollback_point}; the {api} instrumentation records it as "
        "input.value (check it is installed and that span attributes were not dropped)"
    )


def resume_captured(
    trace: StructuredTrace,
    rollback_point: int,
    provider: TracerProvider,
    *,
    adapter: str,
    resume: Callable[[], str],
    sent_as_prepared: Callable[[dict[str, Any]], bool],
) -> ReplayResult:
    """Run ``resume`` (the action, if any, then the user's loop) under a fresh root span, capture what it produced
    and stitch it after the kept steps. ``sent_as_prepared(request)`` says whether the continuation's first model
    request is the prefix the adapter prepared (``prefix_verified``)."""
    with captured(provider, f"reflect.replay.{adapter}") as run:
        try:
            answer = resume()
        except IrreversibleToolError:
            raise
        except Exception as error:  # the user's loop may fail in any way
            raise ReplayError(f"the resumed tool loop failed: {type(error).__name__}: {error}") from error
    if run.trace is None:
        raise ReplayError(f"the replay's continuation could not be read: {run.error}")
    sent = first_sent_request(run.records)
    final = answer if answer else run.trace.final_answer
    return ReplayResult(
        trace=stitch(trace, rollback_point, run.trace.steps, trace_id=run.trace_id, final_answer=final),
        rollback_point=rollback_point,
        final_answer=final,
        prefix_verified=isinstance(sent, dict) and sent_as_prepared(sent),
        adapter_info={"adapter": adapter, "replay_trace_id": run.trace_id},
    )


def first_sent_request(records: list[SpanRecord]) -> Any:
    """The request body of the continuation's first LLM span, parsed (None when there is none)."""
    llm = OpenInferenceSpanKindValues.LLM.value
    first = min(
        (r for r in records if r.attributes.get(SpanAttributes.OPENINFERENCE_SPAN_KIND) == llm),
        key=lambda r: r.start_ns,
        default=None,
    )
    return None if first is None else _values.parse_json(first.attributes.get(SpanAttributes.INPUT_VALUE))


def canonical(value: Any) -> str:
    """``value`` compared by content: clients add defaults (``None`` fields) when they serialise."""

    def clean(item: Any) -> Any:
        if isinstance(item, dict):
            return {k: clean(v) for k, v in item.items() if v is not None}
        if isinstance(item, list):
            return [clean(v) for v in item]
        return item

    return json.dumps(clean(value), sort_keys=True)


def run_action(
    action: StepAction, execute_tool: ExecuteTool, guard: ToolGuard, provider: TracerProvider, *, tracer_name: str
) -> tuple[str, str, str]:
    """Run ``action``'s tool call through the loop's executor, after the guard, under a TOOL span; returns
    ``(call id, arguments as JSON, result as text)`` for the adapter to append as its API's messages."""
    assert action.tool_name is not None
    guard(action.tool_name, action.arguments)
    call_id = f"call_reflect_{uuid.uuid4().hex[:12]}"
    arguments = json.dumps(action.arguments, ensure_ascii=False)
    with provider.get_tracer(tracer_name).start_as_current_span(
        action.tool_name,
        attributes={
            SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.TOOL.value,
            SpanAttributes.TOOL_NAME: action.tool_name,
            ToolCallAttributes.TOOL_CALL_ID: call_id,
            SpanAttributes.INPUT_VALUE: arguments,
        },
    ) as span:
        result = _values.as_text(execute_tool(action.tool_name, dict(action.arguments)))
        span.set_attribute(SpanAttributes.OUTPUT_VALUE, result)
    return call_id, arguments, result
