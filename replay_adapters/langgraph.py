"""Replay of a compiled LangGraph graph, in a new thread so the user's thread is never branched.

With the run's checkpoints (``trace.replay.thread_id`` on the graph's checkpointer): the checkpoint written right
after step p (its ``metadata["step"]`` equals step p's ``langgraph_step``, and its ``next`` is the model node) is
copied into a new thread with ``update_state(..., as_node=<node of step p>)`` together with the injection, and the
graph resumes with ``invoke(None, config)``. Without checkpoints (no checkpointer, another process, or
``durability="exit"``), the new thread is seeded from the messages the model saw right after step p (the LLM
span's recorded input). Rolling back to 0 invokes the graph on the run's first input plus the injection.
An action (a corrected tool call) is written into the new thread as the model node's decision
(``update_state(..., as_node=<model node>)`` with an ``AIMessage`` carrying the call), so the graph's own tools node
executes it for real and the model continues from its result.

``propose`` forks the same way and runs the model node only (interrupted before the tools node), passing the
sampling temperature as ``config["configurable"]["reflect_temperature"]``
(:data:`~reflect_otel.replay.SAMPLING_TEMPERATURE`); the decision it made is read and nothing is executed. Pass
``deterministic=True`` when the graph's model runs greedily (temperature 0): controlled tests then need one replay
per arm.

State outside the graph (files, tables, a database the tools write) is the agent's: pass ``restore_state``, a
callable ``(trace, rollback_point)`` that brings it to where the run was after that step (e.g. re-running the kept
steps' tool calls); it is called before every replay (a proposal runs no tool), and this adapter then runs its
replays one at a time (they share that state). Without it, a replay sees whatever the run and earlier replays left there.

Known limits: a graph whose model node adds its own system prompt is seeded from spans with that prompt in the
messages; a subgraph's checkpoints are not forked (replay the inner graph on its own); chat formatters that
reject mid-conversation system messages need ``injection_role="user"``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from opentelemetry.sdk.trace import TracerProvider

from reflect_otel import _values
from reflect_otel.attribution.corrections import Rule
from reflect_otel.errors import MissingDependencyError, ReplayError
from reflect_otel.reading.capture import captured
from reflect_otel.reading.semconv import INPUT_MESSAGES_PREFIX, OpenInferenceSpanKindValues, SpanAttributes
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.replay import (
    SAMPLING_TEMPERATURE,
    InjectionRole,
    ProposedStep,
    ReplayRequest,
    ReplayResult,
    check_rollback_point,
)
from reflect_otel.replay_adapters._base import ReplayAdapterBase, with_options
from reflect_otel.replay_adapters._guard import ToolGuard
from reflect_otel.replay_adapters._stitch import stitch
from reflect_otel.trace import StepAction, StructuredTrace

try:
    from langchain_core._api import suppress_langchain_beta_warning
    from langchain_core.load import load as lc_load
    from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage
    from langgraph.errors import GraphRecursionError
except ImportError as error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("langgraph", "langgraph") from error

__all__ = ["LangGraphReplayAdapter", "LangGraphReplayOptions", "RestoreState"]

RestoreState = Callable[[StructuredTrace, int], None]
"""Brings the agent's own state (outside the graph) to where ``trace``'s run was after step ``rollback_point``;
raises :class:`ReplayError` when it cannot."""


def _injection_message(text: str, role: InjectionRole) -> BaseMessage:
    return HumanMessage(text) if role == InjectionRole.USER else SystemMessage(text)


def _action_message(action: StepAction) -> AIMessage:
    if action.tool_name is None:
        raise ReplayError("a LangGraph replay executes tool calls; a replacement thought is not a call")
    call = {"name": action.tool_name, "args": dict(action.arguments), "id": f"call_reflect_{uuid.uuid4().hex[:12]}"}
    return AIMessage(content="", tool_calls=[call])


def _with_action_arguments(trace: StructuredTrace, rollback_point: int, action: StepAction) -> StructuredTrace:
    """The action's step with the arguments it was called with: no LLM span decided it, and a LangChain TOOL
    span's ``input.value`` is lossy (a one-argument tool records the bare value)."""
    steps = list(trace.steps)
    if len(steps) > rollback_point and steps[rollback_point].tool_name == action.tool_name:
        steps[rollback_point] = steps[rollback_point].model_copy(update={"tool_args": dict(action.arguments)})
    return trace.model_copy(update={"steps": tuple(steps)})


def _first_llm_contents(records: list[SpanRecord]) -> list[str] | None:
    llm = OpenInferenceSpanKindValues.LLM.value
    first = min(
        (r for r in records if r.attributes.get(SpanAttributes.OPENINFERENCE_SPAN_KIND) == llm),
        key=lambda r: r.start_ns,
        default=None,
    )
    if first is None:
        return None
    contents: dict[int, str] = {}
    for key, value in first.attributes.items():
        if key.startswith(INPUT_MESSAGES_PREFIX) and key.endswith(".message.content"):
            index = key[len(INPUT_MESSAGES_PREFIX) :].split(".", 1)[0]
            if index.isdigit():
                contents[int(index)] = str(value)
    return [contents[i] for i in sorted(contents)]


@dataclass(frozen=True)
class LangGraphReplayOptions:
    """How :class:`LangGraphReplayAdapter` runs its graph. ``model_node``/``tools_node`` name the ReAct nodes
    (LangGraph's defaults: ``agent`` and ``tools``). ``correction_rules`` are evidence rules that fit this agent's
    tools (:class:`~reflect_otel.replay.HasCorrectionRules`): they run for the runs this adapter replays, beside the
    built-in ones. ``pure_tools`` names the tools that answer the same call with the same data
    (:class:`~reflect_otel.replay.HasPureTools`): a correction repeating such a call the run already made is
    refused. ``restore_state``: see the module's description."""

    model_node: str = "agent"
    tools_node: str = "tools"
    irreversible_tools: Collection[str] = ()
    allow_irreversible: bool = False
    recursion_limit: int = 50
    deterministic: bool = False
    correction_rules: Sequence[Rule] = ()
    pure_tools: Collection[str] = ()
    restore_state: RestoreState | None = None


class LangGraphReplayOptionKeywords(TypedDict, total=False):
    """:class:`LangGraphReplayOptions`' fields as constructor keywords, so a type checker names a misspelt one."""

    model_node: str
    tools_node: str
    irreversible_tools: Collection[str]
    allow_irreversible: bool
    recursion_limit: int
    deterministic: bool
    correction_rules: Sequence[Rule]
    pure_tools: Collection[str]
    restore_state: RestoreState | None


class LangGraphReplayAdapter(ReplayAdapterBase):
    """``graph`` is the compiled graph; ``tracer_provider`` the provider the LangChain instrumentation uses;
    ``options`` how to run it (:class:`LangGraphReplayOptions`). Keywords name single options and take precedence:
    ``LangGraphReplayAdapter(graph, tracer_provider=p, irreversible_tools={"send_email"})``."""

    def __init__(
        self,
        graph: Any,
        *,
        tracer_provider: TracerProvider,
        options: LangGraphReplayOptions | None = None,
        **option: Unpack[LangGraphReplayOptionKeywords],
    ) -> None:
        chosen = with_options(options or LangGraphReplayOptions(), option)
        self.graph = graph
        self.options = chosen
        self._restore_state = chosen.restore_state
        self._one_at_a_time = threading.Lock()
        self.correction_rules = tuple(chosen.correction_rules)
        self.pure_tools = frozenset(chosen.pure_tools)
        self.deterministic = chosen.deterministic
        self._provider = tracer_provider
        self.model_node = chosen.model_node
        self.tools_node = chosen.tools_node
        self._guard = ToolGuard(chosen.irreversible_tools, allow=chosen.allow_irreversible)
        self.recursion_limit = chosen.recursion_limit

    # -- where to resume from ------------------------------------------------------------------------------------
    def _checkpoint_after(self, trace: StructuredTrace, rollback_point: int) -> tuple[dict[str, Any], str] | None:
        """State values and checkpoint id right after step ``rollback_point``, from the run's own checkpoints."""
        saver = getattr(self.graph, "checkpointer", None)
        thread = trace.replay.thread_id
        if saver is None or thread is None:
            return None
        wanted = 0 if rollback_point == 0 else trace.steps[rollback_point - 1].langgraph_step
        if wanted is None:
            return None
        for checkpoint in saver.list({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}):
            if checkpoint.metadata.get("step") != wanted:
                continue
            state = self.graph.get_state(checkpoint.config)
            if self.model_node not in state.next:
                return None
            return dict(state.values), str(checkpoint.config["configurable"].get("checkpoint_id", ""))
        return None

    @staticmethod
    def _messages_from_spans(trace: StructuredTrace, rollback_point: int) -> list[AnyMessage]:
        for step in trace.steps[rollback_point:]:
            if not step.model_input:
                continue
            request = _values.parse_json(step.model_input)
            batch = request.get("messages") if isinstance(request, dict) else None
            if isinstance(batch, list) and batch and isinstance(batch[0], list):
                batch = batch[0]
            if not isinstance(batch, list):
                break
            try:  # trace content is untrusted: only chat-message classes may be rebuilt
                with suppress_langchain_beta_warning():
                    return [
                        lc_load(m, allowed_objects="messages") if isinstance(m, dict) and m.get("lc") else m
                        for m in batch
                    ]
            except Exception as error:  # malformed or unknown serialised classes
                raise ReplayError(f"could not rebuild the messages recorded on step {step.index}: {error}") from None
        raise ReplayError(
            f"no checkpoint and no recorded model input after step {rollback_point}: give the graph a checkpointer "
            "(and keep trace.replay.thread_id), or keep span attributes (raise OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT)"
        )

    # -- running -------------------------------------------------------------------------------------------------
    @contextmanager
    def _prepared(self, trace: StructuredTrace, rollback_point: int) -> Iterator[None]:
        """Held while one proposal or replay runs: the agent's own state restored to ``rollback_point`` first."""
        if self._restore_state is None:
            yield
            return
        with self._one_at_a_time:
            try:
                self._restore_state(trace, rollback_point)
            except ReplayError:
                raise
            except Exception as error:  # the agent's callable may fail in any way
                raise ReplayError(
                    f"restore_state failed at step {rollback_point}: {type(error).__name__}: {error}"
                ) from error
            yield

    def _run(self, start: dict[str, Any] | None, config: dict[str, Any]) -> None:
        guarded = bool(self._guard.irreversible) and not self._guard.allow
        interrupt = [self.tools_node] if guarded else None
        self.graph.invoke(start, config, interrupt_before=interrupt)
        while guarded and self.tools_node in self.graph.get_state(config).next:
            pending = self.graph.get_state(config).values.get("messages", [])[-1]
            for call in getattr(pending, "tool_calls", []) or []:
                self._guard(call["name"], call.get("args"))
            self.graph.invoke(None, config, interrupt_before=interrupt)

    def _fork(self, request: ReplayRequest) -> tuple[dict[str, Any], str, list[BaseMessage]]:
        """The state right after the request's rollback point (values, where it came from, messages with the
        injection appended)."""
        trace, rollback_point = request.trace, request.rollback_point
        check_rollback_point(trace, rollback_point)
        forked = self._checkpoint_after(trace, rollback_point)
        if forked is not None:
            values, source = forked
            messages = list(values.get("messages", []))
        else:
            values, source = {}, "spans"
            messages = list(self._messages_from_spans(trace, rollback_point))
        if request.injection:
            messages.append(_injection_message(request.injection, request.injection_role))
        return values, source, messages

    def _config(self, kind: str, temperature: float | None) -> dict[str, Any]:
        """A new thread's run config, passing ``temperature`` as :data:`SAMPLING_TEMPERATURE` when given."""
        sampling = {SAMPLING_TEMPERATURE: temperature} if temperature is not None else {}
        thread = f"reflect-{kind}-{uuid.uuid4().hex}"
        return {"configurable": {"thread_id": thread, **sampling}, "recursion_limit": self.recursion_limit}

    def propose(self, request: ReplayRequest, *, samples: int = 1) -> tuple[ProposedStep, ...]:
        values, _, messages = self._fork(request)
        rollback_point = request.rollback_point
        node = (request.trace.steps[rollback_point - 1].langgraph_node or self.tools_node) if rollback_point else None
        proposals = []
        for _ in range(samples):
            config = self._config("propose", request.proposal_temperature)
            with captured(self._provider, "reflect.propose.langgraph"):
                try:
                    if node is None:
                        self.graph.invoke({**values, "messages": messages}, config, interrupt_before=[self.tools_node])
                    else:
                        self.graph.update_state(config, {**values, "messages": messages}, as_node=node)
                        self.graph.invoke(None, config, interrupt_before=[self.tools_node])
                except GraphRecursionError:
                    continue  # no decision within the limit: not a proposal
                except Exception as error:  # the graph may fail in any way
                    raise ReplayError(f"the graph failed while proposing: {type(error).__name__}: {error}") from error
            decided = self.graph.get_state(config).values.get("messages", [])
            proposed = _proposed(decided[-1] if decided else None)
            if proposed is not None:
                proposals.append(proposed)
        return tuple(proposals)

    def preview(self, trace: StructuredTrace, *, rollback_point: int, action: StepAction) -> str | None:
        """What ``action``'s tool returns after step ``rollback_point``, run alone from the graph's tools node: only
        for a tool declared pure, with ``restore_state`` to bring the agent's state there (see
        :class:`~reflect_otel.replay.PreviewsSteps`). None otherwise, or when the tool fails."""
        if self._restore_state is None or action.tool_name not in self.pure_tools:
            return None
        node = getattr(self.graph, "nodes", {}).get(self.tools_node)
        tool = getattr(getattr(node, "bound", None), "tools_by_name", {}).get(action.tool_name)
        if tool is None:
            return None
        try:
            with self._prepared(trace, rollback_point):
                return _values.as_text(tool.invoke(dict(action.arguments)))
        except Exception:  # the agent's tool, or its state, may fail in any way: a replay will tell
            return None

    def _replay(self, request: ReplayRequest) -> ReplayResult:
        decided = _action_message(request.action) if request.action is not None else None
        values, source, messages = self._fork(request)
        if decided is not None:
            messages.append(decided)
        config = self._config("replay", request.temperature)
        with (
            self._prepared(request.trace, request.rollback_point),
            captured(self._provider, "reflect.replay.langgraph") as run,
        ):
            unfinished = self._resume(request, {**values, "messages": messages}, config, acted=decided is not None)
        if run.trace is None:
            raise ReplayError(f"the replay's continuation could not be read: {run.error}")
        final_messages = self.graph.get_state(config).values.get("messages", [])
        final = None if unfinished else _final_text(final_messages, run.trace.final_answer)
        replayed = stitch(
            request.trace, request.rollback_point, run.trace.steps, trace_id=run.trace_id, final_answer=final
        )
        if request.action is not None:
            replayed = _with_action_arguments(replayed, request.rollback_point, request.action)
        info = {"adapter": "langgraph", "thread_id": config["configurable"]["thread_id"], "forked_from": source}
        return ReplayResult(
            trace=replayed,
            rollback_point=request.rollback_point,
            final_answer=final,
            prefix_verified=_prefix_seen(run.records, messages, acted=decided is not None),
            adapter_info=info
            | {"replay_trace_id": run.trace_id}
            | ({"stopped": "recursion limit"} if unfinished else {}),
        )

    def _resume(self, request: ReplayRequest, state: dict[str, Any], config: dict[str, Any], *, acted: bool) -> bool:
        """Run the graph on from the forked ``state`` in ``config``'s new thread; True when it stopped at the
        recursion limit (a run that did not finish is an outcome, no answer, not a failed replay)."""
        try:
            if acted:  # the model node "decided" the action; the tools node runs it
                self.graph.update_state(config, state, as_node=self.model_node)
                self._run(None, config)
            elif request.rollback_point == 0:
                self._run(state, config)
            else:
                node = request.trace.steps[request.rollback_point - 1].langgraph_node or self.tools_node
                self.graph.update_state(config, state, as_node=node)
                self._run(None, config)
        except ReplayError:
            raise
        except GraphRecursionError:
            return True
        except Exception as error:  # the graph may fail in any way
            raise ReplayError(f"the graph failed while replaying: {type(error).__name__}: {error}") from error
        return False


def _final_text(messages: list[BaseMessage], recorded: str | None) -> str | None:
    return _values.as_text(messages[-1].content) if messages else recorded


def _prefix_seen(records: list[SpanRecord], messages: list[BaseMessage], *, acted: bool) -> bool:
    """Whether the continuation's first model call received the prepared ``messages``. After an action it also sees
    the action's result: the prefix must lead its messages (the action's message has no text, and instrumentations
    record no content for it)."""
    seen = _first_llm_contents(records)
    expected = [_values.as_text(m.content) for m in messages]
    if not acted:
        return seen == expected
    texts = [text for text in expected if text]
    return seen is not None and seen[: len(texts)] == texts and len(seen) > len(texts)


def _proposed(last: BaseMessage | None) -> ProposedStep | None:
    """The decision the model node wrote last: its first tool call, or its answer; None when it wrote neither."""
    calls = getattr(last, "tool_calls", None) or []
    if calls:
        call = calls[0]
        return ProposedStep(action=StepAction(tool_name=call["name"], arguments=dict(call["args"])))
    if isinstance(last, AIMessage):
        return ProposedStep(action=StepAction(text=_values.as_text(last.content)), is_final_answer=True)
    return None
