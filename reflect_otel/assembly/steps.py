"""Steps before they are numbered (:class:`StepDraft`, typed like :class:`~reflect_otel.trace.Step`), and the two
passes that shape the list: a lone model reply split into its chain of thought, and the final answer marked."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from reflect_otel.trace import FINAL_ANSWER_TOOLS, Step, StepKind, StepStatus

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


def mark_final_answer(drafts: tuple[StepDraft, ...]) -> tuple[StepDraft, ...]:
    """The last call of a final-answer tool, else a last step that is a model's reply, is the final answer."""
    chosen = next(
        (i for i in reversed(range(len(drafts))) if (drafts[i].tool_name or "").casefold() in FINAL_ANSWER_TOOLS), None
    )
    if chosen is None and drafts and drafts[-1].kind is StepKind.REASONING:
        chosen = len(drafts) - 1
    if chosen is None:
        return drafts
    final = drafts[chosen]._replace(kind=StepKind.FINAL_ANSWER, is_final_answer=True)
    return (*drafts[:chosen], final, *drafts[chosen + 1 :])
