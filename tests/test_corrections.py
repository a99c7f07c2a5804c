"""Concrete corrections: the agent's tools on the trace, the diagnosis's corrected call (an enum of those tools),
the evidence rules (each with traces where it must stay silent), the refusals, and REFLECT trying actions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reflect_otel.attribution import corrections
from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.attribution.stages import PlanAsk, diagnose
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.demo import table_rules
from reflect_otel.demo.table_rules import other_field, tables_in
from reflect_otel.errors import LLMError
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.prompts import PromptContext, diagnosis_output
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.reading.tool_definitions import (
    available_tools,
    read_output_tools,
    read_tool_definitions,
    tool_definition,
)
from reflect_otel.record import (
    AttributionStatus,
    Correction,
    GateDecider,
    InterventionKind,
    Localization,
    ReplayArm,
    StepChange,
)
from reflect_otel.replay import BudgetedReplay, agent_rules
from reflect_otel.testing import ScriptedLLM, ScriptedReplayAdapter, ScriptedRequest, make_trace
from reflect_otel.trace import StepAction, StepKind, StructuredTrace, ToolDefinition

NO_ROWS = (
    "t1: 0 rows; columns: Year, Venue, Position\n"
    "(no row matched; values of Position in t0 include: '2nd', '1st', '3rd', '5th', '10th', ...)"
)
TABLE_TOOLS = (
    ToolDefinition(
        name="filter_rows",
        description="Rows where column op value",
        parameters={
            "type": "object",
            "properties": {
                "table": {"type": "string"},
                "column": {"type": "string"},
                "op": {"type": "string", "enum": ["=", "!=", "contains"]},
                "value": {"type": "string"},
            },
            "required": ["table", "column", "op", "value"],
        },
    ),
    ToolDefinition(
        name="lookup",
        parameters={
            "type": "object",
            "properties": {"table": {"type": "string"}, "column": {"type": "string"}, "row": {"type": "integer"}},
            "required": ["table", "column"],
        },
    ),
)


def filter_trace(result: str = NO_ROWS, *, question: str = "Where was the last 1st place?") -> StructuredTrace:
    return make_trace(
        question,
        [
            {
                "tool": "filter_rows",
                "args": {"table": "t0", "column": "Position", "op": "=", "value": "1"},
                "result": result,
            },
            {"reasoning": "No 1st place finishes found.", "is_final_answer": True},
        ],
        final_answer="No 1st place finishes found.",
    )


# -- the agent's tools on the trace -----------------------------------------------------------------------------
def test_tool_definitions_are_read_in_every_recorded_shape() -> None:
    openai_chat = {
        "type": "function",
        "function": {"name": "add", "description": "Add", "parameters": {"type": "object"}},
    }
    responses = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    anthropic = {"name": "search", "description": "Search", "input_schema": {"type": "object"}}
    assert [tool_definition(t).name for t in (openai_chat, responses, anthropic)] == ["add", "lookup", "search"]  # type: ignore[union-attr]
    assert tool_definition(json.dumps(anthropic)).parameters == {"type": "object"}  # type: ignore[union-attr]
    assert tool_definition({"description": "no name"}) is None
    assert tool_definition("not json") is None
    huge = {"name": "big", "parameters": {"type": "object", "description": "x" * 20_000}}
    assert tool_definition(huge).parameters == {}  # type: ignore[union-attr]  # over the byte bound: an open schema
    attributes = {
        "llm.tools.1.tool.json_schema": json.dumps(responses),
        "llm.tools.0.tool.json_schema": json.dumps(openai_chat),
        "input.value": json.dumps({"messages": [], "tools": [openai_chat, anthropic]}),
    }
    assert [d.name for d in read_tool_definitions(attributes)] == ["add", "lookup", "search"]  # order, no repeats


def test_output_tools_are_the_definitions_marked_output() -> None:
    """pydantic-ai marks its output tools ``kind: "output"`` in the request parameters it records; the mark is read
    wherever a definition is recorded, and a tool is never an output tool by its name."""
    output = {"name": "return_fruit", "parameters_json_schema": {"type": "object"}, "kind": "output"}
    function = {"name": "final_answer", "parameters_json_schema": {"type": "object"}, "kind": "function"}
    parameters = {"function_tools": [function], "output_tools": [output], "output_mode": "tool"}
    assert read_output_tools({"model_request_parameters": json.dumps(parameters)}) == {"return_fruit"}
    request = {"messages": [{"role": "user", "content": "output?"}], "tools": [{**openai_tool(), "kind": "output"}]}
    assert read_output_tools({"input.value": json.dumps(request)}) == {"add"}
    assert read_output_tools({"llm.tools.0.tool.json_schema": json.dumps(output)}) == {"return_fruit"}
    unmarked = {"tools": [openai_tool(), function], "messages": [{"role": "user", "content": "output"}]}
    assert read_output_tools({"input.value": json.dumps(unmarked), "model_request_parameters": "not json"}) == set()


def openai_tool() -> dict[str, Any]:
    return {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def _llm_span(attributes: dict[str, Any]) -> SpanRecord:
    return SpanRecord(
        trace_id="a" * 32,
        span_id="b" * 16,
        parent_id=None,
        name="chat",
        start_ns=1,
        end_ns=2,
        attributes=attributes,
    )


def test_genai_tool_definitions_reach_the_trace() -> None:
    definitions = [
        {"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}
    ]
    trace = assemble_trace(
        [
            _llm_span(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.tool.definitions": json.dumps(definitions),
                    "gen_ai.input.messages": json.dumps(
                        [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
                    ),
                    "gen_ai.output.messages": json.dumps(
                        [{"role": "assistant", "parts": [{"type": "text", "content": "hello"}]}]
                    ),
                }
            )
        ]
    )
    assert trace.tools == (ToolDefinition(name="get_weather", description="Weather", parameters={"type": "object"}),)
    assert StructuredTrace.model_validate_json(trace.model_dump_json()).tools == trace.tools  # stored with the trace


def test_without_recorded_tools_the_tools_seen_called_are_available() -> None:
    tools = available_tools(filter_trace())
    assert [(t.name, t.recorded) for t in tools] == [("filter_rows", False)]
    assert tools[0].parameters["properties"] == {
        "table": {"type": "string"},
        "column": {"type": "string"},
        "op": {"type": "string"},
        "value": {"type": "string"},
    }


# -- the corrected call ------------------------------------------------------------------------------------------
def _diagnosis(call: object) -> dict[str, Any]:
    return {
        "root_cause": "filtered on '1', the column writes '1st'",
        "correction_instruction": "filter on '1st'",
        "corrected_call": call,
        "forbidden_actions": [],
        "confidence": 0.8,
    }


GOOD_CALL = {"tool": "filter_rows", "arguments": {"table": "t0", "column": "Position", "op": "=", "value": "1st"}}


def _diagnose(llm: ScriptedLLM, trace: StructuredTrace) -> Any:
    ctx = PromptContext.of(trace, "Bangkok")
    return diagnose(llm, ctx, trace, Localization(step_index=1, confidence=0.5), None, PlanAsk(tools=TABLE_TOOLS))


def test_the_corrected_call_is_one_of_the_agents_tools_by_schema() -> None:
    schema = diagnosis_output(TABLE_TOOLS).model_json_schema()
    tools = sorted(d["properties"]["tool"]["const"] for name, d in schema["$defs"].items() if name.startswith("Call"))
    assert tools == ["filter_rows", "lookup"]  # the decoder can write no other name
    assert "corrected_call" in schema["required"]
    filter_arguments = schema["$defs"]["Arguments0"]
    assert filter_arguments["additionalProperties"] is False
    assert filter_arguments["properties"]["op"]["enum"] == ["=", "!=", "contains"]


def test_the_corrected_thought_and_the_instruction_are_asked_for_without_the_final_answer() -> None:
    # a rewritten step that states the answer is refused by the leak guard: the schema says so before the call
    schema = diagnosis_output((), chain_of_thought=True).model_json_schema()
    assert "corrected_thought" in schema["required"]
    assert "must not state the final answer" in schema["properties"]["corrected_thought"]["description"]
    assert "not the final answer" in schema["properties"]["correction_instruction"]["description"]


def test_a_call_of_a_tool_the_agent_lacks_is_rejected_and_sent_back() -> None:
    unknown = {"tool": "drop_table", "arguments": {"table": "t0"}}
    llm = ScriptedLLM(by_stage={"diagnose": [_diagnosis(unknown), _diagnosis(GOOD_CALL)]})
    plan = _diagnose(llm, filter_trace())
    assert plan.corrected_step == StepAction(tool_name="filter_rows", arguments=GOOD_CALL["arguments"])
    assert plan.expected_next_tool == "filter_rows" and plan.expected_next_arguments == GOOD_CALL["arguments"]
    assert len(llm.requests) == 2 and "drop_table" in llm.requests[1].text  # the repair retry showed the reply
    wrong_argument = {
        "tool": "filter_rows",
        "arguments": {"table": "t0", "column": "Position", "op": "~", "value": "1"},
    }
    with pytest.raises(LLMError):
        _diagnose(ScriptedLLM(by_stage={"diagnose": [_diagnosis(unknown), _diagnosis(wrong_argument)]}), filter_trace())


def test_a_corrected_call_that_repeats_the_step_is_no_correction() -> None:
    same = {"tool": "filter_rows", "arguments": {"table": "t0", "column": "Position", "op": "=", "value": "1"}}
    llm = ScriptedLLM(by_stage={"diagnose": [_diagnosis(same)]})
    plan = _diagnose(llm, filter_trace())
    assert plan.corrected_step is None and plan.root_cause  # the plan is kept, the non-correction dropped
    assert len(llm.requests) == 1  # no retry spent on it


# -- evidence rules ----------------------------------------------------------------------------------------------
def _replacements(trace: StructuredTrace) -> list[tuple[str, int, dict[str, Any]]]:
    return [
        (c.source, c.step_index, c.replacement.arguments)  # type: ignore[union-attr]
        for c in corrections.evidence_corrections(trace)
    ]


def test_an_empty_result_that_lists_values_proposes_the_nearest_value() -> None:
    (found,) = corrections.evidence_corrections(filter_trace())
    assert found.source == "evidence:listed_values" and found.kind is InterventionKind.ACTION
    assert found.replacement == StepAction(
        tool_name="filter_rows", arguments={"table": "t0", "column": "Position", "op": "=", "value": "1st"}
    )
    assert found.original == StepAction(
        tool_name="filter_rows", arguments={"table": "t0", "column": "Position", "op": "=", "value": "1"}
    )
    assert "'1st'" in found.finding and "returned nothing" in found.finding


@pytest.mark.parametrize(
    ("error", "argument", "value"),
    [
        ("error: no column 'Destination City' in t0; columns are: Rank, City, Passengers", "column", "City"),
        ("error: op must be one of =, !=, contains, starts_with", "op", "contains"),
        ("{\"error\": \"unknown city 'Pari'. Did you mean 'Paris'?\"}", "city", "Paris"),
    ],
)
def test_an_error_that_names_the_valid_options_proposes_the_nearest(error: str, argument: str, value: str) -> None:
    args = {"table": "t0", "column": "Destination City", "op": "contain", "city": "Pari"}
    trace = make_trace(
        "q?", [{"tool": "query", "args": args, "result": error}, {"reasoning": "?", "is_final_answer": True}]
    )
    assert _replacements(trace) == [("evidence:valid_options", 1, {**args, argument: value})]


def test_a_question_value_no_call_used_replaces_the_one_like_it() -> None:
    trace = make_trace(
        'How many passengers flew to "Los Angeles"?',
        [
            {"tool": "search", "args": {"city": "Los Angles"}, "result": "[]"},
            {"reasoning": "none", "is_final_answer": True},
        ],
    )
    assert _replacements(trace) == [("evidence:question_value", 1, {"city": "Los Angeles"})]


@pytest.mark.parametrize(
    "result",
    [
        "t1: 3 rows; values of Position in t0 include: '2nd', '1st'",  # not empty: nothing to correct
        "t1: 0 rows",  # empty, but nothing listed
        "t1: 0 rows (no row matched; values of Position in t0 include: 'winner', 'runner-up')",  # nothing near '1'
        "t1: 0 rows (no row matched; values of Position in t0 include: '1', '2')",  # the value is listed
    ],
)
def test_the_rules_stay_silent_without_a_concrete_fix(result: str) -> None:
    assert corrections.evidence_corrections(filter_trace(result)) == []


AWARDS = """The table the agent was given (t0):
t0: 5 rows; columns: Year, Award, Category, Result
2005 | Black Reel Awards | Best Actress | Nominated
2006 | Teen Choice Awards | Choice Actress | Won
2007 | Golden Globes Awards | Best Actress | Nominated
"""

AWARDS_MARKDOWN = """Table t0
| Year | Award | Result |
|---|---|---|
| 2005 | Black Reel Awards | Nominated |
| 2006 | Teen Choice Awards | Won |
"""


def award_trace(column: str, value: str, result: str = "t1: 0 rows") -> StructuredTrace:
    return make_trace(
        "What was the first award she was nominated for?",
        [
            {"tool": "filter_rows", "args": {"table": "t0", "column": column, "op": "=", "value": value},
             "result": result},
            {"reasoning": "None.", "is_final_answer": True},
        ],
        final_answer="None.",
    )  # fmt: skip


@pytest.mark.parametrize("context", [AWARDS, AWARDS_MARKDOWN])
def test_a_value_of_another_field_in_the_data_shown_proposes_that_field(context: str) -> None:
    (found,) = corrections.evidence_corrections(
        award_trace("Award", "nominated"), context=context, agent_rules=table_rules.RULES
    )
    assert found.source == "evidence:other_field" and found.step_index == 1
    assert found.replacement == StepAction(
        tool_name="filter_rows", arguments={"table": "t0", "column": "Result", "op": "=", "value": "Nominated"}
    )
    assert "'Nominated' under 'Result'" in found.finding


def test_an_earlier_result_is_data_shown_too() -> None:
    shown = {"tool": "describe", "args": {"table": "t0"}, "result": AWARDS}
    trace = award_trace("Award", "Won")
    trace = trace.model_copy(
        update={"steps": (make_trace("q", [shown]).steps[0], *(s.model_copy(update={"index": 2}) for s in trace.steps))}
    )
    (found,) = corrections.evidence_corrections(trace, agent_rules=table_rules.RULES)
    assert found.step_index == 2 and found.replacement is not None
    assert found.replacement.arguments["column"] == "Result"


@pytest.mark.parametrize(
    ("column", "value", "result", "context"),
    [
        ("Award", "Nominated", "t1: 2 rows", AWARDS),  # not empty
        ("Award", "Nominated", "t1: 0 rows", ""),  # no data shown
        ("Award", "Grammy Awards", "t1: 0 rows", AWARDS),  # no field holds it
        ("Award", "Black Reel", "t1: 0 rows", AWARDS),  # its own field holds something like it: not the field
        ("Year", "2005", "t1: 0 rows", AWARDS),  # a number is compared, not looked up
        ("Award", "t0", "t1: 0 rows", AWARDS),  # the table's own name
        ("Genre", "Nominated", "t1: 0 rows", AWARDS),  # the field named is not one the data shows
    ],
)
def test_other_field_stays_silent_without_a_concrete_fix(column: str, value: str, result: str, context: str) -> None:
    found = corrections.evidence_corrections(
        award_trace(column, value, result), context=context, agent_rules=table_rules.RULES
    )
    assert [c for c in found if c.source == "evidence:other_field"] == []


def test_the_table_rule_runs_only_for_the_agent_that_brings_it() -> None:
    """Installing reflect-otel applies no demo rule to a user's traces: the same trace gets ``other_field`` only
    when the table agent's rules are given (its wiring gives them to its replay adapter)."""
    trace = award_trace("Award", "nominated")
    assert corrections.evidence_corrections(trace, context=AWARDS) == []
    assert other_field not in corrections.rules()
    assert agent_rules(ScriptedReplayAdapter(lambda trace, point, injection: [])) == () and agent_rules(None) == ()
    adapter = ScriptedReplayAdapter(lambda trace, point, injection: [], correction_rules=table_rules.RULES)
    assert agent_rules(adapter) == (other_field,)
    assert agent_rules(BudgetedReplay(adapter, 3)) == (other_field,)  # seen through the per-failure budget


def test_tables_are_read_from_a_columns_line_or_a_markdown_header_and_end_at_a_ragged_row() -> None:
    (plain,) = tables_in(AWARDS + "... 2 more rows\n")
    assert plain.fields["Result"] == ["Nominated", "Won", "Nominated"] and "t0" in plain.caption
    (markdown,) = tables_in(AWARDS_MARKDOWN)
    assert markdown.fields["Award"] == ["Black Reel Awards", "Teen Choice Awards"]
    assert tables_in("columns: a, b\n1 | 2 | 3\n") == []  # three cells under two fields


def test_rules_stay_silent_on_a_chain_of_thought() -> None:
    trace = make_trace(
        "2+3*4?", [{"reasoning": "2+3=5, values are one of 5, 6"}, {"reasoning": "20", "is_final_answer": True}]
    )
    assert corrections.evidence_corrections(trace) == []


# -- refusals ----------------------------------------------------------------------------------------------------
def _action(step: int, replacement: StepAction) -> Correction:
    return Correction(source="llm", kind=InterventionKind.ACTION, step_index=step, replacement=replacement)


def test_a_replacement_that_repeats_a_pure_tools_call_the_prefix_got_a_result_from_is_refused() -> None:
    # seed 48: 5 of REFLECT's 8 actions on five failures re-issued an earlier call of the run: the agent gets the
    # rows it had, and a flip credits the step with an extra turn. Only for tools the adapter declares pure
    first = {"tool": "filter_rows", "args": {"table": "t0", "column": "Year", "op": ">", "value": "2000"}}
    trace = make_trace(
        "q",
        [
            {**first, "result": "t1: 3 rows"},
            {"tool": "count_rows", "args": {"table": "t1"}, "result": "3"},
            {"reasoning": "The answer is 3", "is_final_answer": True},
        ],
    )
    pure = ("filter_rows", "count_rows")
    again = StepAction(tool_name="filter_rows", arguments={**first["args"], "limit": None})  # type: ignore[dict-item]
    assert "repeats an earlier call of a pure tool" in (
        corrections.refusal(_action(3, again), trace, "4", pure=pure) or ""
    )
    assert "(step 1's)" in (corrections.refusal(_action(3, again), trace, "4", pure=pure) or "")
    # a tool not declared pure may answer again differently (a test run after an edit, a search): no refusal
    assert corrections.refusal(_action(3, again), trace, "4") is None
    # the same tool with another value is a correction (nt-1's '1' -> '1st')
    other = StepAction(tool_name="filter_rows", arguments={**first["args"], "value": "1999"})  # type: ignore[dict-item]
    assert corrections.refusal(_action(3, other), trace, "4", pure=pure) is None
    # a call that failed may be retried: its failure can be transient
    failed = make_trace(
        "q",
        [{**first, "result": "Error: connection reset"}, {"reasoning": "I could not filter", "is_final_answer": True}],
    )
    assert corrections.refusal(_action(2, again), failed, "4", pure=pure) is None
    # another agent's call is not what this agent has
    theirs = trace.model_copy(
        update={"steps": (trace.steps[0].model_copy(update={"agent": "planner"}), *trace.steps[1:])}
    )
    assert corrections.refusal(_action(3, again), theirs, "4", pure=pure) is None


def test_corrections_that_would_prove_nothing_are_refused() -> None:
    trace = filter_trace()
    for tool in ("respond", "submit", "final_result"):  # a run that ended with its answer tool, whatever its name
        answered = make_trace(
            "q", [{"tool": "lookup", "args": {"x": "1"}, "result": "[]"}, {"tool": tool, "args": {"text": "Rome"}}]
        )
        answered = answered.model_copy(
            update={"steps": (answered.steps[0], answered.steps[1].model_copy(update={"is_final_answer": True}))}
        )
        final = StepAction(tool_name=tool, arguments={"text": "Nowhere"})
        assert "final answer" in (corrections.refusal(_action(1, final), answered, "Bangkok") or "")
        assert corrections.refusal(_action(1, final), trace, "Bangkok") is None  # that name answers nothing here
    recorded = trace.model_copy(update={"tools": TABLE_TOOLS})
    for name in ("final_answer", "submit", "final_result"):  # answer tools the agent does not have
        unknown = StepAction(tool_name=name, arguments={"answer": "x"})
        assert "not one of the agent's tools" in (corrections.refusal(_action(1, unknown), recorded, None) or "")
    final = StepAction(tool_name="final_answer", arguments={"answer": "Bangkok"})
    carries = StepAction(
        tool_name="filter_rows", arguments={"table": "t0", "column": "City", "op": "=", "value": "bangkok"}
    )
    same = StepAction.of_step(trace.steps[0])
    good = StepAction(
        tool_name="filter_rows", arguments={"table": "t0", "column": "Position", "op": "=", "value": "1st"}
    )
    assert "expected answer" in (corrections.refusal(_action(1, final), trace, "Bangkok") or "")
    assert "expected answer" in (corrections.refusal(_action(1, carries), trace, "Bangkok|Thailand") or "")
    assert "repeats the original" in (corrections.refusal(_action(1, same), trace, "Bangkok") or "")
    # a null argument is the tool's default, as an argument left out is: the same call (seed 48's nt-723 wrong-step
    # control replayed step 1's sort_rows with "limit": null added, and that counted as a changed step)
    defaulted = same.model_copy(update={"arguments": {**same.arguments, "limit": None}})
    assert "repeats the original" in (corrections.refusal(_action(1, defaulted), trace, "Bangkok") or "")
    # nested nulls and whole floats too; a list keeps its nulls (a position is not a default)
    assert StepAction(tool_name="t", arguments={"f": {"a": None}, "n": 1.0}).same_as(
        StepAction(tool_name="t", arguments={"f": {}, "n": 1})
    )
    assert not StepAction(tool_name="t", arguments={"v": [None]}).same_as(
        StepAction(tool_name="t", arguments={"v": []})
    )
    assert not StepAction(tool_name="t", arguments={"n": 1.5}).same_as(StepAction(tool_name="t", arguments={"n": 1}))
    # a call in place of the answer step is no answer: it is tested under control like any other
    assert corrections.refusal(_action(2, good), trace, "Bangkok") is None
    assert corrections.refusal(_action(1, good), trace, "Bangkok") is None
    assert corrections.refusal(_action(1, carries), trace, None) is None  # the proxy regime knows no answer


def test_an_agents_answer_handed_back_is_no_call_to_correct_and_its_tool_is_an_answer() -> None:
    """A sub-agent's answer call (a message) whose result would fire a rule as a lookup's: no rule proposes a call
    in its place, and a replacement calling its tool elsewhere is an answer, refused like the run's own."""
    handing = {
        "tool": "hand_back",
        "args": {"table": "t0", "column": "Position", "op": "=", "value": "1"},
        "result": NO_ROWS,
        "agent": "helper",
    }
    as_lookup = make_trace(
        "Where was the last 1st place?", [handing, {"reasoning": "Nowhere", "is_final_answer": True}]
    )
    assert [c.step_index for c in corrections.evidence_corrections(as_lookup)] == [1]
    handed = as_lookup.model_copy(
        update={"steps": (as_lookup.steps[0].model_copy(update={"kind": StepKind.MESSAGE}), as_lookup.steps[1])}
    )
    assert corrections.evidence_corrections(handed) == []
    answering = StepAction(tool_name="hand_back", arguments={"value": "Rome"})
    assert "final answer" in (corrections.refusal(_action(1, answering), handed, None) or "")
    assert corrections.refusal(_action(1, answering), as_lookup, None) is None


def test_ordered_deduplicates_keeps_refused_and_caps_actions() -> None:
    trace = filter_trace().model_copy(update={"tools": TABLE_TOOLS})
    good = StepAction(
        tool_name="filter_rows", arguments={"table": "t0", "column": "Position", "op": "=", "value": "1st"}
    )
    other = StepAction(tool_name="lookup", arguments={"table": "t0", "column": "City", "row": 1})
    final = StepAction(tool_name="final_answer", arguments={"answer": "x"})
    guidance = Correction(source="llm", kind=InterventionKind.GUIDANCE, step_index=1)
    proposed = [_action(1, good), _action(1, good), _action(1, final), _action(1, other), guidance]
    ordered = corrections.ordered(proposed, trace, "Bangkok", limit=1)
    assert [(c.replacement.tool_name if c.replacement else None, c.refused is None) for c in ordered] == [
        ("filter_rows", True),
        ("final_answer", False),
        (None, True),
    ]


# -- REFLECT with actions ------------------------------------------------------------------------------------------
def _auditor(call: object, *, root_cause: str | None = None) -> ScriptedLLM:
    diagnosis = {**_diagnosis(call), **({"root_cause": root_cause} if root_cause is not None else {})}

    def respond(request: ScriptedRequest) -> Any:
        return {
            "localize": {
                "error_step": 1,
                "confidence": 0.7,
                "reasoning": "bad filter",
                "what_should_have_been_done": "1st",
            },
            "classify": {
                "error_type": "tool_error",
                "confidence": 0.6,
                "explanation": "the filter matched nothing",
                "suggested_correction": "check the values",
            },
            "diagnose": diagnosis,
            "gate": {"is_faithful": True, "violation_reason": None, "violation_type": None},
            "explain": {"reasoning": "1st matched", "error_type": "tool_error", "explanation": "wrong value"},
        }[request.stage]

    return ScriptedLLM(respond=respond)


def _table_agent(empty: str = NO_ROWS) -> ScriptedReplayAdapter:
    """Answers right only when the filter on '1st' ran; the action is executed by its own filter tool, which finds
    nothing (``empty``) on any other value."""

    def filter_rows(table: str, column: str, op: str, value: str) -> str:
        return "t2: 1 rows; Bangkok" if value == "1st" else empty

    def continue_with(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        ran = any(s.tool_args.get("value") == "1st" and s.tool_result for s in trace.steps[:point])
        return [{"reasoning": "Bangkok" if ran else "No 1st place finishes found.", "is_final_answer": True}]

    def lookup(table: str, column: str, row: int = 1) -> str:
        return "Doha"

    return ScriptedReplayAdapter(
        continue_with, tools={"filter_rows": filter_rows, "lookup": lookup}, deterministic=True
    )


def _stubborn_agent() -> ScriptedReplayAdapter:
    """Answers as the run did whatever it is given: no evidence call verifies, so the round goes on to be diagnosed
    (the diagnosis is written only when the evidence calls prove nothing)."""
    return ScriptedReplayAdapter(
        lambda trace, point, injection: [{"reasoning": "No 1st place finishes found.", "is_final_answer": True}],
        tools={"filter_rows": lambda table, column, op, value: NO_ROWS, "lookup": lambda table, column, row=1: "Doha"},
        deterministic=True,
    )


def _attribute(
    llm: ScriptedLLM, agent: ScriptedReplayAdapter, *, trace: StructuredTrace | None = None, **config: Any
) -> Any:
    pipeline = ReflectPipeline(
        llm, verifier=OracleVerifier(), config=ReflectConfig(rounds=1, rollback_points=2, gate=GateMode.HARD, **config)
    )
    # the tools as the agent's instrumentation recorded them
    trace = (trace or filter_trace()).model_copy(update={"tools": TABLE_TOOLS})
    return pipeline.attribute(trace, expected="Bangkok", replay=agent)


def test_the_auditor_is_shown_only_evidence_calls_that_could_be_tried() -> None:
    # expected '1st': the listed-values call would introduce the answer, so it is refused and not offered to the
    # auditor as a candidate (it would invite its repeat); with another expected answer it is offered
    def diagnose_text(expected: str) -> str:
        llm = _auditor(GOOD_CALL)
        pipeline = ReflectPipeline(
            llm, verifier=OracleVerifier(), config=ReflectConfig(rounds=1, rollback_points=1, gate=GateMode.HARD)
        )
        pipeline.attribute(
            filter_trace().model_copy(update={"tools": TABLE_TOOLS}), expected=expected, replay=_stubborn_agent()
        )
        return next(r.text for r in llm.requests if r.stage == "diagnose")

    offered = '"value": "1st"'
    assert offered in diagnose_text("Bangkok")
    assert offered not in diagnose_text("1st")


_BARE_EMPTY = "t1: 0 rows; columns: Year, Venue, Position"


def _no_evidence_trace() -> StructuredTrace:
    """The filter run whose empty result lists no values and whose question names none: no evidence rule fires, so
    the auditor's corrected call is the only action."""
    return filter_trace(_BARE_EMPTY, question="Where was the last win?")


def test_the_auditors_action_is_executed_and_verifies() -> None:
    agent = _table_agent(_BARE_EMPTY)
    record = _attribute(_auditor(GOOD_CALL), agent, trace=_no_evidence_trace())
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 1, record.reason
    # the control first; the agent's own step 1, resampled (this agent redoes it in the replay: it answers at once,
    # which changes nothing); then the auditor's call; then step 1 changed in text only (its arguments reordered)
    control, resampled, call, sensitivity = agent.calls
    assert control.action is None and control.injection == "" and control.rollback_point == 0
    assert resampled.action is None and resampled.injection == ""
    assert call.action == StepAction(tool_name="filter_rows", arguments=GOOD_CALL["arguments"]) and call.injection == ""
    assert sensitivity.action is not None and list(sensitivity.action.arguments) == ["value", "op", "column", "table"]
    kept, regenerated, attempt, insensitive = record.replays
    assert kept.arm is ReplayArm.CONTROL and kept.reproduced and not kept.flipped
    assert regenerated.change is StepChange.ANSWERED and not regenerated.changed_step
    assert attempt.gate is not None and attempt.gate.decided_by is GateDecider.ACTION and attempt.gate.is_faithful
    assert attempt.continuation[0].tool_result == "t2: 1 rows; Bangkok"  # executed by the agent's tool
    assert attempt.change is StepChange.CHANGED
    assert insensitive.arm is ReplayArm.SENSITIVITY and insensitive.change is StepChange.SAME_EFFECT
    assert record.verified_by is not None and (record.verified_by.source, record.verified_by.kind) == ("llm", "action")
    assert record.intervention is not None and record.intervention.correction == record.verified_by
    assert record.effect is not None
    assert record.effect.text() == "intervention flipped 1 of 1, control 0 of 1, sensitivity 0 of 1"
    # the run has no other step before its answer: decisive, its localization untested
    assert record.claim == "decisive" and record.localization_test is not None
    assert "no other replaceable step" in record.localization_test.reason


def test_an_evidence_call_is_tried_first_and_the_auditors_same_call_not_again() -> None:
    agent = _table_agent()
    record = _attribute(_auditor(GOOD_CALL), agent)
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 1
    assert [c.action for c in agent.calls][:2] == [
        None,
        StepAction(tool_name="filter_rows", arguments=GOOD_CALL["arguments"]),
    ]
    assert record.verified_by is not None and record.verified_by.source == "evidence:listed_values"
    assert [(c.source, c.flipped, c.replays) for c in record.corrections] == [("evidence:listed_values", True, 1)]


def test_a_root_cause_that_names_the_answer_keeps_the_auditors_call_and_it_is_replayed() -> None:
    """The root cause is written without the answer in view now, but a model may still name one (here it does):
    that text reaches no replay, so the diagnosis is kept: its step, error type and corrected call, which carries no
    answer and verifies."""
    root_cause = "the last 1st place was in Bangkok; '1' matched nothing"
    llm = _auditor(GOOD_CALL, root_cause=root_cause)
    agent = _table_agent(_BARE_EMPTY)
    record = _attribute(llm, agent, trace=_no_evidence_trace())
    assert [r.stage for r in llm.requests].count("diagnose") == 1 and not record.errors
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 1
    assert record.error_type is not None and record.error_type.value == "tool_error"
    assert record.verified_by is not None and record.verified_by.source == "llm"
    assert record.verified_by.replacement == StepAction(tool_name="filter_rows", arguments=GOOD_CALL["arguments"])
    assert [c.action for c in agent.calls][2] == record.verified_by.replacement  # the control, the resample, the call
    assert all(c.injection == "" for c in agent.calls)
    assert record.root_cause == root_cause
    # the guidance would have been given without it: the withheld root cause is recorded with the reason
    (withheld,) = [c for c in record.corrections if c.refused]
    assert withheld.kind is InterventionKind.GUIDANCE and "the plan's root cause" in withheld.finding
    assert withheld.refused == "it carries the expected answer 'Bangkok': it would flip a replay from any step"


def test_the_auditor_writes_its_correction_without_the_expected_answer_in_view() -> None:
    llm = _auditor(GOOD_CALL)
    _attribute(llm, _stubborn_agent())
    shown = {r.stage: r.text for r in llm.requests}
    assert "Bangkok" in shown["localize"]  # the oracle regime: the localizer sees the answer
    assert "Bangkok" not in shown["diagnose"]  # what a replay executes is written without it
    # nor the localizer's or the classifier's words, which saw it
    assert "the filter matched nothing" not in shown["diagnose"] and "check the values" not in shown["diagnose"]


def test_evidence_is_tried_before_the_auditors_own_correction() -> None:
    agent = _table_agent()
    useless = {"tool": "lookup", "arguments": {"table": "t0", "column": "City", "row": 1}}
    record = _attribute(_auditor(useless), agent)
    assert record.status is AttributionStatus.VERIFIED
    # the evidence rule's call first, after the point's control: it verifies, and the auditor's is never replayed
    assert [c.action.tool_name if c.action else None for c in agent.calls][:2] == [None, "filter_rows"]
    assert all(c.action is None or c.action.tool_name != "lookup" for c in agent.calls)
    assert record.verified_by is not None and record.verified_by.source == "evidence:listed_values"
    assert "its result lists '2nd', '1st'" in record.verified_by.finding


def test_without_actions_only_the_papers_guidance_is_tried() -> None:
    agent = _table_agent()
    record = _attribute(_auditor(GOOD_CALL), agent, actions=False)
    assert record.status is AttributionStatus.UNVERIFIED
    # K: step 1 only; the control, then the guidance (this agent cannot propose: it redoes the step in the replay)
    control, guided = agent.calls
    assert control.action is None and not control.injection and guided.action is None and guided.injection
    assert [c.kind.value for c in record.corrections] == ["guidance"]


def test_an_answer_carrying_call_is_never_replayed() -> None:
    agent = _stubborn_agent()  # the evidence call proves nothing here, so the round is diagnosed
    carrying = {"tool": "filter_rows", "arguments": {"table": "t0", "column": "City", "op": "=", "value": "Bangkok"}}
    llm = _auditor(carrying)
    record = _attribute(llm, agent, max_corrections=1)
    assert all(c.action is None or c.action.arguments.get("value") != "Bangkok" for c in agent.calls)
    # the call is refused where it would be replayed, and the refusal recorded; the diagnosis itself is kept
    assert [r.stage for r in llm.requests].count("diagnose") == 1 and not record.errors
    leak = "it carries the expected answer 'Bangkok': it would flip a replay from any step"
    refused, withheld = [c for c in record.corrections if c.refused]
    assert (refused.source, refused.kind, refused.replacement, refused.refused) == (
        "llm",
        InterventionKind.ACTION,
        StepAction(tool_name="filter_rows", arguments=carrying["arguments"]),
        f"the replacement: {leak}",
    )
    # the same call, as the plan's next call, is withheld from its guidance
    assert withheld.kind is InterventionKind.GUIDANCE and withheld.refused == leak
    assert withheld.finding.startswith("the plan's expected next call, withheld from the guidance: filter_rows")
    assert record.root_cause == "filtered on '1', the column writes '1st'"
    # the evidence rule's own call was tried first (it carries no answer), and did not flip this agent
    tried = [c for c in record.corrections if c.source == "evidence:listed_values"]
    assert tried and tried[0].replays == 1 and not tried[0].flipped
    assert record.status is AttributionStatus.UNVERIFIED


def test_the_round_is_diagnosed_only_when_its_evidence_calls_prove_nothing() -> None:
    """An evidence call verifies first: the auditor writes no diagnosis (one model call less per attribution the
    evidence proves); when it proves nothing, the round is diagnosed and its other trials follow in order."""
    llm = _auditor(GOOD_CALL)
    record = _attribute(llm, _table_agent())
    assert record.status is AttributionStatus.VERIFIED and record.verified_by is not None
    assert record.verified_by.source == "evidence:listed_values"
    assert [r.stage for r in llm.requests] == ["localize", "classify"]
    assert record.root_cause == ""  # no plan was written
    stubborn = _auditor(GOOD_CALL)
    record = _attribute(stubborn, _stubborn_agent())
    assert [r.stage for r in stubborn.requests].count("diagnose") == 1
    sources = [c.source for c in record.corrections]
    assert sources[0] == "evidence:listed_values" and "resample" in sources


def test_a_call_already_replayed_at_the_point_is_refused_given_or_proposed() -> None:
    from reflect_otel.attribution._run import AttributionRun
    from reflect_otel.attribution.proposals import ALREADY_REPLAYED, Screening, candidates
    from reflect_otel.attribution.trial import Trial
    from reflect_otel.testing import ScriptedProposingAdapter

    call = StepAction(tool_name="filter_rows", arguments=GOOD_CALL["arguments"])
    trace = filter_trace().model_copy(update={"tools": TABLE_TOOLS})
    run = AttributionRun("reflect", ScriptedLLM(respond=lambda r: {}), trace, {}, OracleVerifier())
    # the agent proposes the same call (its arguments in another order, a null added): one action all the same
    same = {"tool": "filter_rows", "args": {**dict(reversed(list(GOOD_CALL["arguments"].items()))), "limit": None}}
    agent = ScriptedProposingAdapter(
        lambda trace, point, injection: [], lambda trace, point, injection, sample, temperature: same
    )

    def consider(trial: Trial, replayed: set[str]) -> tuple[list[Any], list[Correction]]:
        return candidates(trial, Screening.of(run, agent, ReflectConfig()), replayed_here=replayed)

    given = Trial(_action(1, call))
    assert [c.action for c in consider(given, set())[0]] == [call]
    found, (refused,) = consider(given, {call.key()})
    assert found == [] and refused.refused == ALREADY_REPLAYED and refused.replacement == call
    guided = Trial(Correction(source="llm", kind=InterventionKind.GUIDANCE, step_index=1), "use 1st")
    found, (proposal,) = consider(guided, {call.key()})
    assert found == [] and proposal.refused == ALREADY_REPLAYED and proposal.source == "proposal:llm"


@pytest.mark.parametrize(
    ("thought", "kept"),
    [
        ("Eve and Bob swap: Eve has the red ball.", True),
        ("Step 2 as it should have been, with concrete values taken from the data above", False),  # the ask, back
        ("The agent should have swapped Eve's ball with Bob's.", False),  # advice about the agent, not its step
        ("The erroneous step was to include '}}}' at the end of the sequence.", False),  # commentary on the run
        ("The correct sequence should be '} ] )' to close the brackets.", False),
        ("The agent's reasoning was that Eve keeps the blue ball.", False),
        ("The agent incorrectly assumed that Eve keeps the blue ball.", False),  # seed 7725, in the third person
        ("The agent chose the wrong values for the swap.", False),
        ("Step 1 (reasoning) was incorrect because Eve swapped first.", False),  # a verdict on a step
        ("In step 1 the swap was wrong because Eve swapped first.", False),
        ("The model incorrectly assumed that Eve keeps the blue ball.", False),
        ("The agent has produced an incorrect order.", False),
        ("The agent's final answer does not match the swaps.", False),
        ("The agent earns a 3% commission on each sale, so 3% of 200 is 6.", True),  # an agent in the data
        ("Eve swapped first, so the agent's count is off by one: Eve has the red ball.", True),
        ("The error is that Eve swapped first, so Eve has the red ball.", True),  # the agent's own voice
    ],
)
def test_a_rewritten_thought_that_is_no_step_of_the_agents_is_refused_with_its_reason(thought: str, kept: bool) -> None:
    from reflect_otel.prompts import without_step_label

    trace = make_trace("Who holds the red ball?", [{"reasoning": "Eve keeps the blue ball."}, {"reasoning": "(A)"}])
    diagnosis = {"root_cause": "a swap was missed", "correction_instruction": "redo the swap",
                 "corrected_thought": thought, "forbidden_actions": [], "confidence": 0.8}  # fmt: skip
    ctx = PromptContext.of(trace, "(B)")
    plan = diagnose(ScriptedLLM([diagnosis]), ctx, trace, Localization(step_index=1, confidence=0.5), None)
    # kept in the plan (without a step label): the refusal is recorded, not silent
    assert plan.corrected_step == StepAction(text=without_step_label(thought))
    assert plan.root_cause == "a swap was missed"
    refused = corrections.refusal(_action(1, StepAction(text=thought)), trace, None)
    assert (refused is None) is kept
    if not kept:
        assert refused is not None and refused.startswith("the replacement is no step of the agent's")


def test_a_rewritten_thought_is_read_without_the_step_label_copied_from_the_prompt() -> None:
    """Seed 7725's BBM auditor wrote "Step 4 (final_answer) Reasoning: " before a step's words: the step is the
    words; where they are the original step's, nothing is corrected and nothing is replayed."""
    original = 'So, we need "}". So the answer is }'
    trace = make_trace("Complete the sequence: { [ ]", [{"reasoning": "Open: {"}, {"reasoning": original}])
    diagnosis = {"root_cause": "a bracket is left open", "correction_instruction": "close the brace",
                 "corrected_thought": "Step 2 (final_answer)\nReasoning: We close the brace: }",
                 "forbidden_actions": [], "confidence": 0.8}  # fmt: skip
    plan = diagnose(
        ScriptedLLM([diagnosis]), PromptContext.of(trace, "}"), trace, Localization(step_index=2, confidence=0.5), None
    )
    assert plan.corrected_step == StepAction(text="We close the brace: }")
    for text, refused in [
        (f"Step 2 (final_answer) Reasoning: {original}", "the replacement repeats the original step"),
        (f"{original.replace(' ', '  ')}", "the replacement repeats the original step"),
        (original.replace('"', ""), "the replacement repeats the original step"),  # quotation marks dropped
    ]:
        assert (corrections.refusal(_action(2, StepAction(text=text)), trace, None) or "").startswith(refused), text
    assert corrections.refusal(_action(2, StepAction(text="So, we need ']'")), trace, None) is None


@pytest.mark.parametrize(
    ("thought", "words"),
    [
        ("Step 4 (final_answer) Reasoning: So x = 3.", "So x = 3."),
        ("Step 4: So x = 3.", "So x = 3."),
        ("step 2 (reasoning)\nReasoning: a", "a"),
        ("Step 3 forward puts us at 3.", "Step 3 forward puts us at 3."),  # a sentence, not a label
        ("Step 1. Open the file", "Step 1. Open the file"),
    ],
)
def test_only_a_step_label_is_taken_off_a_rewritten_thought(thought: str, words: str) -> None:
    from reflect_otel.prompts import without_step_label

    assert without_step_label(thought) == words


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        (
            "Close ]: stack { [. The agent has produced an incorrect result.",
            "the replacement is the original step with",
        ),
        ("Close ]: stack { [ is wrong: close ] then }: stack {", None),  # a self-correction, not commentary
        ("Step 2 was incorrect because the brace was left open.", "the replacement is no step of the agent's"),
        # any other change of content is a change, however poor a repair: the control decides what a flip proves
        ("Stack: { [ ]", None),  # an earlier step's words (in a bracket task the right step often is one)
        ("Close ]: stack {", None),  # the step's beginning: a correction by deletion
        ("So, we need", None),  # a later step's beginning
        ("So, we need } . So }", None),
    ],
)
def test_a_thought_changed_in_any_way_but_commentary_is_a_change(text: str, refused: str | None) -> None:
    trace = make_trace(
        "Complete the sequence: { [ ]",
        [{"reasoning": "Stack: { [ ]"}, {"reasoning": "Close ]: stack { ["}, {"reasoning": 'So, we need "}". So }'}],
    )
    reason = corrections.refusal(_action(2, StepAction(text=text)), trace, None)
    assert reason is None if refused is None else reason.startswith(refused)
