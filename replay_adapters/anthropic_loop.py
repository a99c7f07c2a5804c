"""Replay of a plain Anthropic Messages API tool loop (``tool_use`` / ``tool_result`` content blocks).

The prefix is the exact request body of the LLM call right after the rollback point (its ``input.value``, recorded
by openinference-instrumentation-anthropic): its ``system`` prompt and ``messages``, with the injection, are handed
to the user's registered ``resume`` function, which continues the loop with the same model and tools. The
continuation's spans are captured and stitched after the kept steps.

The Messages API has no system role inside the conversation, so the injection goes where the API allows it: as a
system injection (``system`` or ``developer``) it is appended to the system prompt; as ``user`` it is a text block
added to the last user turn (the request after a rollback point always ends on one: the question or tool results).

``resume(system, messages, guard)`` must call ``guard(tool_name, arguments)`` before running each tool, as in
:mod:`~reflect_otel.replay_adapters.openai_loop`. An action (a corrected tool call) needs ``execute_tool(name,
arguments) -> result``: the adapter runs it under a TOOL span and appends the assistant's ``tool_use`` turn and the
user's ``tool_result`` turn, then resumes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from reflect_otel.replay import InjectionRole, ReplayRequest, ReplayResult
from reflect_otel.replay_adapters._guard import IrreversibleToolError
from reflect_otel.replay_adapters._tool_loop import (
    ExecuteTool,
    ToolLoopOptions,
    ToolLoopReplay,
    canonical,
    resume_captured,
    run_action,
)
from reflect_otel.trace import StepAction

__all__ = [
    "AnthropicToolLoopReplayAdapter",
    "ExecuteTool",
    "IrreversibleToolError",
    "ResumeAnthropicLoop",
    "ToolLoopOptions",
]

System = str | list[dict[str, Any]] | None
"""A Messages API system prompt: text, a list of text blocks, or none."""
ResumeAnthropicLoop = Callable[..., str]
"""``resume(system, messages, guard) -> final answer``: continue the tool loop from ``messages``; with a
``temperature`` keyword the adapter also resamples whole runs (:meth:`~ToolLoopReplay.resample`)."""


class AnthropicToolLoopReplayAdapter(ToolLoopReplay[ResumeAnthropicLoop]):
    """``tracer_provider`` is the provider the Anthropic instrumentation was installed with."""

    loop_name = "Anthropic"
    request_api = "Anthropic Messages"

    def _continue(self, request: ReplayRequest, temperature: float | None) -> ReplayResult:
        recorded = self._recorded(request)
        system: System = recorded.get("system")
        messages = copy.deepcopy(list(recorded["messages"]))
        injection, action = request.injection, request.action
        if injection:
            if request.injection_role is InjectionRole.USER:
                messages = _with_user_text(messages, injection)
            else:
                system = _with_system_text(system, injection)

        def resume() -> str:
            messages.extend(self._execute(action) if action is not None else [])
            return self._resume(
                copy.deepcopy(system), copy.deepcopy(messages), self._guard, **self._sampling(temperature)
            )

        return resume_captured(
            request.trace,
            request.rollback_point,
            self._provider,
            adapter="anthropic_loop",
            resume=resume,
            sent_as_prepared=lambda sent: (
                canonical([sent.get("system"), sent.get("messages")]) == canonical([system, messages])
            ),
        )

    def _execute(self, action: StepAction) -> list[dict[str, Any]]:
        """The assistant's ``tool_use`` turn and the user's ``tool_result`` turn, as the loop would append them."""
        assert self._execute_tool is not None
        call_id, _arguments, result = run_action(
            action, self._execute_tool, self._guard, self._provider, tracer_name="reflect.replay.anthropic_loop"
        )
        use = {"type": "tool_use", "id": call_id, "name": action.tool_name, "input": dict(action.arguments)}
        return [
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result}]},
        ]


def _with_system_text(system: System, text: str) -> System:
    if not system:
        return text
    if isinstance(system, str):
        return f"{system}\n\n{text}"
    return [*system, {"type": "text", "text": text}]


def _with_user_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if not messages or messages[-1].get("role") != "user":
        return [*messages, {"role": "user", "content": text}]
    last = dict(messages[-1])
    content = last.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    last["content"] = [*blocks, {"type": "text", "text": text}]
    return [*messages[:-1], last]
