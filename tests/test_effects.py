"""What a replacement changed at its step (its effect, not its text), and the text-only variant of a step that the
sensitivity arm executes."""

from __future__ import annotations

from reflect_otel import _values
from reflect_otel.attribution.effects import (
    change_of,
    default_normalise,
    later_call,
    same_result,
    screened_change,
    sensitivity_variant,
)
from reflect_otel.record import StepChange
from reflect_otel.testing import make_trace
from reflect_otel.trace import Step, StepAction, StepKind, StructuredTrace


def _table_run() -> StructuredTrace:
    return make_trace(
        "Which city?",
        [
            {"tool": "select_columns", "args": {"table": "t3", "columns": ["City"]}, "result": "t4: 2 rows\nRome\nOslo",
             "reasoning": "keep the city"},
            {"tool": "lookup", "args": {"table": "t4", "column": "City", "row": 1}, "result": "Rome"},
            {"reasoning": "Rome", "is_final_answer": True},
        ],
    )  # fmt: skip


def _replayed(action: StepAction, result: str, index: int = 1) -> Step:
    return Step(
        index=index,
        span_id="r",
        kind=StepKind.TOOL_CALL,
        tool_name=action.tool_name,
        tool_args=dict(action.arguments),
        tool_result=result,
    )


def test_a_call_that_returns_what_the_original_returned_changes_nothing() -> None:
    """Seed 48's nt-58: t3 -> t0 returned byte-for-byte the same rows; only the call's text differed."""
    run = _table_run()
    other_table = StepAction(tool_name="select_columns", arguments={"table": "t0", "columns": ["City"]})
    same = _replayed(other_table, "t4: 2 rows\nRome\nOslo")
    assert change_of(same, other_table, run.steps[0], run) is StepChange.SAME_EFFECT
    # whitespace and JSON key order carry no meaning
    assert change_of(_replayed(other_table, "t4: 2 rows\n Rome\nOslo "), other_table, run.steps[0], run) is (
        StepChange.SAME_EFFECT
    )
    changed = _replayed(other_table, "t4: 3 rows\nRome\nOslo\nBern")
    assert change_of(changed, other_table, run.steps[0], run) is StepChange.CHANGED


def test_a_tool_may_declare_what_in_its_result_means_nothing() -> None:
    def as_set(tool: str, result: str) -> str:
        return "\n".join(sorted(result.split("\n")))

    assert not same_result("Rome\nOslo", "Oslo\nRome", tool_name="q")
    assert same_result("Rome\nOslo", "Oslo\nRome", tool_name="q", normalise=as_set)
    assert same_result('{"a": 1, "b": [2]}', '{"b": [2],  "a": 1}', tool_name="q")
    assert default_normalise("q", '{"b": 1, "a": 2}') == '{"a": 2, "b": 1}'

    def broken(tool: str, result: str) -> str:
        raise ValueError("the agent's own code")

    assert same_result("Rome", "Rome ", tool_name="q", normalise=broken)  # falls back to the text as written


def test_a_result_the_trace_cut_short_is_compared_on_what_it_kept() -> None:
    full = "x" * 5000
    cut = _values.truncate(full, 100)
    assert same_result(cut, full, tool_name="q")
    assert not same_result(cut, full + "y", tool_name="q")
    assert not same_result(cut, "y" + full[1:], tool_name="q")


def test_the_answer_turn_a_later_call_and_an_unexecuted_replacement_never_change_the_step() -> None:
    run = _table_run()
    anything = StepAction(tool_name="lookup", arguments={"table": "t4", "column": "City", "row": 2})
    # a call in place of the answer: the agent got more turns
    assert screened_change(anything, run, 3) is StepChange.ANSWER_TURN
    assert change_of(_replayed(anything, "Oslo", 3), anything, run.steps[2], run) is StepChange.ANSWER_TURN
    # the run's own step-2 call made at step 1: its later work, sooner
    later = StepAction.of_step(run.steps[1])
    assert later_call(later, run, 1) is run.steps[1] and later_call(later, run, 2) is None
    assert screened_change(later, run, 1) is StepChange.LATER_CALL
    assert change_of(_replayed(later, "Rome"), later, run.steps[0], run) is StepChange.LATER_CALL
    # the adapter executed something else than it was given
    assert change_of(_replayed(anything, "Oslo"), later, run.steps[0], run) is StepChange.NOT_EXECUTED
    assert change_of(None, later, run.steps[0], run) is StepChange.NOT_EXECUTED
    # the original call again is the original step, whatever it returned this time
    own = StepAction.of_step(run.steps[0])
    assert change_of(_replayed(own, "t4: 0 rows"), own, run.steps[0], run) is StepChange.SAME_STEP
    assert screened_change(anything, run, 1) is None  # only its replay can tell


def test_a_thought_changes_the_step_only_when_its_content_does() -> None:
    chain = make_trace("q", [{"reasoning": "So, we need ']' and '>'."}, {"reasoning": "x", "is_final_answer": True}])
    relabelled = StepAction(text="Step 1: So, we need ] and >.")
    replayed = Step(index=1, span_id="r", kind=StepKind.REASONING, reasoning=relabelled.text)
    assert change_of(replayed, relabelled, chain.steps[0], chain) is StepChange.SAME_EFFECT
    other = StepAction(text="So, we need ')' and '>'.")
    replayed = Step(index=1, span_id="r", kind=StepKind.REASONING, reasoning=other.text)
    assert change_of(replayed, other, chain.steps[0], chain) is StepChange.CHANGED


def test_the_sensitivity_variant_is_the_step_in_another_text_with_the_same_effect() -> None:
    run = _table_run()
    # several arguments: the same ones in reverse order
    variant, how = sensitivity_variant(run.steps[1])
    assert variant is not None and variant.same_as(StepAction.of_step(run.steps[1]))
    assert list(variant.arguments) == ["row", "column", "table"] and how == "its arguments in reverse order"
    # one argument, with the agent's own text beside the call: the call alone
    variant, how = sensitivity_variant(run.steps[0].model_copy(update={"tool_args": {"table": "t3"}}))
    assert variant == StepAction(tool_name="select_columns", arguments={"table": "t3"})
    assert how == "the call alone, without the text the agent wrote with it"
    # a statement: laid out otherwise, its literal untouched
    query = Step(index=1, span_id="s", kind=StepKind.TOOL_CALL, tool_name="query",
                 tool_args={"sql": "SELECT \"Train No\" FROM t WHERE name = 'a  FROM b'"})  # fmt: skip
    variant, how = sensitivity_variant(query)
    assert variant is not None and how == "its statement laid out otherwise"
    assert variant.arguments["sql"] == "SELECT \"Train No\"\nFROM t WHERE name = 'a  FROM b'"
    relaid = query.model_copy(update={"tool_args": {"sql": variant.arguments["sql"]}})
    assert sensitivity_variant(relaid)[0] == StepAction.of_step(query)  # and back
    # one plain argument and no text beside it: no spelling the tool surely reads the same
    search = Step(index=1, span_id="s", kind=StepKind.TOOL_CALL, tool_name="search", tool_args={"q": "river 2"})
    variant, why = sensitivity_variant(search)
    assert variant is None and "no other spelling" in why
    # a thought: its words under a step label, or without the one it had
    thought = Step(index=3, span_id="t", kind=StepKind.REASONING, reasoning="So the count is 4.")
    assert sensitivity_variant(thought)[0] == StepAction(text="Step 3: So the count is 4.")
    labelled = thought.model_copy(update={"reasoning": "Step 3: So the count is 4."})
    assert sensitivity_variant(labelled)[0] == StepAction(text="So the count is 4.")


def test_an_error_that_echoes_its_statement_is_the_same_error_for_the_statement_laid_out_otherwise() -> None:
    """DuckDB (as PostgreSQL) echoes the failing line under its error: the sensitivity variant of a failed query
    (a line break before FROM) fails the same way, and its result compares equal."""
    import duckdb

    db = duckdb.connect()
    db.execute("CREATE TABLE orders (city VARCHAR, customer VARCHAR)")

    def error_of(sql: str) -> str:
        try:
            db.execute(sql)
        except duckdb.Error as error:
            return f"error: {error}"
        raise AssertionError("the query ran")

    step = Step(index=1, span_id="s", kind=StepKind.TOOL_CALL, tool_name="query",
                tool_args={"sql": "SELECT city FROM orders WHERE custmer = 'Ann'"})  # fmt: skip
    variant, _ = sensitivity_variant(step)
    assert variant is not None
    original, relaid = error_of(step.tool_args["sql"]), error_of(variant.arguments["sql"])
    assert original != relaid and "LINE 2:" in relaid  # the echo differs
    assert same_result(original, relaid, tool_name="query")
    other = error_of("SELECT city FROM orders WHERE custmr = 'Ann'")  # another error is another effect
    assert not same_result(original, other, tool_name="query")
