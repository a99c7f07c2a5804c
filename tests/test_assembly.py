"""The assembly rules on hand-made spans: each rule, and each way spans arrive broken."""

from __future__ import annotations

import json
import random

import pytest
from opentelemetry.sdk.trace import TracerProvider

from reflect_otel.collectors.span_processor import ReflectSpanProcessor
from reflect_otel.errors import InputError
from reflect_otel.reading.assembly import AssemblyLimits, assemble_trace
from reflect_otel.trace import StepKind, StructuredTrace, WarningCode
from tests.spans import TRACE_ID, agent_root, llm, span, span_id, tool


def _codes(trace: StructuredTrace) -> set[WarningCode]:
    return {w.code for w in trace.warnings}


def test_tool_results_attach_by_call_id_even_out_of_order() -> None:
    root = agent_root("q", "done")
    decide = llm("two calls", [("a", '{"x": 1}', "id-a"), ("b", '{"y": 2}', "id-b")], parent=root.span_id, start=1)
    # b finishes first and both carry only a LangChain ToolMessage with the call id
    tool_b = tool(
        "b",
        json.dumps({"type": "tool", "data": {"content": "B!", "tool_call_id": "id-b"}}),
        parent=root.span_id,
        start=2,
    )
    tool_a = tool(
        "a",
        json.dumps({"type": "tool", "data": {"content": "A!", "tool_call_id": "id-a"}}),
        parent=root.span_id,
        start=3,
    )
    final = llm("done", parent=root.span_id, start=4)
    trace = assemble_trace([final, tool_a, root, tool_b, decide])
    assert [(s.tool_name, s.tool_result, s.tool_span_id) for s in trace.steps] == [
        ("a", "A!", tool_a.span_id),
        ("b", "B!", tool_b.span_id),
        (None, None, None),
    ]
    assert trace.steps[-1].is_final_answer and trace.final_answer == "done"


def test_tool_without_call_id_answers_oldest_call_of_same_name() -> None:
    root = agent_root("q")
    first = llm("", [("search", '{"q": "one"}', ""), ("search", '{"q": "two"}', "")], parent=root.span_id, start=1)
    results = [tool("search", f"r{i}", parent=root.span_id, start=2 + i) for i in range(2)]
    trace = assemble_trace([root, first, *results])
    assert [(s.tool_args["q"], s.tool_result) for s in trace.steps] == [("one", "r0"), ("two", "r1")]


def test_a_reply_that_writes_a_tool_call_is_that_call() -> None:
    """ReAct and code agents: the model writes the call in its text, the framework runs the tool."""
    root = agent_root("q", "42")
    code = llm("Thought: compute.\nCode: x = calc(6, 7)", parent=root.span_id, start=1)
    calc = tool("calc", "42", parent=code.span_id, start=2, **{"input.value": '{"a": 6, "b": 7}'})
    answer = llm("The answer is 42", parent=root.span_id, start=3)
    trace = assemble_trace([root, answer, calc, code])
    assert [s.kind for s in trace.steps] == [StepKind.TOOL_CALL, StepKind.FINAL_ANSWER]
    step = trace.steps[0]
    assert (step.span_id, step.tool_span_id) == (code.span_id, calc.span_id)
    assert (step.tool_name, step.tool_args, step.tool_result) == ("calc", {"a": 6, "b": 7}, "42")
    assert step.reasoning == "Thought: compute.\nCode: x = calc(6, 7)"


def test_tools_invoked_from_code_are_steps_in_time_order() -> None:
    root = agent_root("q", "42")
    plan = llm("Thought: I will compute it.", parent=root.span_id, start=1)  # names no tool
    calc = tool("calc", "42", parent=root.span_id, start=2, **{"input.value": '{"a": 6, "b": 7}'})
    answer = llm("The answer is 42", parent=root.span_id, start=3)
    trace = assemble_trace([root, answer, calc, plan])
    assert [s.kind for s in trace.steps] == [StepKind.REASONING, StepKind.TOOL_CALL, StepKind.FINAL_ANSWER]
    assert trace.steps[1].span_id == trace.steps[1].tool_span_id == calc.span_id
    assert trace.steps[1].tool_args == {"a": 6, "b": 7}


def test_a_tool_result_object_reads_as_its_text_parts() -> None:
    root = agent_root("q", "42")
    decide = llm("calc", [("calc", '{"a": 6}', "c1")], parent=root.span_id, start=1)
    wrapped = '{"content": [{"type": "text", "text": "42"}], "isError": false}'  # MCP's CallToolResult
    trace = assemble_trace([root, decide, tool("calc", wrapped, parent=root.span_id, start=2)])
    assert trace.steps[0].tool_result == "42"


def test_final_answer_tool_is_the_final_step() -> None:
    root = agent_root("q")
    decide = llm("submit", [("final_answer", '{"answer": "Paris"}', "f1")], parent=root.span_id, start=1)
    trace = assemble_trace([root, decide, tool("final_answer", "Paris", parent=root.span_id, start=2)])
    assert trace.steps[0].kind is StepKind.FINAL_ANSWER and trace.steps[0].is_final_answer
    assert trace.final_answer == "Paris"  # root has no output: taken from the final-answer step


def test_siblings_ordered_by_start_then_end_time() -> None:
    root = agent_root("q")
    late_end = llm("second", parent=root.span_id, start=5)
    early_end = span("LLM", parent=root.span_id, start=5, end=5, **{"llm.output_messages.0.message.content": "first"})
    trace = assemble_trace([root, late_end.__class__(**{**_fields(late_end), "end_ns": 9}), early_end])
    assert [s.reasoning for s in trace.steps] == ["first", "second"]


def _fields(record: object) -> dict[str, object]:
    return {name: getattr(record, name) for name in record.__slots__}  # type: ignore[attr-defined]


def test_kind_not_name_decides() -> None:
    root = agent_root("q")
    # named like an LLM but a CHAIN; named "agent" but an LLM
    chain = span("CHAIN", parent=root.span_id, name="ChatOpenAI", start=1, **{"output.value": "noise"})
    model = llm("real", parent=root.span_id, start=2)
    trace = assemble_trace([root, chain, model])
    assert [s.span_id for s in trace.steps] == [model.span_id]


def test_chain_of_thought_splits_into_one_step_per_line() -> None:
    root = agent_root("Sort: b a", None)
    cot = llm(
        "Step 1: list the words.\n\nStep 2: compare b and a.\nSo the answer is a b.", parent=root.span_id, start=1
    )
    trace = assemble_trace([root, cot])
    assert [s.reasoning for s in trace.steps] == [
        "Step 1: list the words.",
        "Step 2: compare b and a.",
        "So the answer is a b.",
    ]
    assert [s.index for s in trace.steps] == [1, 2, 3]
    assert trace.steps[-1].is_final_answer and not trace.steps[0].is_final_answer


def test_orphans_duplicates_and_children_before_parents() -> None:
    root = agent_root("q", "a")
    lost_parent = span_id()
    orphan = llm("orphaned", parent=lost_parent, start=3)
    child = llm("child", parent=root.span_id, start=1)
    trace = assemble_trace([orphan, child, child, root])
    assert [s.reasoning for s in trace.steps] == ["child", "orphaned"]
    assert _codes(trace) == {WarningCode.ORPHAN_SPANS, WarningCode.DUPLICATE_SPANS}
    assert trace.root_span_id == root.span_id


def test_parent_cycle_terminates_and_keeps_spans() -> None:
    a, b = span_id(), span_id()
    said = {"output.value": "a thought"}
    spans = [span("LLM", sid=a, parent=b, start=1, **said), span("LLM", sid=b, parent=a, start=2, **said)]
    trace = assemble_trace(spans)
    assert len(trace.steps) == 2 and WarningCode.ORPHAN_SPANS in _codes(trace)


def test_mixed_traces_and_empty_input_are_rejected() -> None:
    with pytest.raises(InputError, match="no spans"):
        assemble_trace([])
    with pytest.raises(InputError, match="one trace"):
        assemble_trace([span("LLM"), span("LLM", trace_id="f" * 32)])


def test_message_index_gap_is_reported() -> None:
    model = llm("x", **{"llm.input_messages.0.message.content": "a", "llm.input_messages.5.message.content": "b"})
    trace = assemble_trace([agent_root("q"), model])
    assert WarningCode.MESSAGE_INDEX_GAP in _codes(trace)
    assert "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT" in trace.warnings[0].message
    # numbered from 1 (the OpenAI Agents SDK's Responses model does): no gap
    from_one = llm("x", **{"llm.input_messages.1.message.content": "a", "llm.input_messages.2.message.content": "b"})
    assert WarningCode.MESSAGE_INDEX_GAP not in _codes(assemble_trace([agent_root("q"), from_one]))


def test_sdk_attribute_limit_drop_is_detected_on_real_sdk_spans() -> None:
    """A plain TracerProvider keeps 128 attributes: a 70-message conversation loses its first messages."""
    got: list[StructuredTrace] = []
    processor = ReflectSpanProcessor(got.append)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("agent", attributes={"openinference.span.kind": "AGENT", "input.value": "q"}):
        attributes = {"openinference.span.kind": "LLM"}
        for i in range(70):
            attributes[f"llm.input_messages.{i}.message.role"] = "user"
            attributes[f"llm.input_messages.{i}.message.content"] = f"m{i}"
        attributes["llm.output_messages.0.message.content"] = "answer"
        with tracer.start_as_current_span("llm", attributes=attributes):
            pass
    provider.shutdown()
    (trace,) = got
    assert _codes(trace) == {WarningCode.DROPPED_ATTRIBUTES, WarningCode.MESSAGE_INDEX_GAP}
    dropped = next(w for w in trace.warnings if w.code is WarningCode.DROPPED_ATTRIBUTES)
    assert dropped.message.startswith("14 attribute(s) were dropped on 1 span(s)")  # 142 set, 128 kept
    # the span kind was set first, so it was dropped first: the step is still found, from its output messages
    assert [s.reasoning for s in trace.steps] == ["answer"]


def test_long_text_is_truncated_with_a_note() -> None:
    trace = assemble_trace([agent_root("q"), llm("x" * 50)], limits=AssemblyLimits(max_text_chars=10))
    assert trace.steps[0].reasoning == "x" * 10 + "…[truncated 40 chars]"


def test_ten_thousand_spans_in_shuffled_order() -> None:
    root = agent_root("q", "end")
    spans = [root]
    for i in range(4_999):
        decide = llm(f"t{i}", [("step", json.dumps({"i": i}), f"c{i}")], parent=root.span_id, start=2 * i + 1)
        spans += [decide, tool("step", str(i), parent=root.span_id, start=2 * i + 2, **{"tool_call.id": f"c{i}"})]
    spans.append(llm("end", parent=root.span_id, start=10**7))
    random.Random(7).shuffle(spans)
    trace = assemble_trace(spans)
    assert len(spans) == 10_000 and len(trace.steps) == 5_000
    assert [s.tool_result for s in trace.steps[:3]] == ["0", "1", "2"]
    assert trace.steps[-1].is_final_answer and trace.trace_id == TRACE_ID


def test_round_trip_with_labels_and_warnings() -> None:
    from reflect_otel.trace import ErrorLabel

    trace = assemble_trace([agent_root("q"), llm("a"), llm("a", parent=span_id())])
    labelled = trace.model_copy(update={"labels": (ErrorLabel(step_index=1, category="Goal Deviation"),)})
    assert StructuredTrace.model_validate_json(labelled.model_dump_json()) == labelled


def test_llm_span_nested_in_an_llm_span_is_part_of_it() -> None:
    root = agent_root("q", "a")
    outer = llm("the decision", [("search", '{"q": "x"}', "c1")], parent=root.span_id, start=1)
    inner = llm('{"tool": "search"}', parent=outer.span_id, start=2)
    trace = assemble_trace(
        [root, outer, inner, tool("search", "found", parent=root.span_id, start=3, **{"tool_call.id": "c1"})]
    )
    assert [(s.span_id, s.tool_name, s.tool_result) for s in trace.steps] == [(outer.span_id, "search", "found")]


def test_an_llm_span_that_made_no_model_call_is_not_a_step() -> None:
    """LlamaIndex marks its tool-preparation spans LLM: no messages, no output, no tokens."""
    empty = span("LLM", start=2)
    trace = assemble_trace([agent_root("q"), empty, llm("the answer", start=3)])
    assert [s.reasoning for s in trace.steps] == ["the answer"]


def test_one_model_call_recorded_twice_is_one_step_but_a_repeated_call_is_two() -> None:
    root = agent_root("q", sid=span_id())
    outer = llm("same words", parent=root.span_id, start=10, end=20)
    inner = llm("same words", parent=root.span_id, start=12, end=18)  # the client's span inside the chat model's
    assert [s.span_id for s in assemble_trace([root, outer, inner]).steps] == [outer.span_id]
    again = llm("same words", parent=root.span_id, start=30, end=40)  # the agent said it again, later: a new call
    assert len(assemble_trace([root, outer, inner, again]).steps) == 2


@pytest.mark.parametrize(
    ("root_input", "root_output", "question", "answer"),
    [
        (  # a workflow's start event, nested in its initial state; its stop event as a repr
            json.dumps({"init_state": {"start_event": {"user_msg": "What is 17*23+5?"}}}),
            "StopEvent(result='The answer is 396.')",
            "What is 17*23+5?",
            "The answer is 396.",
        ),
        (  # a crew: the task's description; the output's raw text
            json.dumps({"crew": {"agents": [{"role": "math"}]}, "task": {"description": "Compute 17*23+5"}}),
            json.dumps({"raw": "396", "pydantic": None, "tasks_output": [{"raw": "396"}]}),
            "Compute 17*23+5",
            "396",
        ),
        ("What is 2+2?", "4", "What is 2+2?", "4"),  # plain text stays as it is
    ],
)
def test_chain_and_agent_roots_holding_json_or_a_repr_give_the_question_and_answer_text(
    root_input: str, root_output: str, question: str, answer: str
) -> None:
    root = span(
        "CHAIN", name="workflow", start=0, end=10**12, **{"input.value": root_input, "output.value": root_output}
    )
    trace = assemble_trace([root, tool("add", "396", parent=root.span_id, start=1)])
    assert (trace.question, trace.final_answer) == (question, answer)
    raw = {"raw_input": root_input, "raw_output": root_output}
    assert trace.metadata == {k: v for k, v in raw.items() if v not in (question, answer)}  # the raw value is kept


def test_a_callable_objects_tool_name_loses_its_dunder_call() -> None:
    root = agent_root("q", "42")
    call = llm("", [("Calculator.__call__", '{"x": 1}', "c1")], parent=root.span_id, start=1)
    result = tool("Calculator.__call__", "42", parent=root.span_id, start=2, **{"tool_call.id": "c1"})
    trace = assemble_trace([root, call, result])
    assert [s.tool_name for s in trace.steps] == ["Calculator"] and trace.steps[0].tool_result == "42"
