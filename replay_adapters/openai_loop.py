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
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from reflect_otel.replay import InjectionRole, ReplayResult
from reflect_otel.replay_adapters._guard import IrreversibleToolError
from reflect_otel.replay_adapters._tool_loop import (
    ExecuteTool,
    ToolLoopReplay,
    canonical,
    recorded_request,
    resume_captured,
    run_action,
)
from reflect_otel.trace import StepAction, StructuredTrace

__all__ = ["ExecuteTool", "IrreversibleToolError", "OpenAIToolLoopReplayAdapter", "ResumeLoop"]

ResumeLoop = Callable[[list[dict[str, Any]], Callable[[str, Any], None]], str]
"""``resume(messages, guard) -> final answer``: continue the tool loop from ``messages``."""


class OpenAIToolLoopReplayAdapter(ToolLoopReplay[ResumeLoop]):
    """``tracer_provider`` is the provider the OpenAI instrumentation was installed with."""

    loop_name = "OpenAI"
    request_api = "OpenAI chat"

    @staticmethod
    def request_after(trace: StructuredTrace, rollback_point: int) -> dict[str, Any]:
        """The recorded request of the first LLM call after step ``rollback_point``."""
        return recorded_request(trace, rollback_point, api=OpenAIToolLoopReplayAdapter.request_api)

    def replay(
        self,
        trace: StructuredTrace,
        *,
        rollback_point: int,
        injection: str,
        injection_role: InjectionRole = InjectionRole.SYSTEM,
        action: StepAction | None = None,
    ) -> ReplayResult:
        messages = list(self._recorded(trace, rollback_point, action)["messages"])
        if injection:
            messages.append({"role": InjectionRole(injection_role).value, "content": injection})

        def resume() -> str:
            messages.extend(self._execute(action) if action is not None else [])
            return self._resume(copy.deepcopy(messages), self._guard)

        return resume_captured(
            trace,
            rollback_point,
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
