"""Steps before they are numbered (:class:`StepDraft`, typed like :class:`~reflect_otel.trace.Step`), and the
passes that shape the list: a lone model reply split into its chain of thought, each agent's answer handed back by a
call marked as such, and the final answer marked (by how the run ends, whatever its tools are called)."""

from __future__ import annotations

import ast
import json
from collections.abc import Collection, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from reflect_otel.trace import Step, StepKind, StepStatus

from .context import StepContext

__all__ = [
    "MAX_ARGUMENT_DEPTH",
    "MAX_ARGUMENT_VALUES",
    "StepDraft",
    "argument_values",
    "mark_final_answer",
    "mark_handed_back",
    "split_chain_of_thought",
]


_NO_ARGS: Mapping[str, Any] = MappingProxyType({})


class StepDraft(NamedTuple):
    """A step without its index; the fields mean what :class:`~reflect_otel.trace.Step`'s do. Changed with
    ``_replace``, which mypy checks like a constructor (a named tuple: drafts are replaced often, and a tuple's
    copy is several times cheaper than a frozen dataclass's)."""

    span_id: str
    kind: StepKind
    agent: str | None = None
    reasoning: str = ""
    tool_name: str | None = None
    tool_args: Mapping[str, Any] = _NO_ARGS
    tool_result: str | None = None
    tool_result_raw: str | None = None
    tool_call_id: str | None = None
    tool_span_id: str | None = None
    is_final_answer: bool = False
    start_time_ns: int | None = None
    end_time_ns: int | None = None
    status: StepStatus = StepStatus.UNSET
    status_message: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model_name: str | None = None
    model_input: str | None = None
    logprob: float | None = None
    langgraph_step: int | None = None
    langgraph_node: str | None = None
    answered: bool = False
    """A result is attached (a tool run's, or one the model was shown)."""
    agent_span_id: str | None = None
    """The AGENT span the step was taken in (see :class:`.context.StepContext`); not kept on the step."""

    @classmethod
    def of(cls, span_id: str, kind: StepKind, context: StepContext) -> StepDraft:
        """A draft with ``context``'s fields (the rest are set with ``_replace``)."""
        return cls(
            span_id=span_id,
            kind=kind,
            agent=context.agent,
            start_time_ns=context.start_time_ns,
            end_time_ns=context.end_time_ns,
            status=context.status,
            status_message=context.status_message,
            langgraph_step=context.langgraph_step,
            langgraph_node=context.langgraph_node,
            agent_span_id=context.agent_span_id,
        )

    def step(self, index: int) -> Step:
        return Step(
            index=index,
            span_id=self.span_id,
            kind=self.kind,
            agent=self.agent,
            reasoning=self.reasoning,
            tool_name=self.tool_name,
            tool_args=dict(self.tool_args),
            tool_result=self.tool_result,
            tool_result_raw=self.tool_result_raw,
            tool_call_id=self.tool_call_id,
            tool_span_id=self.tool_span_id,
            is_final_answer=self.is_final_answer,
            start_time_ns=self.start_time_ns,
            end_time_ns=self.end_time_ns,
            status=self.status,
            status_message=self.status_message,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            model_name=self.model_name,
            model_input=self.model_input,
            logprob=self.logprob,
            langgraph_step=self.langgraph_step,
            langgraph_node=self.langgraph_node,
        )


def split_chain_of_thought(drafts: tuple[StepDraft, ...]) -> tuple[StepDraft, ...]:
    """A trace made of one model reply and nothing else is a chain of thought: one step per non-empty line of it
    (tokens counted on the first)."""
    if len(drafts) != 1:
        return drafts
    (only,) = drafts
    lines = [line.strip() for line in only.reasoning.splitlines() if line.strip()]
    if len(lines) < 2:
        return drafts
    return tuple(
        only._replace(reasoning=line)
        if i == 0
        else only._replace(reasoning=line, prompt_tokens=None, completion_tokens=None)
        for i, line in enumerate(lines)
    )


def mark_handed_back(
    drafts: tuple[StepDraft, ...], answers: Mapping[str, str], output_tools: Collection[str] = ()
) -> tuple[StepDraft, ...]:
    """Each agent's answer handed back by a call, a :attr:`~reflect_otel.trace.StepKind.MESSAGE` (an answer passed
    on, not a lookup): the last step taken in an AGENT span, when it is a call that carries that agent's answer
    (``answers``: each AGENT span's output by span id, cleaned like the arguments), returned its own argument, or
    calls a tool the agent's definitions mark as output (``output_tools``). A sub-agent's ``final_answer`` to its
    manager is one; the run's own answer call is then made final by :func:`mark_final_answer`."""
    last: dict[str, int] = {}
    for position, draft in enumerate(drafts):
        if draft.agent_span_id is not None:
            last[draft.agent_span_id] = position
    marked = list(drafts)
    for agent, position in last.items():
        draft = drafts[position]
        answer = answers.get(agent)
        if draft.kind is StepKind.TOOL_CALL and _answer_call(draft, (answer,) if answer else (), output_tools):
            marked[position] = draft._replace(kind=StepKind.MESSAGE)
    return tuple(marked)


def mark_final_answer(
    drafts: tuple[StepDraft, ...],
    outputs: Iterable[str] = (),
    *,
    until_ns: int | None = None,
    output_tools: Collection[str] = (),
    stops_at_tools: bool = False,
) -> tuple[StepDraft, ...]:
    """The run's final step, by how the run ends, whatever its tools are called: its last step when that is a model
    turn that calls no tool, an agent's answer handed back (:func:`mark_handed_back`), or the call that ended the
    run carrying the run's answer: one of its arguments (read into objects and lists, bounded) is one of ``outputs``
    (the run's output, as the root and the first agent recorded it, cleaned like the arguments; an object or list
    written as JSON or a Python literal is compared as one), the call returned its own argument, as an answer tool
    does (Inspect's ``submit``), or its tool is one the agent's definitions mark as output (``output_tools``:
    pydantic-ai's output tools).

    A run can also stop at a tool and answer with its result (the OpenAI Agents SDK's ``tool_use_behavior``): its
    last call is final when what it returned is one of ``outputs``, or, when no output was recorded, with
    ``stops_at_tools`` (:attr:`.question.RunEnd.stops_at_tools`) when it was answered without error and was the
    only call of the model's last turn (of several, the one that stopped the run is not recorded). A last call that
    carries no answer is a step like any other: the run ended without one. With ``until_ns`` (when the agent whose
    output is the answer returned), steps begun after it are not the run's ending: they stay as they are, after
    it."""
    ending = len(drafts)
    if until_ns is not None:
        while ending and (drafts[ending - 1].start_time_ns or 0) > until_ns:
            ending -= 1
    if not ending:
        return drafts
    last = drafts[ending - 1]
    handed_back = last.kind is StepKind.MESSAGE and last.tool_name
    outputs = tuple(outputs)
    stopped = _returned_the_answer(last, outputs) or (
        stops_at_tools and not outputs and _stopping_call(drafts[:ending])
    )
    if last.kind is StepKind.REASONING or handed_back or stopped or _answer_call(last, outputs, output_tools):
        final = last._replace(kind=StepKind.FINAL_ANSWER, is_final_answer=True)
        return (*drafts[: ending - 1], final, *drafts[ending:])
    return drafts


def _returned_the_answer(call: StepDraft, outputs: Iterable[str]) -> bool:
    """The call's result is the run's output: the run stopped at it and answered with what it returned."""
    if call.kind is not StepKind.TOOL_CALL or not call.answered or not call.tool_result:
        return False
    result = _normal_answer(call.tool_result)
    if any(_normal_answer(output) == result for output in outputs):
        return True
    structured = _structured(call.tool_result)
    return structured is not None and any(
        _canonical(s) == _canonical(structured) for s in map(_structured, outputs) if s is not None
    )


def _stopping_call(drafts: tuple[StepDraft, ...]) -> bool:
    """The last draft is a call answered without error, the only call of the model turn that made it."""
    last = drafts[-1]
    if last.kind is not StepKind.TOOL_CALL or not last.answered or last.status is StepStatus.ERROR:
        return False
    return len(drafts) < 2 or drafts[-2].span_id != last.span_id


def _answer_call(call: StepDraft, outputs: Iterable[str], output_tools: Collection[str]) -> bool:
    if not call.tool_name:
        return False
    if call.tool_name in output_tools:
        return True
    answers = [answer for answer in (*outputs, call.tool_result or "") if answer]
    values = argument_values(call.tool_args)
    texts = {_normal_answer(str(v)) for v in values if _scalar(v)} - {""}
    if any(_normal_answer(answer) in texts for answer in answers):
        return True
    structured = [_canonical(s) for s in map(_structured, answers) if s is not None]
    return bool(structured) and any(
        _canonical(v) in structured for v in (call.tool_args, *values) if isinstance(v, Mapping | list)
    )


MAX_ARGUMENT_DEPTH = 3
"""How deep into objects and lists a call's arguments are read for the answer they carry."""
MAX_ARGUMENT_VALUES = 200
"""How many of a call's argument values (at any depth) are read for the answer they carry."""
_MAX_STRUCTURED_CHARS = 20_000


def argument_values(arguments: Mapping[str, Any]) -> list[object]:
    """A call's argument values, breadth first into objects and lists (``{"answers": ["a"]}``, ``{"args":
    [{"01": 15}]}``): every value met, the objects and lists as well as the text and numbers in them, at most
    :data:`MAX_ARGUMENT_DEPTH` deep and :data:`MAX_ARGUMENT_VALUES` in all."""
    out: list[object] = []
    level: list[object] = list(arguments.values())
    for _ in range(MAX_ARGUMENT_DEPTH):
        nested: list[object] = []
        for value in level:
            if len(out) >= MAX_ARGUMENT_VALUES:
                return out
            out.append(value)
            if isinstance(value, Mapping):
                nested.extend(value.values())
            elif isinstance(value, list):
                nested.extend(value)
        level = nested
    return out


def _scalar(value: object) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def _structured(text: str) -> object | None:
    """An object or list written as JSON or as a Python literal (an agent that returns ``str(dict)``); None for any
    other text, and for text too long or too deep to read safely."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")) or len(stripped) > _MAX_STRUCTURED_CHARS:
        return None
    value: object
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(stripped)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    return value if isinstance(value, dict | list | tuple) else None


def _canonical(value: object) -> str:
    """One text for equal objects and lists, whichever way they were written (key order, tuples, spacing)."""
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):  # keys of mixed types cannot be sorted
        return repr(value)


def _normal_answer(text: str) -> str:
    return " ".join(text.split()).casefold()
