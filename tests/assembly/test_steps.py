"""Step drafts and the two passes that shape them: chain of thought, final answer (by how the run ends)."""

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


def test_a_reply_after_an_answer_tool_call_is_the_answer() -> None:
    """How the run ends says which step answers: a model turn after the call is the run's last word."""
    drafts = (_call("search"), _call("Final_Answer")._replace(tool_args={"answer": "bye"}), _reply("bye"))
    marked = mark_final_answer(drafts, ("bye",))
    assert [d.kind for d in marked] == [StepKind.TOOL_CALL, StepKind.TOOL_CALL, StepKind.FINAL_ANSWER]
    assert [d.is_final_answer for d in marked] == [False, False, True]


@pytest.mark.parametrize(
    ("tool", "result", "outputs"),
    [
        ("final_result", "Final result processed.", ("42",)),  # pydantic-ai: the agent's output is the argument
        ("Submit", "42", ()),  # Inspect: submit returns its answer (the run's output is not recorded)
        ("submit_final_answer", None, ("  42 ",)),
        ("respond", None, ("42",)),  # no name is needed: the call that ended the run carries its answer
    ],
)
def test_a_last_call_carrying_the_runs_answer_is_the_answer_step(
    tool: str, result: str | None, outputs: tuple[str, ...]
) -> None:
    """pydantic-ai's output tool, Inspect's submit and any agent's own: the call that ended the run with its answer."""
    last = _call(tool)._replace(tool_args={"answer": "42"}, tool_result=result)
    marked = mark_final_answer((_call("search"), last), outputs)
    assert [d.is_final_answer for d in marked] == [False, True]
    assert marked[-1].step(2).kind is StepKind.FINAL_ANSWER


def test_a_last_call_without_the_runs_answer_is_no_answer_whatever_its_name() -> None:
    """A run that stopped on a search, or on an answer tool given something else than what the run answered."""
    for tool, args in (("search", {"q": "the answer"}), ("final_answer", {"answer": "41"}), ("answer", {})):
        drafts = (_reply("thinking"), _call(tool)._replace(tool_args=args, tool_result="ok"))
        assert mark_final_answer(drafts, ("42",)) == drafts
    earlier = (_call("final_answer")._replace(tool_args={"answer": "42"}, tool_result="42"), _call("search"))
    assert mark_final_answer(earlier, ("42",)) == earlier  # an answer call the run went on after is not its end


def test_turns_begun_after_the_answering_agent_returned_are_not_the_runs_end() -> None:
    """A harness restating the agent's answer after the agent returned it: the agent's last step is the answer."""
    answer = _call("final_answer")._replace(tool_args={"args": ["33149"]}, start_time_ns=10)
    harness = _reply("FINAL ANSWER: 33149")._replace(start_time_ns=30, agent=None)
    marked = mark_final_answer((_call("search"), answer, harness), ("33149",), until_ns=20)
    assert [d.is_final_answer for d in marked] == [False, True, False]
    assert marked[-1] == harness
    # without the agent's end (the root gave the answer), the last turn is the run's end
    assert mark_final_answer((_call("search"), answer, harness), ("33149",))[-1].is_final_answer
    # an agent's own last reply is its answer; nothing begun before the agent ended: nothing marked
    reply = _reply("33149")._replace(start_time_ns=15)
    assert mark_final_answer((reply, harness), (), until_ns=20)[0].is_final_answer
    assert mark_final_answer((harness,), (), until_ns=20) == (harness,)


def test_without_such_a_call_the_last_reply_is_the_answer_and_a_last_tool_call_is_not() -> None:
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
