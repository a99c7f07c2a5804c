"""Two instrumentations of one model call are one call: the enclosing span's."""

from __future__ import annotations

from reflect_otel.reading.assembly.duplicates import second_records
from reflect_otel.reading.assembly.messages import read_conversations
from reflect_otel.reading.assembly.tree import SpanTree
from reflect_otel.reading.spans import SpanRecord
from tests.assembly.recorded import LANGGRAPH_OBSERVED, LANGGRAPH_REACT, recorded_spans
from tests.spans import agent_root, llm


def _second_records(spans: list[SpanRecord]) -> frozenset[str]:
    tree = SpanTree.of(spans)
    return second_records(tree, read_conversations(tree))


def test_the_client_spans_beside_langchains_chat_model_spans_are_second_records() -> None:
    spans = recorded_spans(LANGGRAPH_OBSERVED)
    found = _second_records(spans)
    clients = {s.span_id for s in spans if s.scope == "openinference.instrumentation.openai"}
    assert len(clients) == 3 and found == clients


def test_a_run_whose_model_calls_follow_one_another_has_none() -> None:
    assert _second_records(recorded_spans(LANGGRAPH_REACT)) == frozenset()


def test_the_same_reply_twice_in_a_row_is_two_calls_and_a_different_reply_inside_is_its_own() -> None:
    root = agent_root("q")
    first = llm("same", parent=root.span_id, start=1, end=2)
    again = llm("same", parent=root.span_id, start=3, end=4)  # a repeated call, not a second record
    outer = llm("outer", parent=root.span_id, start=10, end=20)
    inner = llm("inner", parent=root.span_id, start=11, end=12)  # inside, but another reply
    assert _second_records([root, first, again, outer, inner]) == frozenset()


def test_of_two_records_the_enclosing_one_is_kept() -> None:
    root = agent_root("q")
    outer = llm("same", [("f", "{}", "c1")], parent=root.span_id, start=10, end=20)
    inner = llm("same", [("f", "{}", "c1")], parent=root.span_id, start=11, end=19)
    assert _second_records([root, inner, outer]) == {inner.span_id}
