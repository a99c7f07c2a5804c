"""The leak guard (reflect_otel.attribution.leaks): no text or action carrying the expected answer reaches a replay, for any
method: REFLECT's guidance and actions, the controls' plans, Reflexion's memory, DoVer's interventions, ICS."""

from __future__ import annotations

from typing import Any

import pytest

from reflect_otel.attribution.leaks import INSTRUCTION, action_leak, guard_plan, leak
from reflect_otel.attribution.methods import METHODS
from reflect_otel.config import ReflectConfig
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.record import AttributionStatus, InterventionKind, RepairPlan
from reflect_otel.testing import ScriptedLLM, ScriptedReplayAdapter, ScriptedRequest, make_trace
from reflect_otel.trace import StepAction, StructuredTrace


@pytest.mark.parametrize(
    ("text", "expected", "leaks"),
    [
        ("Look at step 5 again", "5", True),  # a lone one-character answer is not exempt
        ("Count the rows where Rank is 7.", "7", True),
        ("Count the rows where Rank is 17.", "7", False),  # a longer number is not it
        ("Subtract the two figures: 12467 passengers.", "12,467", True),  # numbers under the judge
        ("Use the row dated February 28, 2012.", "2012-02-28", True),  # dates in any form the judge reads
        ("Use the row dated February 27, 2012.", "2012-02-28", False),
        ("Filter on 'bangkok, thailand' in City", "Bangkok, Thailand", True),  # multi-word, case folded
        ("Filter City on Bangkok", "Bangkok, Thailand", False),  # part of it is not it
        ("List Kenya first", "Kenya|Spain", True),  # any value of a list answer
        ("The correct answer is [the answer].", "Oslo", True),  # stating an answer, masked or not
        ("Answer: the first row", "Oslo", True),
        ("Filter the Position column on '1st'.", "Bangkok, Thailand", False),
        # a part that gives the answer away alone: each date of a range (nt-901's auditor named one), a number's
        # words dropped; not the numbers inside a date, nor a year alone
        ("The wrong dates (January 4, 2012 vs. September 21, 2011)", "September 21, 2011 to January 25, 2012", True),
        ("Use the row of 2012-01-25.", "September 21, 2011 to January 25, 2012", True),
        ("Filter on the year 2011.", "September 21, 2011 to January 25, 2012", False),
        ("He served 34 in all", "34 years", True),
        ("Look at the 4 rows", "4 friendly matches", True),
        ("Count rows from 1869", "34 years", False),
        ("Filter on the day 21 of 2011", "September 21, 2011", False),
        # a negative answer is the number with its sign (seed 7725's BBM refused "5 * 7" for the answer -7)
        ("Compute 5 * 7 before subtracting.", "-7", False),
        ("So C = -7.", "-7", True),
        ("So C = \u22127.", "-7", True),  # the minus sign written as such
        ("Subtract: 5 - 7 is the next step.", "-7", False),  # a subtraction writes no -7
        ("So C = \u20137.", "-7", True),  # any dash the judge reads as a minus
        ("So C = - 7.", "-7", True),  # a sign after an operator, a space between
        ("So C is -7.", "-7", True),
        ("Then C-7 is left.", "-7", False),  # glued to a word: a hyphen or a subtraction
        ("Then C - 7 is left.", "-7", False),
        ("Use x=-7 here.", "-7", True),
        ("So C is 3\n-7 in the end.", "-7", True),  # a new line: no subtraction from the number above
        ("Set x=-.5 now.", "-0.5", True),
        # a bullet is no minus sign
        ("Candidates:\n- 2010: Brazil", "2010", True),
        ("rows:\n- 5 goals", "5", True),
        # a hyphen after a word does not hide the number after it
        ("The Boeing-747 row", "747", True),
        ("Keep the top-5 rows", "5", True),
        # a comma after a number ends it unless three digits follow (a thousands separator)
        ("Use rows 5, 6 and 7", "5", True),
        ("Use rows 1,2,3", "2", True),
    ],
)
def test_the_guard_reads_the_answer_under_the_judge(text: str, expected: str, leaks: bool) -> None:
    assert (leak(text, expected) is not None) is leaks


OPTIONS = "At the end, Claire has the\nOptions:\n(A) green ball.\n(B) orange ball.\n"


@pytest.mark.parametrize(
    ("text", "expected", "leaks"),
    [
        # an option label: named as a label, or by its option's text; never the letter as a word
        ("Recheck a swap: Claire had a ball before.", "(A)", False),  # the article "a" is not option A
        ("The right option is (A).", "(A)", True),
        ("Pick option A after the swaps.", "(A)", True),
        ("So Claire ends with the green ball.", "(A)", True),  # option A's text
        ("So Claire ends with the orange ball.", "(A)", False),
        ("Compare (B) with the swaps.", "(A)", False),
        # a bracket sequence: written as one, spaces or none; not brackets scattered through prose
        ("Now close them: ] > ) in that order.", "] > )", True),
        ("The stack holds ( < [ so the next is ]>).", "] > )", True),
        ("Push ] (the square bracket) then > (angle).", "] > )", False),
        ("Recount the open brackets in the input.", "] > )", False),
    ],
)
def test_an_option_label_and_a_bracket_sequence_are_read_in_their_own_form(
    text: str, expected: str, leaks: bool
) -> None:
    assert (leak(text, expected, OPTIONS) is not None) is leaks


def _query(sql: str) -> StepAction:
    return StepAction(tool_name="query", arguments={"sql": sql})


@pytest.mark.parametrize(
    ("before", "after", "expected", "leaks"),
    [
        # one character: the agent's own LIMIT 1 is not the fix's doing; a fix that writes 1 (or 1st) is
        ("SELECT a FROM t WHERE city = 'boston' LIMIT 1", "SELECT a FROM t WHERE city = 'Boston' LIMIT 1", "1", False),
        ("SELECT a FROM t WHERE pos = 'first' LIMIT 1", "SELECT a FROM t WHERE pos = '1st' LIMIT 1", "1", True),
        ("SELECT a FROM t WHERE pos = 'first' LIMIT 1", "SELECT a FROM t WHERE pos = '1' LIMIT 1", "1", True),
        ("SELECT a FROM t LIMIT 5", "SELECT a FROM t LIMIT 1", "1", True),
        # numbers under the judge
        ("SELECT n FROM t WHERE n > 12467 AND c = 'x'", "SELECT n FROM t WHERE n > 12467 AND c = 'X'", "12,467", False),
        ("SELECT n FROM t WHERE c = 'x'", "SELECT n FROM t WHERE c = '12467'", "12,467", True),
        # several words: kept as the agent wrote them, or introduced by the fix
        ("SELECT 1 FROM t WHERE city = 'San Diego' AND s = 'shiped'",
         "SELECT 1 FROM t WHERE city = 'San Diego' AND s = 'Shipped'", "San Diego", False),
        ("SELECT 1 FROM t WHERE city = 'San Deigo'", "SELECT 1 FROM t WHERE city = 'San Diego'", "San Diego", True),
        ("SELECT 1 FROM t WHERE city = 'Diego'", "SELECT 1 FROM t WHERE city = 'San Diego'", "San Diego", True),
        ("SELECT 1 FROM t WHERE c = 'a'", "SELECT 1 FROM t WHERE c = 'the answer is x'", "Oslo", True),
    ],
)  # fmt: skip
def test_an_action_is_read_for_what_it_introduces(before: str, after: str, expected: str, leaks: bool) -> None:
    assert (action_leak(_query(before), _query(after), expected) is not None) is leaks
    assert leak(after, expected) is not None or not leaks  # the whole text still carries what the fix introduces


@pytest.mark.parametrize(
    ("before", "after", "expected", "leaks"),
    [
        # seed 7725's BBM: the original answered "] >"; a rewrite answering ">" writes the expected sequence anew
        ("The expected answer is ] >", "So the answer is >", ">", True),
        ("So the answer is ] > ]", "So the answer is > > >", "> > >", True),
        ("Close ] then >", "Close ] then > and stop", ">", False),  # nothing written that was not there
    ],
)
def test_a_rewritten_thought_that_writes_the_expected_brackets_as_a_whole_is_refused(
    before: str, after: str, expected: str, leaks: bool
) -> None:
    assert (action_leak(StepAction(text=before), StepAction(text=after), expected) is not None) is leaks


def test_an_action_of_another_tool_or_a_new_argument_is_new_throughout() -> None:
    agent = _query("SELECT a FROM t WHERE b = 'Kenya'")
    assert action_leak(agent, _query("SELECT a FROM t WHERE b = 'Kenya' AND c = 'x'"), "Kenya") is None
    assert action_leak(agent, StepAction(tool_name="search", arguments={"q": "Kenya"}), "Kenya") is not None
    assert action_leak(agent, StepAction(tool_name="query", arguments={"sql": "x", "note": "Kenya"}), "Kenya")
    assert action_leak(None, _query("SELECT 'Kenya'"), "Kenya") is not None
    assert action_leak(agent, _query("SELECT 'Kenya'"), None) is None  # the proxy regime knows no answer


@pytest.mark.parametrize(
    ("question", "before", "after", "expected", "leaks"),
    [
        # the agent chose a value the question names and misspelt it: the fix only makes its lookup match
        ("Did Kenya or Uganda win more gold?", "... WHERE nation = 'Kenia'", "... WHERE nation = 'Kenya'", "Kenya", False),
        ("Is Rio de Janeiro or Lima larger?", "... city = 'Rio de Janiero'", "... city = 'Rio de Janeiro'", "Rio de Janeiro", False),
        ("Did Kenya or Uganda win more gold?", "... n IN ('Kenia', 'Uganda')", "... n IN ('Kenya', 'Uganda')", "Kenya", False),
        # naming the option the agent did not choose, or none, is the oracle's choice: refused
        ("Did Kenya or Uganda win more gold?", "... WHERE nation = 'Uganda'", "... WHERE nation = 'Kenya'", "Kenya", True),
        ("Did Kenya or Uganda win more gold?", "... WHERE nation = 'x'", "... WHERE nation = 'Kenya'", "Kenya", True),
        ("Did Kenya or Uganda win more gold?", "SELECT 1", "SELECT 'Kenya'", "Kenya", True),
        ("Did Kenya or Uganda win more gold?", "... n = 'Kenia'", "... n = 'Kenya' OR m = 'Kenya'", "Kenya", True),
        ("Which came first, 1998 or 2001?", "... WHERE year = 98", "... WHERE year = 1998", "1998", True),
        ("Is Rio de Janeiro or Lima larger?", "... city = 'Rio'", "... city = 'Rio de Janeiro'", "Rio de Janeiro", True),
        # too short to tell apart from a leak: "a" and "1" appear in most questions
        ("Which is larger, a or b?", "... WHERE k = 'c'", "... WHERE k = 'a'", "a", True),
        ("Who finished 1st in the 10 km?", "... WHERE pos = 'I'", "... WHERE pos = '1'", "1", True),
        # the question does not name it, or only part of it, or is not a question but a context
        ("Did Kenya or Uganda win more gold?", "... nation = 'Spian'", "... nation = 'Spain'", "Spain", True),
        ("Which city in Rio state is largest?", "... city = 'Rio de Janiero'", "... city = 'Rio de Janeiro'", "Rio de Janeiro", True),
        ("Did Kenya or Uganda win more? " + "Kenya | 3 gold | " * 30, "... n = 'Kenia'", "... n = 'Kenya'", "Kenya", True),
        # a statement of the answer is refused wherever the value comes from
        ("Did Kenya or Uganda win more gold?", "Kenia", "the answer is Kenya", "Kenya", True),
    ],
)  # fmt: skip
def test_an_argument_may_respell_the_agents_own_choice_of_an_answer_the_question_names(
    question: str, before: str, after: str, expected: str, leaks: bool
) -> None:
    assert (action_leak(_query(before), _query(after), expected, question) is not None) is leaks
    assert action_leak(_query(before), _query(after), expected) is not None  # without the question: refused


def test_the_thought_of_an_action_gets_no_question_exemption() -> None:
    question = "Did Kenya or Uganda win more gold?"
    agent = StepAction(tool_name="query", arguments={"sql": "x"}, text="")
    fix = StepAction(tool_name="query", arguments={"sql": "x"}, text="Kenya won more gold")
    assert action_leak(agent, fix, "Kenya", question) is not None


def _trace() -> StructuredTrace:
    steps = [{"tool": "lookup", "args": {"row": i}, "result": f"row {i}", "reasoning": f"row {i}"} for i in (1, 2, 3)]
    return make_trace("How many?", [*steps, {"reasoning": "4", "is_final_answer": True}], final_answer="4")


def _auditor(text: str, *, root_cause: str = "r") -> ScriptedLLM:
    def respond(request: ScriptedRequest) -> Any:
        return {
            "localize": {"error_step": 2, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": text},
            "classify": {"error_type": "tool_error", "confidence": 0.5, "explanation": "e", "suggested_correction": text},
            "diagnose": {"root_cause": root_cause, "correction_instruction": text, "forbidden_actions": [],
                         "expected_next_tool": None, "confidence": 0.5,
                         "corrected_call": {"tool": "lookup", "arguments": {"row": 3}}},
            "gate": {"is_faithful": True, "violation_reason": None, "violation_type": None},
            "reflect": {"reflection": text},
            "reflexion_extract": {"error_step": 2, "responsible_agent": None, "reason": "r",
                                  "error_type": "tool_error", "confidence": 0.5},
            "dover_hypotheses": {"hypotheses": [{"step": 2, "hypothesis": "h", "intervention": text}]},
            "explain": {"reasoning": "r", "error_type": "tool_error", "explanation": "e"},
        }[request.stage]  # fmt: skip

    return ScriptedLLM(respond=respond)


def _agent() -> ScriptedReplayAdapter:
    return ScriptedReplayAdapter(
        lambda trace, point, injection: [
            {"tool": "lookup", "args": {"row": 9}, "result": "row 9"},
            {"reasoning": "5", "is_final_answer": True},
        ],
        deterministic=True,
    )


@pytest.mark.parametrize("method", ["reflect", "reflect-guidance", "control-wrong-step", "reflexion", "dover", "ics"])
@pytest.mark.parametrize("expected", ["5", "12,467", "2012-02-28", "Bangkok, Thailand"])
def test_no_method_shows_a_replay_the_expected_answer(method: str, expected: str) -> None:
    said = {"5": "count again: it is 5", "12,467": "the sum is 12467", "2012-02-28": "it was on 28 February 2012",
            "Bangkok, Thailand": "answer with bangkok, thailand"}[expected]  # fmt: skip
    agent = _agent()
    config = ReflectConfig(rounds=1, rollback_points=3, max_replays=None)
    record = (
        METHODS[method]
        .build(_auditor(said), OracleVerifier(), config)
        .attribute(_trace(), expected=expected, replay=agent)
    )
    shown = [c.injection for c in agent.calls] + [c.action.render() for c in agent.calls if c.action]
    assert all(leak(text, expected) is None for text in shown), shown
    refused = [c for c in record.corrections if c.refused] + [
        e for e in record.errors if "expected answer" in e.message or "states an answer" in e.message
    ]
    given = [c for c in agent.calls if c.injection or c.action]  # ICS gives nothing: the agent's own steps
    assert refused or not given, record  # the leak was refused and the refusal recorded
    assert method != "ics" or (agent.calls and not given)
    assert record.status is not AttributionStatus.VERIFIED


@pytest.mark.parametrize("method", ["reflexion", "dover"])
def test_a_refused_text_is_kept_in_the_record_so_the_refusal_can_be_checked(method: str) -> None:
    config = ReflectConfig(rounds=1, rollback_points=3, max_replays=None)
    record = (
        METHODS[method]
        .build(_auditor("count again: it is 5"), OracleVerifier(), config)
        .attribute(_trace(), expected="5", replay=_agent())
    )
    kept = [c.refused_text for c in record.corrections if c.refused and c.refused_text]
    assert kept and all(len(text) <= 300 for text in kept), record.corrections
    assert any(leak(text, "5") for text in kept)  # what was refused, as it would have been given


def test_a_refused_text_is_bounded_however_it_is_written() -> None:
    from reflect_otel.record import REFUSED_TEXT_CHARS, Correction

    long = Correction(source="llm", kind=InterventionKind.GUIDANCE, step_index=1, refused="r", refused_text="x" * 900)
    assert len(long.refused_text) == REFUSED_TEXT_CHARS  # cut, not refused: a record is never lost for it
    assert Correction.model_validate_json(long.model_dump_json()).refused_text == long.refused_text


def test_a_placebo_plan_that_carries_the_answer_is_refused() -> None:
    from reflect_otel.attribution.controls import PlanPool
    from reflect_otel.record import AttributionMode, AttributionRecord, AttributionStatus, Correction, InterventionKind

    trace = _trace()
    expected = "Wellington"
    other = AttributionRecord(  # another failure's plan happens to name this run's answer
        trace_id="f" * 32, method="reflect", status=AttributionStatus.UNVERIFIED, mode=AttributionMode.REPLAY,
        root_cause="r", corrections=(Correction(source="llm", kind=InterventionKind.GUIDANCE, step_index=1,
                                                finding=f"look the capital up: {expected}"),),
    )  # fmt: skip
    plans = PlanPool()
    plans.add(_trace().model_copy(update={"trace_id": "f" * 32, "question": "Capital?"}), other)
    agent = _agent()
    config = ReflectConfig(rounds=1, rollback_points=1, max_replays=None)
    record = (
        METHODS["control-placebo"]
        .build(_auditor("redo it"), OracleVerifier(), config, plans)
        .attribute(trace, expected=expected, replay=agent)
    )
    assert all(c.injection == "" for c in agent.calls)  # only the control ran
    assert "refused" in record.reason or any(c.refused for c in record.corrections)


# the answer named in each part of a plan, for each kind of answer: one character, a number, a date, several words
NAMED = {
    "5": "it counted 5 rows",
    "12,467": "the total is 12467",
    "2012-02-28": "the match was on 28 February 2012",
    "Bangkok, Thailand": "the venue was bangkok, thailand",
}


@pytest.mark.parametrize("expected", list(NAMED))
def test_each_part_of_a_plan_that_names_the_answer_is_withheld_and_the_rest_kept(expected: str) -> None:
    named = NAMED[expected]
    plan = RepairPlan(
        root_cause=named,
        correction_instruction="look the row up again in the second table",
        forbidden_actions=("repeat step 2", named),
        expected_next_tool="lookup",
        expected_next_arguments={"row": 3, "note": named},
        corrected_step=StepAction(tool_name="lookup", arguments={"row": 3}),
    )
    given, withheld = guard_plan(plan, expected)
    assert [w.part for w in withheld] == ["root cause", "forbidden action 2", "expected next call"]
    assert all(w.reason.startswith(f"it carries the expected answer {expected!r}") for w in withheld)
    assert withheld[0].text == named
    assert given.root_cause == "" and given.correction_instruction == plan.correction_instruction
    assert given.forbidden_actions == ("repeat step 2",)
    assert given.expected_next_tool is None and given.expected_next_arguments is None
    assert given.corrected_step == plan.corrected_step  # an action: checked as one where it is executed
    assert guard_plan(plan, None) == (plan, ())  # the proxy regime knows no answer
    _, (refused,) = guard_plan(RepairPlan(correction_instruction="the correct answer is in row 3"), expected)
    assert refused.part == INSTRUCTION and "states an answer" in refused.reason


@pytest.mark.parametrize("method", ["reflect", "reflect-guidance", "control-wrong-step"])
@pytest.mark.parametrize("expected", list(NAMED))
def test_a_root_cause_that_names_the_answer_is_kept_from_the_replay_and_the_guidance_given(
    method: str, expected: str
) -> None:
    """The auditor saw the answer and its root cause names it: the guidance is given without the root cause, the
    refusal is recorded, and the localization and error type are kept."""
    auditor = _auditor("look the row up again", root_cause=NAMED[expected])
    agent = ScriptedReplayAdapter(  # answers as its run did, so that every trial runs (none is explained away)
        lambda trace, point, injection: [
            {"tool": "lookup", "args": {"row": 9}, "result": "row 9"},
            {"reasoning": "4", "is_final_answer": True},
        ],
        deterministic=True,
    )
    config = ReflectConfig(rounds=1, rollback_points=3, max_replays=None)
    record = (
        METHODS[method].build(auditor, OracleVerifier(), config).attribute(_trace(), expected=expected, replay=agent)
    )
    guided = [c.injection for c in agent.calls if c.injection]
    assert guided and all("look the row up again" in text for text in guided)
    assert all(leak(text, expected) is None and "Diagnosis:" not in text for text in guided)
    (withheld,) = [c for c in record.corrections if c.refused and c.kind is InterventionKind.GUIDANCE]
    assert NAMED[expected] in withheld.finding
    assert withheld.refused is not None and f"carries the expected answer {expected!r}" in withheld.refused
    assert record.localizations[0].step_index == 2 and record.error_type is not None
    assert not [e for e in record.errors if e.stage == "diagnose"]
