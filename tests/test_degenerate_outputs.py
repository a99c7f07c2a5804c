"""Replies that echo the request instead of answering never become records: rejected, sent back once, and a
stage error (saying why) when the model persists."""

from __future__ import annotations

import pytest

from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.config import ReflectConfig
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.llm.base import LLMOutputError
from reflect_otel.prompts import ClassificationOutput, LocalizationOutput
from reflect_otel.record import AttributionStatus
from reflect_otel.testing import ScriptedLLM
from reflect_otel.testing.examples import EXPECTED, five_step_trace

ECHOED_TITLE = {"error_step": 3, "confidence": 0.9, "reasoning": "Reasoning", "what_should_have_been_done": "w"}
ECHOED_PLACEHOLDER = {
    "error_step": 3,
    "confidence": 0.9,
    "reasoning": "<short explanation>",
    "what_should_have_been_done": "w",
}
EMPTY = {"error_step": 3, "confidence": 0.9, "reasoning": "   ", "what_should_have_been_done": "w"}
GOOD = {
    "error_step": 3,
    "confidence": 0.9,
    "reasoning": "it added instead of multiplying",
    "what_should_have_been_done": "w",
}
ECHOED_ENUM_DOC = {
    "error_type": "tool_error",
    "confidence": 0.5,
    "explanation": "The paper's 11-category taxonomy (Appendix: Error Taxonomy).",
    "suggested_correction": "s",
}


def test_an_echoed_title_or_placeholder_is_sent_back_with_the_reason() -> None:
    for echoed in (ECHOED_TITLE, ECHOED_PLACEHOLDER, EMPTY):
        llm = ScriptedLLM(by_stage={"localize": [echoed, GOOD]})
        out = llm.complete([], LocalizationOutput, stage="localize")
        assert out.attempts == 2 and out.value.reasoning == GOOD["reasoning"]
        feedback = llm.requests[1].messages[-1].content
        assert "reasoning" in feedback and "not valid" in feedback


def test_an_enum_docstring_echoed_as_the_explanation_is_rejected() -> None:
    llm = ScriptedLLM(by_stage={"classify": [ECHOED_ENUM_DOC, ECHOED_ENUM_DOC]})
    with pytest.raises(LLMOutputError, match="repeats the schema"):
        llm.complete([], ClassificationOutput, stage="classify")


def test_a_persistent_echo_is_a_stage_error_in_the_record_never_an_explanation() -> None:
    llm = ScriptedLLM(by_stage={"localize": [ECHOED_TITLE, ECHOED_TITLE]})
    pipeline = ReflectPipeline(llm, verifier=OracleVerifier(), config=ReflectConfig())
    record = pipeline.attribute(five_step_trace(), expected=EXPECTED)
    assert record.status is AttributionStatus.UNVERIFIED and record.step_index is None
    assert record.explanation == ""
    (error,) = record.errors
    assert error.stage == "localize" and "repeats the schema" in error.message
    assert [c.ok for c in record.llm_calls] == [False] and record.llm_calls[0].attempts == 2


def test_a_plan_does_not_forbid_what_it_asks_for() -> None:
    from reflect_otel import prompts
    from reflect_otel.attribution import stages
    from reflect_otel.record import Localization

    llm = ScriptedLLM(
        [
            {
                "root_cause": "it filtered on '1' where the column holds '1st'",
                "correction_instruction": "Call filter_rows with Position = '1st', then sort_rows by Year.",
                "forbidden_actions": [
                    "filter_rows",
                    "sort_rows()",
                    "lookup",
                    "filter Position = '1'",
                    " ",
                    "No action",
                ],
                "expected_next_tool": "lookup",
                "confidence": 0.8,
            }
        ]
    )
    trace = five_step_trace()
    ctx = prompts.PromptContext.of(trace, EXPECTED)
    localized = Localization(step_index=2, confidence=0.9, reasoning="r", suggested_fix="f")
    plan = stages.diagnose(llm, ctx, trace, localized, None)
    assert plan.forbidden_actions == ("filter Position = '1'",)


def test_a_plan_keeps_the_next_call_arguments_but_not_copied_placeholders() -> None:
    from reflect_otel import prompts
    from reflect_otel.attribution import stages
    from reflect_otel.record import Localization
    from reflect_otel.trace import ToolDefinition

    def plan_with(arguments: object, tool: object = "filter_rows"):  # type: ignore[no-untyped-def]
        reply = {
            "root_cause": "it filtered on '1' where the column holds '1st'",
            "correction_instruction": "Call filter_rows with value '1st'.",
            "forbidden_actions": [],
            "expected_next_tool": tool,
            "expected_next_arguments": arguments,
            "confidence": 0.8,
        }
        trace = five_step_trace().model_copy(update={"tools": (ToolDefinition(name="filter_rows"),)})
        localized = Localization(step_index=2, confidence=0.9, reasoning="r", suggested_fix="f")
        return stages.diagnose(ScriptedLLM([reply]), prompts.PromptContext.of(trace, EXPECTED), trace, localized, None)

    wanted = {"table": "t0", "column": "Position", "op": "=", "value": "1st"}
    assert plan_with(wanted).expected_next_arguments == wanted
    assert plan_with({"<argument name>": "<value>", "row": 2}).expected_next_arguments == {"row": 2}
    assert plan_with({"<argument name>": "<value>"}).expected_next_arguments is None
    assert plan_with(wanted, tool=None).expected_next_arguments is None  # arguments of no named call mean nothing
    assert plan_with(None).expected_next_arguments is None


TABLE_TOOLS = ("describe", "filter_rows", "sort_rows", "group_aggregate", "select_columns", "count_rows", "lookup")
"""The table-QA demo agent's tools (``TableQAAgent.tools``)."""


def test_a_plans_next_tool_is_one_of_the_agents_tools_or_nothing() -> None:
    """An exact name is kept; a name that is only one tool up to case and separators, or the leading words of only
    one tool, is that tool; a name that is no tool, part of a word, or the start of several tools is none."""
    from reflect_otel.attribution.stages import known_tool

    assert known_tool("filter_rows", TABLE_TOOLS) == "filter_rows"
    assert known_tool("Filter_Rows", TABLE_TOOLS) == known_tool("filter rows", TABLE_TOOLS) == "filter_rows"
    assert known_tool("filter", TABLE_TOOLS) == "filter_rows"  # nt-295's plan: the only tool that begins 'filter'
    assert known_tool("group", TABLE_TOOLS) == "group_aggregate"
    for never in ("fil", "rows", "filter_row", "filters", "final_answer", "query", "where"):
        assert known_tool(never, TABLE_TOOLS) is None, never
    assert known_tool("filter", (*TABLE_TOOLS, "filter_columns")) is None  # two tools begin 'filter': no guess
    assert known_tool("lookup", ()) is None  # an agent with no tools has no next tool
    assert known_tool(" ", TABLE_TOOLS) is None


def test_a_plan_naming_no_tool_drops_it_and_the_gate_does_not_refuse_on_it() -> None:
    """The paper's plan (free text) names its next tool: checked against the tools the trace knows (recorded or
    called), it is kept, read as the one tool it begins, or dropped with its arguments; the plan records what was
    written. A dropped name refuses nothing (nt-295: 'filter' refused the correct ``filter_rows``), a tool still does."""
    from reflect_otel import prompts
    from reflect_otel.attribution import stages
    from reflect_otel.record import Localization, RepairPlan
    from reflect_otel.testing import make_step, make_trace
    from reflect_otel.trace import ToolDefinition

    trace = make_trace(
        "Which clubs were founded by 1950?",
        [
            {"tool": "describe", "args": {"table": "t0"}, "result": "t0: 12 rows; columns: Club, Founded"},
            {"tool": "lookup", "args": {"table": "t0", "column": "Club", "row": 1}, "result": "Ajax"},
            {"reasoning": "Ajax", "is_final_answer": True},
        ],
    ).model_copy(update={"tools": tuple(ToolDefinition(name=name) for name in TABLE_TOOLS)})
    arguments = {"table": "t0", "column": "Founded", "op": "<=", "value": "1950"}

    def plan(tool: str) -> RepairPlan:
        reply = {
            "root_cause": "it read one row",
            "correction_instruction": "keep the rows founded by 1950",
            "forbidden_actions": [],
            "expected_next_tool": tool,
            "expected_next_arguments": arguments,
            "confidence": 0.7,
        }
        localized = Localization(step_index=2, confidence=0.8, reasoning="r", suggested_fix="f")
        ctx = prompts.PromptContext.of(trace, "Ajax, PSV")
        return stages.diagnose(ScriptedLLM([reply]), ctx, trace, localized, None, stages.PlanAsk(corrected_step=False))

    proposed = make_step(2, tool="filter_rows", args=arguments)
    kept, read, dropped = plan("filter_rows"), plan("filter"), plan("filter_by_year")
    assert (kept.expected_next_tool, kept.written_next_tool, kept.expected_next_arguments) == (
        "filter_rows",
        None,
        arguments,
    )
    assert (read.expected_next_tool, read.written_next_tool) == ("filter_rows", "filter")
    assert (dropped.expected_next_tool, dropped.written_next_tool) == (None, "filter_by_year")
    assert dropped.expected_next_arguments is None  # the arguments of no tool
    assert "Your next action" not in prompts.repair_injection(dropped, 2)
    for faithful in (kept, read, dropped):
        assert stages.gate_by_rules(faithful, proposed, trace.steps[1]) is None
    refused = stages.gate_by_rules(plan("lookup"), proposed, trace.steps[1])
    assert refused is not None and refused.violation_reason == "called filter_rows, the plan expected lookup"
