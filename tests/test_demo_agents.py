"""The demo agents: real tools on real WikiTableQuestions tables, a LangGraph table agent driven by a scripted
model with correct tool calls, and the chain-of-thought agent; both traced and replayable."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import format_trace_id

from reflect_otel.demo.table_tools import TableWorkspace
from reflect_otel.demo.wtq import load_questions, read_table, unescape
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.replay import ReplayRequest
from reflect_otel.testing import ScriptedLLM, ScriptedRequest
from reflect_otel.trace import StepAction, StepKind
from tests.conftest import Instrumented

QUESTIONS = {q.id: q for q in load_questions()}
FROM_LAST_RESULT = object()

# correct tool plans; the answer is read off the last tool result, so it is the tools that get it right
PLANS: dict[str, list[Any]] = {
    "nt-1": [
        {"tool": "filter_rows", "table": "t0", "column": "Position", "op": "=", "value": "1st"},
        {"tool": "sort_rows", "table": "t1", "column": "Year", "descending": True, "limit": 1},
        {"tool": "lookup", "table": "t2", "column": "Venue", "row": 1},
        FROM_LAST_RESULT,
    ],
    "nt-17": [
        {"tool": "sort_rows", "table": "t0", "column": "Name of place", "descending": False, "limit": 1},
        {"tool": "lookup", "table": "t1", "column": "Name of place", "row": 1},
        FROM_LAST_RESULT,
    ],
    "nt-29": [
        {
            "tool": "filter_rows",
            "table": "t0",
            "column": "Urban settlements",
            "op": "starts_with",
            "value": "dzhebariki-khaya",
        },
        {"tool": "lookup", "table": "t1", "column": "Population", "row": 1},
        FROM_LAST_RESULT,
    ],
    "nt-40": [
        {"tool": "filter_rows", "table": "t0", "column": "Nation", "op": "contains", "value": "ukraine"},
        {"tool": "lookup", "table": "t1", "column": "Silver", "row": 1},
        FROM_LAST_RESULT,
    ],
    "nt-58": [
        {"tool": "filter_rows", "table": "t0", "column": "Attendance", "op": ">=", "value": "1500"},
        {"tool": "count_rows", "table": "t1"},
        FROM_LAST_RESULT,
    ],
    "nt-64": [{"tool": "count_rows", "table": "t0"}, FROM_LAST_RESULT],
}


def scripted(plan: list[Any]) -> ScriptedLLM:
    steps = iter(plan)

    def respond(request: ScriptedRequest) -> dict[str, Any]:
        action = next(steps)
        if action is FROM_LAST_RESULT:
            last = [m.content for m in request.messages if m.content.startswith("Result of ")][-1]
            action = {"tool": "final_answer", "answer": last.split("\n", 1)[1]}
        return {"thought": f"next: {action['tool']}", "action": action}

    return ScriptedLLM(respond=respond)


def test_wtq_sample_ships_100_questions_with_their_tables() -> None:
    assert len(QUESTIONS) == 100
    assert all(q.table.is_file() and q.answers for q in QUESTIONS.values())
    assert unescape("a\\nb\\pc\\\\d") == "a\nb|c\\d"
    assert QUESTIONS["nt-23"].answers == ("Morocco", "France", "Spain")
    header, rows = read_table(QUESTIONS["nt-29"].table)
    assert header[:2] == ["Urban settlements", "Population"] and rows[0][0].startswith("Dzhebariki-Khaya\n")


def test_tools_return_real_results() -> None:
    ws = TableWorkspace(QUESTIONS["nt-58"].table)
    assert ws.describe().startswith("t0: 34 rows; columns: Date, Opponent, Result")
    assert ws.filter_rows("t0", "Attendance", ">=", "1500").startswith("t1: 11 rows")  # "1,912" reads as 1912
    assert ws.count_rows("t1") == "11"
    assert ws.sort_rows("t1", "Attendance", True, 1).startswith("t2: 1 rows")
    assert ws.group_aggregate("t0", "Opponent", "count").startswith("t3:")
    assert ws.select_columns("t0", ["Date", "Opponent"]).startswith("t4: 34 rows; columns: Date, Opponent")
    assert ws.lookup("t0", "opponent", 1) == "Union"  # column names match case-insensitively
    assert ws.filter_rows("t9", "x", "=", "y") == "error: no table 't9'; tables are: t0, t1, t2, t3, t4"
    assert ws.filter_rows("t0", "Attendance", "~", "1").startswith("error: op must be one of")
    assert ws.filter_rows("t0", "Opponent", "=", "x'; DROP TABLE t0; --").startswith("t5: 0 rows")
    assert ws.count_rows("t0") == "34"


@pytest.mark.parametrize("question_id", sorted(PLANS))
def test_table_agent_answers_correctly_with_correct_tool_calls(instrumented: Instrumented, question_id: str) -> None:
    from reflect_otel.demo.table_agent import TableQAAgent

    question = QUESTIONS[question_id]
    agent = TableQAAgent(question, scripted(PLANS[question_id]))
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    answer = agent.answer(thread_id=f"wtq-{question_id}")
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    trace = instrumented.assembled(trace_id)
    assert OracleVerifier().verify(trace, expected=question.expected).is_correct, (answer, question.answers)
    tool_steps = [s for s in trace.steps if s.kind is StepKind.TOOL_CALL]
    assert [s.tool_name for s in tool_steps] == [a["tool"] for a in PLANS[question_id][:-1]]
    assert all(s.tool_result and not s.tool_result.startswith("error") for s in tool_steps)
    assert trace.steps[-1].is_final_answer and trace.question == question.question
    assert trace.replay.thread_id == f"wtq-{question_id}"
    # the agent's tools, as the OpenInference LangChain instrumentation recorded them on its LLM spans
    assert [t.name for t in trace.tools] == [
        "describe", "filter_rows", "sort_rows", "group_aggregate", "select_columns", "count_rows", "lookup"
    ]  # fmt: skip
    filter_rows = trace.tools[1]
    assert filter_rows.recorded and filter_rows.description.startswith("Rows of ``table`` where")
    assert filter_rows.parameters["required"] == ["table", "column", "op", "value"]


def test_table_agent_replays_with_a_correction(instrumented: Instrumented) -> None:
    """A run that sorts the wrong way, then a LangGraph replay whose correction makes the model sort descending."""
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    def respond(request: ScriptedRequest) -> dict[str, Any]:
        results = [m.content for m in request.messages if m.content.startswith("Result of ")]
        corrected = any("sort descending" in m.content for m in request.messages if m.role == "system")
        if len(results) == 0 or (corrected and not any(r.startswith("Result of sort_rows") for r in results)):
            table = "t1" if results else "t0"
            if not results:
                return {
                    "thought": "first 1st places",
                    "action": {"tool": "filter_rows", "table": "t0", "column": "Position", "op": "=", "value": "1st"},
                }
            return {
                "thought": "latest first",
                "action": {"tool": "sort_rows", "table": table, "column": "Year", "descending": corrected, "limit": 1},
            }
        if len(results) == 1:
            return {
                "thought": "sort",
                "action": {"tool": "sort_rows", "table": "t1", "column": "Year", "descending": corrected, "limit": 1},
            }
        if "Result of sort_rows" in results[-1].split("\n")[0]:
            name = results[-1].split("\n", 1)[1].split(":")[0]
            return {"thought": "read", "action": {"tool": "lookup", "table": name, "column": "Venue", "row": 1}}
        return {"thought": "done", "action": {"tool": "final_answer", "answer": results[-1].split("\n", 1)[1]}}

    question = QUESTIONS["nt-1"]
    agent = TableQAAgent(question, ScriptedLLM(respond=respond))
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    assert agent.answer(thread_id="wtq-replay") == "Debrecen, Hungary"  # the earliest, not the last, 1st place
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    trace = instrumented.assembled(trace_id)
    adapter = LangGraphReplayAdapter(agent.graph, tracer_provider=instrumented.provider)
    result = adapter.replay(
        ReplayRequest.intervention(trace, 1, "CORRECTION: sort descending by Year to get the last one.")
    )
    assert result.prefix_verified and result.trace.steps[:1] == trace.steps[:1]
    # the replay is marked reflect.replay: the application's collector does not take it for a run of its own
    assert instrumented.processor.force_flush(10_000)
    assert result.adapter_info["replay_trace_id"] not in instrumented.traces
    assert instrumented.processor.stats().traces_skipped_replays >= 1
    assert OracleVerifier().verify(result.trace, expected=question.expected).is_correct
    assert result.continuation[0].tool_args["descending"] is True
    # the same fix as an action: the corrected sort executed by the graph's own tools node, the model continuing
    action = StepAction(
        tool_name="sort_rows", arguments={"table": "t1", "column": "Year", "descending": True, "limit": 1}
    )
    acted = adapter.replay(ReplayRequest.intervention(trace, 1, action=action))
    assert acted.prefix_verified and acted.trace.steps[:1] == trace.steps[:1]
    first = acted.continuation[0]
    assert (first.tool_name, first.tool_args) == ("sort_rows", action.arguments)
    assert first.tool_result is not None and first.tool_result.startswith("t")  # a table the replay's tool made
    assert OracleVerifier().verify(acted.trace, expected=question.expected).is_correct


def test_cot_agent_traces_one_step_per_line_and_replays(instrumented: Instrumented) -> None:
    from reflect_otel.demo.cot_agent import ChainOfThoughtAgent
    from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter

    llm = ScriptedLLM(
        [
            {"steps": ["2 + 3 = 5.", "5 * 4 = 20."], "answer": "20"},
            {"steps": ["3 * 4 = 12.", "2 + 12 = 14."], "answer": "14"},
        ]
    )
    agent = ChainOfThoughtAgent(llm, tracer_provider=instrumented.provider)
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    assert agent.solve("What is 2 + 3 * 4?") == "So the answer is 20"
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    trace = instrumented.assembled(trace_id)
    assert [s.reasoning for s in trace.steps] == ["2 + 3 = 5.", "5 * 4 = 20.", "So the answer is 20"]
    assert trace.final_answer == "So the answer is 20" and trace.steps[-1].is_final_answer
    result = ReasoningReplayAdapter(llm).replay(ReplayRequest.intervention(trace, 0, "multiply first"))
    assert result.final_answer == "So the answer is 14"


def test_table_agent_refuses_a_repeated_call_and_answers_at_its_step_limit(instrumented: Instrumented) -> None:
    """A model that would repeat one call forever is sent back once per repeat and, at the limit, must answer."""
    from reflect_otel.demo.table_agent import TableQAAgent

    count = {"t0": {"tool": "count_rows", "table": "t0"}}

    def respond(request: ScriptedRequest) -> dict[str, Any]:
        if request.output == "FinalDecision":
            return {"thought": "out of steps", "action": {"tool": "final_answer", "answer": "34"}}
        return {"thought": "count again", "action": count["t0"]}

    llm = ScriptedLLM(respond=respond)
    agent = TableQAAgent(QUESTIONS["nt-1"], llm, max_steps=3)
    assert agent.answer(thread_id="wtq-repeat") == "34"
    outputs = [r.output for r in llm.requests]
    # the first call, then the repeat sent back once and repeated again: the model must answer there
    assert outputs == ["TableDecision", "TableDecision", "TableDecision", "FinalDecision"]
    assert "You already called count_rows" in llm.requests[2].messages[-1].content


def test_a_filter_that_matches_nothing_names_values_the_column_holds() -> None:
    workspace = TableWorkspace(QUESTIONS["nt-1"].table)
    empty = workspace.filter_rows("t0", "Position", "=", "1")
    assert empty.startswith("t1: 0 rows") and "values of Position in t0 include:" in empty and "'1st'" in empty
    assert "no row matched" not in workspace.filter_rows("t0", "Position", "=", "1st")
    assert "no row matched" not in workspace.filter_rows("t0", "Year", ">", "3000")  # numbers: no value hint


def _rows(workspace: TableWorkspace, table: str, column: str) -> list[str]:
    """Every cell of ``column`` in ``table``, hidden rows included, read with the agent's own ``lookup``."""
    count = int(workspace.count_rows(table))
    return [workspace.lookup(table, column, row) for row in range(1, count + 1)]


def test_tied_rows_come_back_in_one_order_whatever_order_the_table_holds_them_in(tmp_path: Path) -> None:
    """Five venues tie at 2 and seven at 1 (four of them past the preview): each call gives one text, the ties in
    the venues' order, and the same text from the table with its rows reversed; a sort keeps the table's order among
    tied rows, and a filter's hint lists values in the order the table first shows them."""
    source = QUESTIONS["nt-1"].table
    header, rows = read_table(source)
    lines = source.read_text(encoding="utf-8").splitlines()
    reversed_table = tmp_path / "reversed.tsv"
    reversed_table.write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n", encoding="utf-8")
    venue, year = header.index("Venue"), header.index("Year")
    counts = Counter(row[venue] for row in rows)
    assert sorted(Counter(counts.values()).items()) == [(1, 7), (2, 5)]  # the ties this test is about

    workspace, other = TableWorkspace(source), TableWorkspace(reversed_table)
    grouped = workspace.group_aggregate("t0", "Venue", "count")
    assert grouped.startswith("t1: 12 rows") and "... 4 more rows" in grouped
    assert _rows(workspace, "t1", "Venue") == sorted(counts, key=lambda v: (-counts[v], v))
    assert other.group_aggregate("t0", "Venue", "count") == grouped
    assert _rows(other, "t1", "Venue") == _rows(workspace, "t1", "Venue")
    for _ in range(5):  # as a rewind re-runs it
        workspace.reset()
        assert workspace.group_aggregate("t0", "Venue", "count") == grouped

    by_year = workspace.sort_rows("t0", "Year", False, None)
    stable = sorted(range(len(rows)), key=lambda i: int(rows[i][year]))  # Python's sort is stable
    assert _rows(workspace, "t2", "Venue") == [rows[i][venue] for i in stable]
    assert by_year.startswith("t2: 17 rows") and Counter(row[year] for row in rows)["2001"] == 3  # tied rows
    hint = workspace.filter_rows("t0", "Venue", "=", "Paris")
    first_seen = list(dict.fromkeys(row[venue] for row in rows))[:8]
    assert hint.endswith(f"include: {', '.join(repr(v) for v in first_seen)}, ...)")


def test_a_rewind_compares_whole_results_and_names_the_first_line_that_differs() -> None:
    """The rewind re-runs the kept calls on the real tools and compares each result whole: the run's own results
    (from another workspace) pass, a result recorded with two tied rows swapped or cut short without saying so is
    refused with the line that differs, and one the trace cut short (saying how much) passes on what it kept."""
    from reflect_otel import _values
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.errors import ReplayError
    from reflect_otel.trace import Step, StructuredTrace

    calls = [
        ("group_aggregate", {"table": "t0", "group_by": "Venue", "aggregate": "count", "column": None}),
        ("lookup", {"table": "t1", "column": "Venue", "row": 10}),
    ]
    run = TableWorkspace(QUESTIONS["nt-1"].table)
    results = [str(getattr(run, name)(**args)) for name, args in calls]
    assert results[1] == "Grosseto, Italy"  # a row past the preview: it too must be where the run had it

    def trace(first_result: str) -> StructuredTrace:
        recorded = [first_result, results[1]]
        steps = [
            Step(
                index=i,
                span_id=f"{i:016x}",
                kind=StepKind.TOOL_CALL,
                tool_name=name,
                tool_args=args,
                tool_result=result,
            )
            for i, ((name, args), result) in enumerate(zip(calls, recorded, strict=True), start=1)
        ]
        return StructuredTrace(trace_id="a" * 32, steps=steps)

    agent = TableQAAgent(QUESTIONS["nt-1"], ScriptedLLM(respond=lambda request: {}))
    agent.workspace.group_aggregate("t0", "Position", "count")  # a replay's own call, left in the workspace
    agent.rewind(trace(results[0]), 2)
    agent.rewind(trace(_values.truncate(results[0], 60)), 2)

    lines = results[0].split("\n")
    assert lines[1:3] == ["Bangkok, Thailand | 2", "Debrecen, Hungary | 2"]
    swapped = "\n".join([lines[0], lines[2], lines[1], *lines[3:]])
    with pytest.raises(ReplayError) as refused:
        agent.rewind(trace(swapped), 2)
    assert str(refused.value) == (
        "step 1: group_aggregate gives another result now than the run recorded (line 2 is 'Bangkok, Thailand | 2' "
        "now, 'Debrecen, Hungary | 2' in the run); the run's tables cannot be restored"
    )
    with pytest.raises(ReplayError, match=r"line 10 is '\.\.\. 4 more rows' now, nothing in the run"):
        agent.rewind(trace("\n".join(lines[:-1])), 2)  # a prefix of the result: the old check let it pass


def test_table_agent_replays_read_the_table_names_their_run_read(instrumented: Instrumented) -> None:
    """A replay with no change reproduces the run call for call, result for result (the derived tables' names
    included), however many replays and actions ran before it: the adapter rewinds the workspace to the prefix."""
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    plan = PLANS["nt-1"]

    def respond(request: ScriptedRequest) -> dict[str, Any]:  # the plan's next call, by how many results it has
        results = [m.content for m in request.messages if m.content.startswith("Result of ")]
        action = plan[len(results)]
        if action is FROM_LAST_RESULT:
            action = {"tool": "final_answer", "answer": results[-1].split("\n", 1)[1]}
        return {"thought": f"next: {action['tool']}", "action": action}

    agent = TableQAAgent(QUESTIONS["nt-1"], ScriptedLLM(respond=respond))
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    agent.answer(thread_id="wtq-names")
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    trace = instrumented.assembled(trace_id)
    run_results = [s.tool_result for s in trace.steps if s.kind is StepKind.TOOL_CALL]
    assert run_results[1] is not None and run_results[1].startswith("t2: 1 rows")
    adapter = LangGraphReplayAdapter(agent.graph, tracer_provider=instrumented.provider, restore_state=agent.rewind)
    describe = StepAction(tool_name="describe", arguments={"table": "t0"})
    adapter.replay(ReplayRequest.intervention(trace, 0, action=describe))  # derives nothing, reads t0
    for _ in range(2):
        again = adapter.replay(ReplayRequest.intervention(trace, 1))
        replayed = [s.tool_result for s in again.trace.steps if s.kind is StepKind.TOOL_CALL]
        assert replayed == run_results and again.final_answer == trace.final_answer


def test_a_workspace_rewound_past_a_call_that_now_gives_another_result_refuses_the_replay() -> None:
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.errors import ReplayError
    from reflect_otel.trace import Step, StructuredTrace

    agent = TableQAAgent(QUESTIONS["nt-1"], ScriptedLLM(respond=lambda request: {}))
    step = Step(
        index=1,
        span_id="b" * 16,
        kind=StepKind.TOOL_CALL,
        tool_name="count_rows",
        tool_args={"table": "t0"},
        tool_result="t0 has 999 rows",
    )
    trace = StructuredTrace(trace_id="a" * 32, steps=[step])
    agent.rewind(trace, 0)  # nothing kept: nothing to check
    with pytest.raises(ReplayError, match="step 1: count_rows gives"):
        agent.rewind(trace, 1)


def test_table_agent_that_spends_every_step_still_answers(instrumented: Instrumented) -> None:
    """The answer forced at the step limit is the run's answer (the graph's recursion limit leaves room for it)."""
    from reflect_otel.demo.table_agent import TableQAAgent

    calls = [
        {"tool": "describe", "table": "t0"},
        {"tool": "count_rows", "table": "t0"},
        {"tool": "lookup", "table": "t0", "column": "Venue", "row": 1},
    ]

    def respond(request: ScriptedRequest) -> dict[str, Any]:
        if request.output == "FinalDecision":
            return {"thought": "out of steps", "action": {"tool": "final_answer", "answer": "Bangkok, Thailand"}}
        done = sum(1 for m in request.messages if m.content.startswith("Result of "))
        return {"thought": "next", "action": calls[done]}

    agent = TableQAAgent(QUESTIONS["nt-1"], ScriptedLLM(respond=respond), max_steps=3)
    assert agent.answer(thread_id="wtq-every-step") == "Bangkok, Thailand"
