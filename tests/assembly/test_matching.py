"""The CallMatcher: each tool run and each tool message the model was shown answers one of the model's calls."""

from __future__ import annotations

import json
from dataclasses import replace

from reflect_otel.reading.assembly.actions import read_actions
from reflect_otel.reading.assembly.duplicates import second_records
from reflect_otel.reading.assembly.matching import Matched, match_calls
from reflect_otel.reading.assembly.messages import read_conversations
from reflect_otel.reading.assembly.tree import SpanTree
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.trace import StepKind, StepStatus
from tests.assembly.recorded import HANDOFF, LITELLM, LLAMAINDEX_REACT, SMOLAGENTS_CODE, recorded_spans, rules
from tests.spans import agent_root, llm, span, tool


def _matched(spans: list[SpanRecord]) -> Matched:
    tree = SpanTree.of(spans)
    conversations = read_conversations(tree)
    return match_calls(read_actions(tree, conversations, second_records(tree, conversations), rules()).actions, rules())


def _results(matched: Matched) -> list[tuple[str | None, str | None]]:
    return [(d.tool_name, d.tool_result) for d in matched.drafts]


def test_tool_messages_answer_the_calls_when_no_tool_ran_as_a_span() -> None:
    assert _results(_matched(recorded_spans(LITELLM))) == [("multiply", "391"), ("add", "396"), (None, None)]


def test_an_anonymous_handoff_answers_the_call_that_asked_for_it() -> None:
    matched = _matched(recorded_spans(HANDOFF))
    assert _results(matched)[0] == ("transfer_to_calculator", "calculator")
    assert matched.drafts[0].tool_span_id != matched.drafts[0].span_id  # the handoff's span, on the model's step


def test_a_reply_that_writes_the_action_becomes_the_tool_call() -> None:
    for recording in (LLAMAINDEX_REACT, SMOLAGENTS_CODE):  # ReAct text, and a code agent's code
        drafts = _matched(recorded_spans(recording)).drafts
        assert [(d.tool_name, d.tool_args, d.tool_result) for d in drafts[:2]] == [
            ("multiply", {"a": 17, "b": 23}, "391"),
            ("add", {"a": 391, "b": 5}, "396"),
        ]
        assert all(d.kind is StepKind.TOOL_CALL and d.answered and "Thought" in d.reasoning for d in drafts[:2])


def test_ids_match_out_of_order_and_names_match_the_oldest_call() -> None:
    root = agent_root("q")
    asks = llm(
        "",
        [("search", '{"q": 1}', ""), ("search", '{"q": 2}', ""), ("fetch", "{}", "id-f")],
        parent=root.span_id,
        start=1,
    )
    fetched = tool("fetch", "F", parent=root.span_id, start=2, **{"tool_call.id": "id-f"})
    one, two = (tool("search", f"S{i}", parent=root.span_id, start=3 + i) for i in (1, 2))
    assert _results(_matched([root, asks, two, one, fetched])) == [("search", "S1"), ("search", "S2"), ("fetch", "F")]


def test_a_tool_called_from_code_is_a_step_of_its_own_and_a_failed_run_fails_its_step() -> None:
    root = agent_root("q")
    asks = llm("", [("divide", '{"a": 1, "b": 0}', "c1")], parent=root.span_id, start=1)
    failed = span(
        "TOOL",
        parent=root.span_id,
        start=2,
        **{"tool.name": "divide", "tool_call.id": "c1", "output.value": "ZeroDivisionError"},
    )
    failed = replace(failed, status="error", status_message="division by zero")
    logged = tool("log", "ok", parent=root.span_id, start=3, **{"input.value": '{"line": "x"}'})
    drafts = _matched([root, asks, failed, logged]).drafts
    assert (drafts[0].status, drafts[0].status_message, drafts[0].end_time_ns) == (
        StepStatus.ERROR,
        "division by zero",
        failed.end_ns,
    )
    assert (drafts[1].span_id, drafts[1].tool_span_id, drafts[1].tool_args) == (
        logged.span_id,
        logged.span_id,
        {"line": "x"},
    )


def test_the_text_the_model_was_shown_replaces_a_result_object() -> None:
    root = agent_root("q")
    asks = llm("", [("lookup", "{}", "c1")], parent=root.span_id, start=1)
    ran = tool(
        "lookup", json.dumps({"rows": 3, "status": "ok"}), parent=root.span_id, start=2, **{"tool_call.id": "c1"}
    )
    shown = llm(
        "done",
        parent=root.span_id,
        start=3,
        **{
            "llm.input_messages.0.message.role": "tool",
            "llm.input_messages.0.message.tool_call_id": "c1",
            "llm.input_messages.0.message.content": "3 rows",
        },
    )
    assert _results(_matched([root, asks, ran, shown]))[0] == ("lookup", "3 rows")
    text_result = tool("lookup", "three rows", parent=root.span_id, start=2, **{"tool_call.id": "c1"})
    assert _results(_matched([root, asks, text_result, shown]))[0] == ("lookup", "three rows")  # text is kept


def test_a_run_answers_a_call_of_its_own_agent_not_one_a_sub_agent_left_unanswered() -> None:
    """A helper agent ends with a call no tool span recorded (smolagents' tool-calling agent answering its manager);
    the manager's code then runs the tool of the same name: that run is the manager's step, not the helper's."""
    manager = span("AGENT", name="manager", end=100, **{"output.value": "10"})
    plan = llm("Thought: ask the helper", parent=manager.span_id, start=1)
    helper = span("AGENT", name="helper", parent=manager.span_id, start=2, end=10, **{"output.value": "Top 10: ..."})
    handing = llm("", [("final_answer", '{"answer": "Top 10: ..."}', "c9")], parent=helper.span_id, start=3)
    code = llm("Thought: it is 10.\nfinal_answer(10)", parent=manager.span_id, start=11)
    ran = tool("final_answer", "", parent=manager.span_id, start=12, **{"input.value": '{"args": [10]}'})
    drafts = _matched([manager, plan, helper, handing, code, ran]).drafts
    assert [(d.agent, d.tool_name, d.tool_args, d.tool_result, d.tool_span_id) for d in drafts] == [
        ("manager", None, {}, None, None),
        ("helper", "final_answer", {"answer": "Top 10: ..."}, None, None),
        ("manager", "final_answer", {"args": [10]}, "", ran.span_id),
    ]
    # with no reply of its own naming the tool, the run still answers the other agent's call (the old rule)
    drafts = _matched([manager, plan, helper, handing, ran]).drafts
    assert (drafts[1].tool_result, drafts[1].tool_span_id) == ("", ran.span_id)
