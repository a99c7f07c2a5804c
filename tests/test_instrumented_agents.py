"""Assembly from real instrumented runs: a LangGraph ReAct graph and an OpenAI tool loop, through the real
OpenInference instrumentations and our span processor."""

from __future__ import annotations

from opentelemetry.trace import format_trace_id

from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.spans import span_record_from_readable
from reflect_otel.trace import StepKind, StepStatus, StructuredTrace
from tests import agents
from tests.conftest import Instrumented


def _new_trace_id(instrumented: Instrumented, before: set[str]) -> str:
    ids = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    assert len(ids) == 1, ids
    return ids.pop()


def _trace_ids(instrumented: Instrumented) -> set[str]:
    return {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}


def _expected_tool_steps(trace: StructuredTrace) -> None:
    steps = trace.steps
    assert [(s.kind, s.tool_name, s.tool_args, s.tool_call_id, s.tool_result) for s in steps] == [
        (StepKind.TOOL_CALL, "lookup_population", {"city": "Paris"}, "call_paris", "2100000"),
        (StepKind.TOOL_CALL, "add", {"a": 2100000, "b": 1000}, "call_add", "2101000"),
        (StepKind.TOOL_CALL, "lookup_population", {"city": "Rome"}, "call_rome", "2800000"),
        (StepKind.FINAL_ANSWER, None, {}, None, None),
    ]
    assert [s.index for s in steps] == [1, 2, 3, 4]
    assert [s.reasoning for s in steps] == [
        "I need the population of Paris.",
        "Now add 1000 to it and look up Rome.",
        "Now add 1000 to it and look up Rome.",
        agents.ANSWER,
    ]
    assert [s.is_final_answer for s in steps] == [False, False, False, True]
    # both calls of the second turn were decided by one LLM span, and executed by two different TOOL spans
    assert steps[1].span_id == steps[2].span_id != steps[0].span_id
    assert steps[1].tool_span_id != steps[2].tool_span_id
    assert all(s.tool_span_id and s.tool_span_id != s.span_id for s in steps[:3])
    assert steps[3].tool_span_id is None
    assert all(s.status is not StepStatus.ERROR for s in steps)
    assert trace.question == agents.QUESTION
    assert trace.final_answer == agents.ANSWER
    assert not trace.warnings


def test_langgraph_react_agent_assembles_exact_steps(instrumented: Instrumented) -> None:
    graph = agents.build_langgraph_agent()
    before = _trace_ids(instrumented)
    answer = agents.run_langgraph_agent(graph, thread_id="thread-42")
    assert answer == agents.ANSWER
    trace_id = _new_trace_id(instrumented, before)

    trace = instrumented.assembled(trace_id)  # through ReflectSpanProcessor
    _expected_tool_steps(trace)
    assert trace.source.framework == "langgraph"
    assert trace.source.collector == "span_processor"
    assert trace.replay.thread_id == "thread-42"
    assert trace.session_id == "thread-42"
    # LangGraph supersteps: agent=1, tools=2, agent=3, tools (both calls)=4, agent=5
    assert [s.langgraph_step for s in trace.steps] == [2, 4, 4, 5]
    assert [s.langgraph_node for s in trace.steps] == ["tools", "tools", "tools", "agent"]
    # each step's langgraph_step names the checkpoint written right after it, whose next node is the model
    checkpoints = {c.metadata["step"]: c for c in graph.checkpointer.list({"configurable": {"thread_id": "thread-42"}})}
    for step in trace.steps[:3]:
        assert step.langgraph_step is not None
        assert graph.get_state(checkpoints[step.langgraph_step].config).next == ("agent",)
    # the request that decided step 2 is the exact conversation after step 1
    assert trace.steps[1].model_input is not None and "2100000" in trace.steps[1].model_input

    # assembling the exported spans directly gives the same trace
    records = [span_record_from_readable(s) for s in instrumented.spans_of(trace_id)]
    direct = assemble_trace([r for r in records if r is not None], collector="span_processor")
    assert direct == trace


def test_openai_tool_loop_assembles_exact_steps(instrumented: Instrumented) -> None:
    client = agents.scripted_openai_client()
    tracer = instrumented.provider.get_tracer("tests.openai_loop")
    before = _trace_ids(instrumented)
    assert agents.run_openai_agent(client, tracer) == agents.ANSWER
    trace = instrumented.assembled(_new_trace_id(instrumented, before))

    _expected_tool_steps(trace)
    assert trace.source.framework == "openai"
    assert trace.replay.thread_id is None
    assert [s.model_name for s in trace.steps] == ["scripted-model"] * 4
    # tokens are counted once per LLM call: on the first step it decided
    assert [s.prompt_tokens for s in trace.steps] == [50, 50, None, 50]
    assert all(s.agent == "population_agent" for s in trace.steps)
    assert trace.steps[0].model_input is not None and agents.QUESTION in trace.steps[0].model_input


def test_trace_json_round_trip_is_stable(instrumented: Instrumented) -> None:
    graph = agents.build_langgraph_agent()
    before = _trace_ids(instrumented)
    agents.run_langgraph_agent(graph, thread_id="thread-rt")
    trace = instrumented.assembled(_new_trace_id(instrumented, before))
    text = trace.model_dump_json()
    again = StructuredTrace.model_validate_json(text)
    assert again == trace
    assert again.model_dump_json() == text
