"""A TOOL span read as the tool run it records: its tool, the call it answers, its result out of its wrappers."""

from __future__ import annotations

import json

from reflect_otel.reading.assembly.tool_runs import ToolRun, read_tool_run
from reflect_otel.reading.assembly.tree import TOOL, SpanTree
from reflect_otel.reading.spans import SpanRecord
from tests.assembly.recorded import LANGGRAPH_REACT, recorded_spans, rules
from tests.spans import agent_root, span, tool


def _runs(spans: list[SpanRecord]) -> list[ToolRun]:
    tree = SpanTree.of(spans)
    return [read_tool_run(p, rules()) for p in tree.order if p.kind == TOOL]


def test_langchains_tool_message_names_the_call_and_holds_the_result() -> None:
    runs = _runs(recorded_spans(LANGGRAPH_REACT))
    assert [(r.name, r.result, r.named) for r in runs] == [
        ("lookup_population", "2100000", True),
        ("add", "2101000", True),
        ("lookup_population", "2800000", True),
    ]
    assert [r.call_id for r in runs] == ["call_paris", "call_add", "call_rome"]
    assert all(json.loads(r.result_raw or "")["data"]["tool_call_id"] == r.call_id for r in runs)


def test_a_function_response_is_unwrapped_and_the_wrapper_kept_raw() -> None:
    root = agent_root("q")
    wrapped = json.dumps({"id": "fc-1", "name": "multiply", "response": {"result": 391}})
    (run,) = _runs([root, tool("multiply", wrapped, parent=root.span_id, start=1)])
    assert (run.call_id, run.result, run.result_raw) == ("fc-1", "391", wrapped)


def test_an_anonymous_action_and_a_callable_objects_name() -> None:
    root = agent_root("q")
    handoff = span(TOOL, name="transfer", parent=root.span_id, start=1, **{"output.value": "ok"})
    call = tool("Search.__call__", "r", parent=root.span_id, start=2, **{"input.value": '{"q": 1}'})
    first, second = _runs([root, handoff, call])
    assert (first.name, first.named, first.call_id) == ("transfer", False, None)
    assert (second.name, second.named, second.arguments) == ("Search", True, '{"q": 1}')


def test_secrets_in_the_result_are_replaced_and_counted_once() -> None:
    root = agent_root("q")
    key = "sk-" + "Q" * 24
    wrapped = json.dumps({"result": f"token {key}"})
    (run,) = _runs([root, tool("login", wrapped, parent=root.span_id, start=1)])
    assert key not in run.result and key not in (run.result_raw or "") and run.secrets == 1
