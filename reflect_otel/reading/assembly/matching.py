"""Results to calls: the model's tool calls become steps, and each tool run or tool message answers one of them.

* A TOOL span answers the call with its tool call id; without an id, the oldest unanswered call of the same tool
  made in the same agent span; without either, the model reply just before it that names the tool in its text (a
  ReAct agent writes ``Action: multiply`` and the framework runs it); then the oldest unanswered call of the same
  tool made by another agent; a TOOL span with neither id nor tool name (an agent handoff), the oldest unanswered
  call. A TOOL span that answers no call (a tool invoked from code) is a step of its own.
* A loop that runs its tools without tool spans still sends their results to the model: the next call's tool
  messages answer the calls they name. A tool span's answer is kept unless it is a JSON object and the model was
  shown text: the observation is what the model saw, not the framework's result wrapper (LlamaIndex's
  ``ToolOutput``).
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from reflect_otel import _values
from reflect_otel.trace import StepKind, StepStatus

from .actions import Action
from .messages import Message
from .model_calls import ModelCall
from .scrub import Scrubber, TextRules
from .steps import StepDraft
from .tool_runs import ToolRun

__all__ = ["CallMatcher", "Matched", "match_calls"]


@dataclass(frozen=True, slots=True)
class Matched:
    drafts: tuple[StepDraft, ...]
    secrets: int
    """Secrets replaced in the texts matching cleaned (tool messages, arguments read from tool spans)."""


def match_calls(actions: Iterable[Action], rules: TextRules) -> Matched:
    """The steps of ``actions``, each call with its result."""
    matcher = CallMatcher(rules.scrubber())
    for action in actions:
        if isinstance(action, ModelCall):
            matcher.add_model_call(action)
        else:
            matcher.add_tool_run(action)
    return Matched(tuple(matcher.drafts), matcher.scrubber.secrets)


class CallMatcher:
    """The steps so far and the calls still waiting for a result. Drafts are frozen and replaced in place; the
    indexes below point into ``drafts``. One matcher per trace, used only by :func:`match_calls`."""

    def __init__(self, scrubber: Scrubber) -> None:
        self.scrubber = scrubber
        self.drafts: list[StepDraft] = []
        self.calls_by_id: dict[str, int] = {}
        self.waiting_by_id: dict[str, int] = {}
        self.waiting_by_name: defaultdict[str, deque[int]] = defaultdict(deque)

    def add_model_call(self, call: ModelCall) -> None:
        """The call's steps: one per tool call it asked for (tokens on the first), or one for its reply."""
        self._answer_from(call.tool_messages)
        base = StepDraft.of(call.span_id, StepKind.REASONING, call.context)._replace(
            reasoning=call.reasoning,
            model_name=call.model_name,
            model_input=call.model_input,
            prompt_tokens=call.prompt_tokens,
            completion_tokens=call.completion_tokens,
            logprob=call.logprob,
        )
        if not call.requests:
            self.drafts.append(base)
        for position, request in enumerate(call.requests):
            index = len(self.drafts)
            draft = base._replace(
                kind=StepKind.TOOL_CALL,
                tool_name=request.name or None,
                tool_args=request.args,
                tool_call_id=request.call_id,
            )
            self.drafts.append(draft if position == 0 else draft._replace(prompt_tokens=None, completion_tokens=None))
            if request.call_id:
                self.waiting_by_id[request.call_id] = self.calls_by_id[request.call_id] = index
            self.waiting_by_name[request.name].append(index)

    def add_tool_run(self, run: ToolRun) -> None:
        """Attach the run to the call it answers, or make it a step of its own."""
        index = self._answered_call(run)
        if index is None:  # invoked from code, not by a model's tool call
            self.drafts.append(
                StepDraft.of(run.span_id, StepKind.TOOL_CALL, run.context)._replace(
                    tool_span_id=run.span_id,
                    tool_name=run.name,
                    tool_args=self.scrubber.args(run.arguments),
                    tool_call_id=run.call_id,
                    tool_result=run.result,
                    tool_result_raw=run.result_raw,
                    answered=True,
                )
            )
            return
        draft = self.drafts[index]
        call_id = draft.tool_call_id or run.call_id  # the model's call had no id; the tool's span has it
        if call_id:
            self.waiting_by_id.pop(call_id, None)
        draft = draft._replace(
            answered=True,
            tool_call_id=call_id,
            tool_span_id=run.span_id,
            tool_result=run.result,
            tool_result_raw=run.result_raw,
            end_time_ns=run.context.end_time_ns,
        )
        if run.context.status is StepStatus.ERROR:
            draft = draft._replace(status=StepStatus.ERROR, status_message=run.context.status_message)
        if run.context.langgraph_step is not None:  # the checkpoint after the step is the one the tool wrote
            draft = draft._replace(langgraph_step=run.context.langgraph_step, langgraph_node=run.context.langgraph_node)
        self.drafts[index] = draft

    def _answered_call(self, run: ToolRun) -> int | None:
        index = self.waiting_by_id.pop(run.call_id, None) if run.call_id else None
        if index is None:
            index = self._waiting_call(run, same_agent=True)
        if index is None and not run.call_id:
            index = self._written_call(run)
        if index is None:
            index = self._waiting_call(run, same_agent=False)
        if index is None and not run.call_id and not run.named:
            index = self._oldest_unanswered()  # an anonymous action (a handoff) answers the call that asked for it
        return index

    def _waiting_call(self, run: ToolRun, *, same_agent: bool) -> int | None:
        """The oldest unanswered call of the run's tool; with ``same_agent``, only one made inside the run's own
        agent span. A call of another agent yields to a reply of the run's own agent that names the tool: a
        sub-agent's answer call that no tool span recorded is not answered by its manager's run of the same tool."""
        waiting = self.waiting_by_name.get(run.name)
        for candidate in list(waiting or ()):
            draft = self.drafts[candidate]
            if draft.answered or not same_agent or draft.agent_span_id == run.context.agent_span_id:
                assert waiting is not None
                waiting.remove(candidate)
                if not draft.answered:
                    return candidate
        return None

    def _written_call(self, run: ToolRun) -> int | None:
        """The reply that asked for this tool in its text: the last step, when it is a model's reply without tool
        calls that names the tool. It becomes the tool call, its text the reasoning."""
        if not self.drafts or not run.name:
            return None
        last = self.drafts[-1]
        if last.kind is not StepKind.REASONING or not re.search(rf"\b{re.escape(run.name)}\b", last.reasoning):
            return None
        self.drafts[-1] = last._replace(
            kind=StepKind.TOOL_CALL, tool_name=run.name, tool_args=self.scrubber.args(run.arguments)
        )
        return len(self.drafts) - 1

    def _oldest_unanswered(self) -> int | None:
        return next(
            (i for i, d in enumerate(self.drafts) if d.kind is StepKind.TOOL_CALL and not d.answered),
            None,
        )

    def _answer_from(self, messages: tuple[Message, ...]) -> None:
        """Tool messages a model was shown answer the calls they name (see the module docstring)."""
        for message in messages:
            assert message.tool_call_id is not None
            index = self.calls_by_id.get(message.tool_call_id)
            if index is None:
                continue
            draft = self.drafts[index]
            if draft.answered and not _is_object(draft.tool_result):
                continue
            text, raw = self.scrubber.result(message.text)
            if draft.answered and (not text.strip() or _is_object(text)):
                continue
            self.waiting_by_id.pop(message.tool_call_id, None)
            self.drafts[index] = draft._replace(answered=True, tool_result=text, tool_result_raw=raw)


def _is_object(value: object) -> bool:
    """A tool result that is a JSON object: a framework's result wrapper, or the tool's own data."""
    return isinstance(_values.parse_json(value), dict)
