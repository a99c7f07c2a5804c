"""Step drafts and the two passes that shape them: chain of thought, final answer (by how the run ends)."""

from __future__ import annotations

import pytest

from reflect_otel.reading.assembly.context import StepContext
from reflect_otel.reading.assembly.steps import (
    MAX_ARGUMENT_DEPTH,
    MAX_ARGUMENT_VALUES,
    StepDraft,
    argument_values,
    mark_final_answer,
    mark_handed_back,
    split_chain_of_thought,
)
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


@pytest.mark.parametrize(
    ("args", "output"),
    [
        ({"args": [{"01": 15, "02": 12}]}, "{'01': 15, '02': 12}"),  # str(dict), as a Python agent returns it
        ({"value": 396, "explanation": "17*23+5"}, '{"explanation": "17*23+5", "value": 396}'),  # output tool's JSON
        ({"answer": {"short": "396", "detailed": "17*23 is 391"}}, "396"),  # a text inside an object
        ({"answer": [["Paris", 2], ["Lyon", 3]]}, '[["Paris", 2], ["Lyon", 3]]'),
    ],
)
def test_an_answer_given_as_an_object_or_list_is_read(args: dict[str, object], output: str) -> None:
    last = _call("final_answer")._replace(tool_args=args, tool_result="")
    assert mark_final_answer((_call("search"), last), (output,))[-1].is_final_answer
    other = _call("final_answer")._replace(tool_args={"args": [{"01": 14, "02": 12}]})
    assert not mark_final_answer((other,), ("{'01': 15, '02': 12}",))[-1].is_final_answer


def test_arguments_are_read_to_a_bounded_depth_and_count() -> None:
    deep: object = "396"
    for _ in range(MAX_ARGUMENT_DEPTH):
        deep = {"inner": deep}
    assert "396" not in argument_values({"answer": deep})
    assert not mark_final_answer((_call("final_answer")._replace(tool_args={"answer": deep}),), ("396",))[
        0
    ].is_final_answer
    wide = {"answer": ["x"] * (2 * MAX_ARGUMENT_VALUES) + ["396"]}
    assert len(argument_values(wide)) == MAX_ARGUMENT_VALUES
    nested = "[" * 10_000 + "]" * 10_000  # too deep for either parser: read as no answer, nothing raised
    assert not mark_final_answer((_call("f")._replace(tool_args={"a": []}),), (nested,))[0].is_final_answer
    long = list(range(6_000))  # an output this long is not parsed, even when it is the argument
    assert not mark_final_answer((_call("f")._replace(tool_args={"a": long}),), (str(long),))[0].is_final_answer
    short = list(range(60))
    assert mark_final_answer((_call("f")._replace(tool_args={"a": short}),), (str(short),))[0].is_final_answer


def test_a_tool_the_definitions_mark_as_output_ends_the_run_with_its_answer() -> None:
    """pydantic-ai's output tool: its arguments are the run's output, whatever the run recorded as output."""
    last = _call("return_fruit")._replace(tool_args={"name": "banana"})
    assert mark_final_answer((_call("search"), last), (), output_tools={"return_fruit"})[-1].is_final_answer
    assert not mark_final_answer((_call("search"), last), (), output_tools={"other"})[-1].is_final_answer
    early = mark_final_answer((last, _call("search")), (), output_tools={"return_fruit"})
    assert not any(d.is_final_answer for d in early)  # an output call the run went on after (a retry) is no end


def test_a_run_stopped_at_a_tool_ends_on_its_result() -> None:
    """A run whose recorded output is what its last call returned stopped there; with no output recorded, only a
    run known to stop at tools (``stops_at_tools``) does, and only at a call answered without error that was the
    only call of the model's last turn."""
    lookup = _call("add")._replace(tool_args={"a": 391, "b": 5}, tool_result="396", answered=True)
    assert mark_final_answer((_call("multiply"), lookup), ("396",))[-1].is_final_answer
    assert mark_final_answer((_call("multiply"), lookup), (" 396\n",))[-1].is_final_answer
    rows = lookup._replace(tool_result='{"rows": [1, 2]}')
    assert mark_final_answer((rows,), ('{"rows":[1,2]}',))[-1].is_final_answer  # the same object, spelled otherwise
    assert not mark_final_answer((lookup,), ("397",))[-1].is_final_answer
    assert not mark_final_answer((lookup,), ())[-1].is_final_answer  # nothing says the run stopped there
    assert mark_final_answer((_reply("x"), lookup), (), stops_at_tools=True)[-1].is_final_answer
    failed = lookup._replace(status=StepStatus.ERROR)
    unanswered = lookup._replace(answered=False, tool_result=None)
    for last in (failed, unanswered):
        assert mark_final_answer((last,), (), stops_at_tools=True) == (last,)
    sibling = lookup._replace(tool_name="multiply")  # two calls of one model turn: which one stopped the run?
    assert mark_final_answer((sibling, lookup), (), stops_at_tools=True) == (sibling, lookup)
    assert mark_final_answer((lookup,), ("another answer",), stops_at_tools=True) == (lookup,)


def _in(agent: str, draft: StepDraft) -> StepDraft:
    return draft._replace(agent=agent, agent_span_id=f"span-{agent}")


def test_a_sub_agents_last_call_carrying_its_answer_hands_it_back() -> None:
    """A manager asks a helper, the helper ends with a call carrying its own output (to its manager, not the run's
    answer): a message, not a lookup; the manager's last call carrying the run's answer is the final step."""
    helper_answer = "Top 10: Bad Boys for Life, Sonic, ..."
    drafts = (
        _in("manager", _reply("ask the helper")),
        _in("helper", _call("web_search")._replace(tool_args={"query": "top 10 2020"}, tool_result="...")),
        _in("helper", _call("final_answer")._replace(tool_args={"answer": helper_answer})),
        _in("manager", _call("final_answer")._replace(tool_args={"args": [10]}, tool_result="")),
    )
    outputs = {"span-helper": helper_answer, "span-manager": "10"}
    handed = mark_handed_back(drafts, outputs)
    assert [d.kind for d in handed] == [StepKind.REASONING, StepKind.TOOL_CALL, StepKind.MESSAGE, StepKind.MESSAGE]
    marked = mark_final_answer(handed, ("10",))
    assert [d.kind for d in marked] == [
        StepKind.REASONING,
        StepKind.TOOL_CALL,
        StepKind.MESSAGE,
        StepKind.FINAL_ANSWER,
    ]
    assert [d.is_final_answer for d in marked] == [False, False, False, True]


def test_an_agents_last_call_that_carries_no_answer_is_a_lookup() -> None:
    """A helper that stopped on a search, an earlier answer-like call, an agent that recorded no output: lookups."""
    drafts = (
        _in("helper", _call("final_answer")._replace(tool_args={"answer": "Paris"})),
        _in("helper", _call("web_search")._replace(tool_args={"query": "capital of France"}, tool_result="Paris")),
        _in("silent", _call("final_answer")._replace(tool_args={"answer": "y"}, tool_result="")),
        _reply("done"),
    )
    assert mark_handed_back(drafts, {"span-helper": "Paris"}) == drafts
    # returning its own argument, or an output tool, is a hand-back whatever the agent recorded
    echo = _in("silent", _call("submit")._replace(tool_args={"answer": "y"}, tool_result="y"))
    assert mark_handed_back((echo,), {})[0].kind is StepKind.MESSAGE
    assert mark_handed_back((drafts[2],), {}, {"final_answer"})[0].kind is StepKind.MESSAGE


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
