"""Step drafts and the two passes that shape them: chain of thought, final answer."""

from __future__ import annotations

import pytest

from reflect_otel.assembly.context import StepContext
from reflect_otel.assembly.steps import StepDraft, mark_final_answer, split_chain_of_thought
from reflect_otel.trace import StepKind, StepStatus

_CONTEXT = StepContext(
    agent="a",
    start_time_ns=1,
    end_time_ns=2,
    status=StepStatus.OK,
    status_message=None,
    langgraph_step=None,
    langgraph_node=None,
    metadata={},
)


def _reply(text: str, **tokens: int) -> StepDraft:
    return StepDraft.of("00000000000000a1", StepKind.REASONING, _CONTEXT)._replace(reasoning=text, **tokens)


def _call(name: str) -> StepDraft:
    return StepDraft.of("00000000000000a2", StepKind.TOOL_CALL, _CONTEXT)._replace(tool_name=name)


def test_a_lone_reply_splits_into_its_lines_with_the_tokens_on_the_first() -> None:
    (only,) = drafts = (_reply("Step 1: 2+2=4\n\n  Step 2: 4*3=12  \nSo 12", prompt_tokens=9, completion_tokens=5),)
    lines = split_chain_of_thought(drafts)
    assert [d.reasoning for d in lines] == ["Step 1: 2+2=4", "Step 2: 4*3=12", "So 12"]
    assert [(d.prompt_tokens, d.completion_tokens) for d in lines] == [(9, 5), (None, None), (None, None)]
    assert all(
        d._replace(reasoning="", prompt_tokens=None, completion_tokens=None)
        == only._replace(reasoning="", prompt_tokens=None, completion_tokens=None)
        for d in lines
    )
    assert split_chain_of_thought((_reply("one line"),)) == (_reply("one line"),)


def test_the_last_final_answer_tool_call_wins_over_a_later_reply() -> None:
    drafts = (_call("search"), _call("Final_Answer"), _reply("bye"))
    marked = mark_final_answer(drafts)
    assert [d.kind for d in marked] == [StepKind.TOOL_CALL, StepKind.FINAL_ANSWER, StepKind.REASONING]
    assert [d.is_final_answer for d in marked] == [False, True, False]


@pytest.mark.parametrize("tool", ["final_result", "Submit", "answer", "submit_final_answer"])
def test_each_final_answer_tool_gives_the_answer_step(tool: str) -> None:
    """pydantic-ai's output tool, Inspect's submit and the rest: the one list assembly and corrections share."""
    marked = mark_final_answer((_call("search"), _call(tool)._replace(tool_args={"answer": "42"})))
    assert [d.is_final_answer for d in marked] == [False, True]
    assert marked[-1].step(2).kind is StepKind.FINAL_ANSWER


def test_without_such_a_tool_the_last_reply_is_the_answer_and_a_last_tool_call_is_not() -> None:
    assert mark_final_answer((_call("search"), _reply("42")))[-1].kind is StepKind.FINAL_ANSWER
    assert mark_final_answer((_reply("thinking"), _call("search"))) == (_reply("thinking"), _call("search"))
    assert mark_final_answer(()) == ()


def test_a_draft_becomes_the_step_at_its_index() -> None:
    step = _call("search")._replace(tool_args={"q": 1}, tool_result="r", answered=True).step(3)
    assert (step.index, step.kind, step.tool_name, step.tool_args, step.tool_result) == (
        3,
        StepKind.TOOL_CALL,
        "search",
        {"q": 1},
        "r",
    )
    assert (step.agent, step.start_time_ns, step.end_time_ns, step.status) == ("a", 1, 2, StepStatus.OK)
