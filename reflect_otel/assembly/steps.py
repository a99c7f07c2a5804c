"""Steps before they are numbered (:class:`StepDraft`, typed like :class:`~reflect_otel.trace.Step`), and the two
passes that shape the list: a lone model reply split into its chain of thought, and the final answer marked (by how
the run ends, whatever its tools are called)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from reflect_otel.trace import Step, StepKind, StepStatus

from .context import StepContext

__all__ = ["StepDraft", "mark_final_answer", "split_chain_of_thought"]


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
    langgraph_step: int | None = None
    langgraph_node: str | None = None
    answered: bool = False
    """A result is attached (a tool run's, or one the model was shown)."""

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


def mark_final_answer(
    drafts: tuple[StepDraft, ...], outputs: Iterable[str] = (), *, until_ns: int | None = None
) -> tuple[StepDraft, ...]:
    """The run's final step, by how the run ends, whatever its tools are called: its last step when that is a model
    turn that calls no tool, or when it is the call that ended the run carrying the run's answer: one of its
    arguments is one of ``outputs`` (the run's output, as the root and the first agent recorded it, cleaned like
    the arguments), or the call returned its own argument, as an answer tool does (Inspect's ``submit``). A last
    call that carries no answer is a step like any other: the run ended without one. With ``until_ns`` (when the
    agent whose output is the answer returned), steps begun after it are not the run's ending: they stay as they
    are, after it."""
    ending = len(drafts)
    if until_ns is not None:
        while ending and (drafts[ending - 1].start_time_ns or 0) > until_ns:
            ending -= 1
    if not ending:
        return drafts
    last = drafts[ending - 1]
    if last.kind is StepKind.REASONING or (last.tool_name and _answers_with(last, outputs)):
        final = last._replace(kind=StepKind.FINAL_ANSWER, is_final_answer=True)
        return (*drafts[: ending - 1], final, *drafts[ending:])
    return drafts


def _answers_with(call: StepDraft, outputs: Iterable[str]) -> bool:
    values = {_normal_answer(v) for v in _scalar_values(call.tool_args)} - {""}
    answers = [*outputs, call.tool_result or ""]
    return any(_normal_answer(answer) in values for answer in answers if answer)


def _scalar_values(arguments: Mapping[str, Any]) -> list[str]:
    """A call's argument values that are text or numbers, one level into a list (``{"answers": ["a"]}``)."""
    out = []
    for value in arguments.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str | int | float) and not isinstance(item, bool):
                out.append(str(item))
    return out


def _normal_answer(text: str) -> str:
    return " ".join(text.split()).casefold()
