"""The first pass: one frozen span tree, de-duplicated, parented, walked, its root found."""

from __future__ import annotations

import dataclasses
import random

import pytest

from reflect_otel.errors import InputError
from reflect_otel.reading.assembly.tree import AGENT, LLM, SpanTree
from tests.assembly.recorded import AUTOGEN, HANDOFF, LANGGRAPH_OBSERVED, recorded_spans
from tests.spans import TRACE_ID, agent_root, llm, span, tool


def test_a_recorded_run_walks_from_its_root_depth_first_in_time_order() -> None:
    spans = recorded_spans(HANDOFF)
    tree = SpanTree.of(random.Random(7).sample(spans, len(spans)))  # arrival order does not matter
    assert tree.root.name == "Agent workflow" and tree.root.parent_id is None
    assert tree.order[0].span is tree.root
    assert sorted(p.span.span_id for p in tree.order) == sorted(s.span_id for s in spans)
    position = {p.span.span_id: i for i, p in enumerate(tree.order)}
    for placed in tree.order[1:]:  # every span after its parent
        assert position[placed.span.parent_id] < position[placed.span.span_id]  # type: ignore[index]
    names = [(p.span.name, p.agent) for p in tree.order if p.kind in (LLM, "TOOL")]
    assert names[:2] == [("generation", "triage"), ("handoff to calculator", "triage")]
    assert names[2:4] == [("generation", "calculator"), ("multiply", "calculator")]
    assert (tree.duplicates, tree.orphans, tree.first_agent) == (0, 0, tree.root)


def test_an_llm_span_inside_another_is_nested_under_its_parent() -> None:
    tree = SpanTree.of(recorded_spans(AUTOGEN))
    clients = [p.span for p in tree.order if p.span.name == "ChatCompletion"]
    assert len(clients) == 3 and tree.nested_llm == {s.span_id for s in clients}
    for client in clients:
        assert tree.inner_llm[client.parent_id] == (client,)  # type: ignore[index]
        assert tree.spans[client.parent_id].attributes["openinference.span.kind"] == LLM  # type: ignore[index]


def test_duplicates_are_counted_and_the_first_copy_kept() -> None:
    root = agent_root("q")
    first = llm("one", parent=root.span_id, start=1)
    again = dataclasses.replace(first, name="second copy")
    tree = SpanTree.of([root, first, again])
    assert tree.duplicates == 1 and tree.spans[first.span_id].name == "llm"


def test_a_span_whose_parent_never_arrived_is_an_orphan_placed_by_time() -> None:
    root = agent_root("q", start=5)
    stray = llm("x", parent="00000000000000ff", start=1)
    tree = SpanTree.of([root, stray])
    assert tree.root is not None and tree.root.span_id == root.span_id  # a local root wins over an earlier orphan
    assert tree.orphans == 1 and [p.span.span_id for p in tree.order] == [stray.span_id, root.span_id]


def test_a_cycle_of_parents_is_placed_and_counted() -> None:
    a = span("CHAIN", sid="000000000000000a", parent="000000000000000b", start=1)
    b = span("CHAIN", sid="000000000000000b", parent="000000000000000a", start=2)
    tree = SpanTree.of([a, b])
    assert tree.root.span_id == a.span_id and tree.orphans == 2 and len(tree.order) == 2


def test_the_agent_name_comes_from_the_enclosing_agent_span() -> None:
    root = span(AGENT, name="planner", **{"agent.name": "Planner"})
    step = tool("search", "r", parent=root.span_id, start=1)
    tree = SpanTree.of([root, step])
    assert [(p.span.span_id, p.agent) for p in tree.order] == [(root.span_id, "Planner"), (step.span_id, "Planner")]


def test_the_tree_is_frozen() -> None:
    tree = SpanTree.of(recorded_spans(LANGGRAPH_OBSERVED))
    with pytest.raises(dataclasses.FrozenInstanceError):
        tree.root = tree.order[-1].span  # type: ignore[misc]
    with pytest.raises(TypeError):
        tree.spans["x"] = tree.root  # type: ignore[index]


def test_no_spans_or_two_traces_are_refused() -> None:
    with pytest.raises(InputError, match="no spans"):
        SpanTree.of([])
    other = span("CHAIN", trace_id=TRACE_ID.replace("0", "f"))
    with pytest.raises(InputError, match="assemble one trace"):
        SpanTree.of([span("CHAIN"), other])
