"""Replay of a plain OpenAI tool-calling loop.

The prefix is the exact request body of the LLM call right after the rollback point (its ``input.value``, recorded
by openinference-instrumentation-openai): its ``messages``, plus the injection, are handed to the user's
registered ``resume`` function, which continues the loop with the same model and tools. The continuation's spans
are captured and stitched after the kept steps.

``resume(messages, guard)`` must call ``guard(tool_name, arguments)`` before running each tool: the guard stops a
continuation that would call an irreversible tool (unless allowed), so a replay never repeats a side effect.

An action (a corrected tool call) needs ``execute_tool(name, arguments) -> result``, the loop's own tool executor:
the adapter runs the call through it under a TOOL span (after the guard), appends the assistant's call and the
tool's result to the messages, and resumes the loop from there.

``propose`` (:class:`~reflect_otel.replay.ProposesSteps`) needs ``client``, the ``openai.OpenAI`` client the loop
calls its model with: it sends the recorded request after the rollback point (its messages plus the injection, and
of its other fields only the chat-completion parameters in :data:`RESENT_FIELDS`, as recorded, not streamed; any other
recorded field is dropped and named in the proposal's ``note``) at the proposal's temperature, and returns the first
tool call the model makes, or its answer; nothing is executed. Its spans are marked as a replay's.

Determinism: pass ``deterministic=True`` when the loop's model runs greedily on an endpoint that repeats itself, or
``False``. Said nothing, a loop whose ``client`` is the embedded server's (the local default model) is deterministic
for a run whose recorded requests all asked for temperature 0, and for every run when ``resume`` takes a
``temperature`` keyword: the adapter then resumes each replay at temperature 0 itself (``greedy``).

``resample`` (:class:`~reflect_otel.replay.SamplesRuns`, the consistency check's re-runs) needs a ``resume`` that
takes a ``temperature`` keyword: the loop re-runs from its first recorded request with its model calls sampled at it.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable
from typing import Any, Unpack

from opentelemetry.sdk.trace import TracerProvider

from reflect_otel.errors import ReplayError
from reflect_otel.llm.local import is_embedded_endpoint
from reflect_otel.reading.capture import captured
from reflect_otel.replay import ProposedStep, ReplayRequest, ReplayResult
from reflect_otel.replay_adapters._guard import IrreversibleToolError
from reflect_otel.replay_adapters._tool_loop import (
    ExecuteTool,
    ToolLoopOptionKeywords,
    ToolLoopOptions,
    ToolLoopReplay,
    canonical,
    recorded_request,
    resume_captured,
    run_action,
)
from reflect_otel.trace import StepAction, StructuredTrace

__all__ = [
    "RESENT_FIELDS",
    "ExecuteTool",
    "IrreversibleToolError",
    "OpenAIToolLoopReplayAdapter",
    "ResumeLoop",
    "ToolLoopOptions",
]

ResumeLoop = Callable[..., str]
"""``resume(messages, guard) -> final answer``: continue the tool loop from ``messages``. With a ``temperature``
keyword (``resume(messages, guard, temperature=t)``, the loop's model calls sampled at ``t``) the adapter also
resamples whole runs, for the consistency check (:meth:`~ToolLoopReplay.resample`)."""


class OpenAIToolLoopReplayAdapter(ToolLoopReplay[ResumeLoop]):
    """``tracer_provider`` is the provider the OpenAI instrumentation was installed with; ``client`` the loop's
    OpenAI client, for proposals (without it the adapter does not propose)."""

    loop_name = "OpenAI"
    request_api = "OpenAI chat"

    def __init__(
        self,
        resume: ResumeLoop,
        *,
        tracer_provider: TracerProvider,
        client: Any | None = None,
        options: ToolLoopOptions | None = None,
        **option: Unpack[ToolLoopOptionKeywords],
    ) -> None:
        super().__init__(resume, tracer_provider=tracer_provider, options=options, **option)
        self._client = client

    def _repeats_itself(self) -> bool:
        """Whether the loop's client sends its requests to the embedded server."""
        return self._client is not None and is_embedded_endpoint(getattr(self._client, "base_url", ""))

    @property
    def proposes(self) -> bool:
        """Whether ``propose`` can run (it needs the loop's client)."""
        return self._client is not None

    @staticmethod
    def request_after(trace: StructuredTrace, rollback_point: int) -> dict[str, Any]:
        """The recorded request of the first LLM call after step ``rollback_point``."""
        return recorded_request(trace, rollback_point, api=OpenAIToolLoopReplayAdapter.request_api)

    def _continue(self, request: ReplayRequest, temperature: float | None) -> ReplayResult:
        messages = _with_injection(list(self._recorded(request)["messages"]), request)
        action = request.action

        def resume() -> str:
            messages.extend(self._execute(action) if action is not None else [])
            return self._resume(copy.deepcopy(messages), self._guard, **self._sampling(temperature))

        return resume_captured(
            request.trace,
            request.rollback_point,
            self._provider,
            adapter="openai_loop",
            resume=resume,
            sent_as_prepared=lambda sent: canonical(sent.get("messages")) == canonical(messages),
        )

    def _execute(self, action: StepAction) -> list[dict[str, Any]]:
        """The assistant's call and the tool's answer, as the loop would have appended them."""
        assert self._execute_tool is not None
        call_id, arguments, result = run_action(
            action, self._execute_tool, self._guard, self._provider, tracer_name="reflect.replay.openai_loop"
        )
        call = {"id": call_id, "type": "function", "function": {"name": action.tool_name, "arguments": arguments}}
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ]

    def propose(self, request: ReplayRequest, *, samples: int = 1) -> tuple[ProposedStep, ...]:
        if self._client is None:
            raise ReplayError(
                "proposing needs the loop's OpenAI client: pass client=... to OpenAIToolLoopReplayAdapter"
            )
        recorded = self._recorded(request, propose=True)
        messages = _with_injection(list(recorded["messages"]), request)
        create = self._client.chat.completions.create
        kept, dropped = _accepted(create, recorded)
        body = kept | {"messages": messages, "temperature": request.proposal_temperature}
        note = _dropped_note(dropped)
        proposals = []
        with captured(self._provider, "reflect.propose.openai_loop"):
            for _ in range(samples):
                try:
                    reply = create(**body)
                except Exception as error:  # the endpoint may fail in any way
                    raise ReplayError(f"the model failed while proposing: {type(error).__name__}: {error}") from error
                message = reply.choices[0].message
                calls = message.tool_calls or []
                if calls:
                    call = calls[0]
                    proposals.append(
                        ProposedStep(
                            action=StepAction(
                                tool_name=call.function.name, arguments=_arguments(call.function.arguments)
                            ),
                            note=note,
                        )
                    )
                else:
                    proposals.append(
                        ProposedStep(action=StepAction(text=message.content or ""), is_final_answer=True, note=note)
                    )
        return tuple(proposals)


RESENT_FIELDS = frozenset(
    {
        "model",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "reasoning_effort",
    }
)
"""The recorded request's fields a proposal sends again: the chat-completion body fields that shape the model's
decision. ``messages`` and ``temperature`` are the proposal's own; ``stream``, ``stream_options`` and ``n`` are not
resent (a proposal is one decision, asked once per sample); anything else is dropped and named in the proposal's
note, never sent: the recorded body is trace content, and fields such as ``extra_headers``, ``extra_query``,
``extra_body`` and ``timeout`` (the client's, not the API's), or ``store``, ``user``, ``metadata`` and
``service_tier``, would let a span set headers, query parameters, timeouts or billing on the user's endpoint."""

_OURS = frozenset({"messages", "temperature", "stream", "stream_options", "n"})


def _accepted(create: Callable[..., Any], request: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The recorded request's :data:`RESENT_FIELDS` that ``create`` takes, as recorded, and the names of the other
    recorded fields, dropped (those the proposal sets itself are not counted)."""
    try:
        takes = set(inspect.signature(create).parameters)
    except (TypeError, ValueError):
        takes = set(RESENT_FIELDS)
    kept = {k: v for k, v in request.items() if k in RESENT_FIELDS and k in takes}
    dropped = sorted(str(k)[:64] for k in request if k not in kept and k not in _OURS)
    return kept, dropped


def _dropped_note(dropped: list[str]) -> str:
    if not dropped:
        return ""
    shown = ", ".join(dropped[:10]) + (f" and {len(dropped) - 10} more" if len(dropped) > 10 else "")
    return f"{len(dropped)} recorded request field(s) not sent: {shown}"


def _with_injection(messages: list[Any], request: ReplayRequest) -> list[Any]:
    """The recorded messages with the request's injection (when not empty) as a message of its role."""
    if not request.injection:
        return messages
    return [*messages, {"role": request.injection_role.value, "content": request.injection}]


def _arguments(text: str | None) -> dict[str, Any]:
    """A proposed call's arguments; a model that wrote no JSON object proposes the call with none."""
    try:
        parsed = json.loads(text or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
