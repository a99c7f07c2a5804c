"""The judge's table (reflect_otel.flagging.judge): the official WikiTableQuestions evaluator's value rules, then the reading of
the value an answer asserts (reflect_otel.flagging._asserted), one row per rule, applied the same way to every method's runs
and replays."""

from __future__ import annotations

import pytest

from reflect_otel.flagging.judge import Outcome, answer_value, answers_match, judge_answer, normalise_text, same_answer

RIGHT, WRONG, UNDECIDED = Outcome.RIGHT, Outcome.WRONG, Outcome.UNDECIDED
LAPS = "how many laps were required to complete the 125cc race?"
BIRTHS = "in what year were there the most births?"
MEDALS = "in which year did china win more medals?"
BETTER = "is the united stated or scotland better?"  # the question's own typo: the answer is read against it

JUDGE_TABLE = [  # (answer, expected, question, outcome)
    # value rule 1: strings
    ("Café", "cafe", "", RIGHT),  # diacritics
    ("\u201cOK\u201d", "ok", "", RIGHT),  # smart quotes, then the outermost quotes
    ("1990\u20131995", "1990-1995", "", RIGHT),  # dashes
    ("Bangkok, Thailand[3]", "Bangkok, Thailand", "", RIGHT),  # a trailing citation
    ("Bangkok, Thailand \u2020", "Bangkok, Thailand", "", RIGHT),
    ("Real Madrid (Spain)", "Real Madrid", "", RIGHT),  # trailing details in parentheses
    ("Real Madrid.", "real madrid", "", RIGHT),  # a trailing period
    ("  New   York ", "new york", "", RIGHT),  # whitespace
    ("New York City", "New York", "", WRONG),  # no partial credit
    ("the Beatles", "Beatles", "", WRONG),  # articles are words (the evaluator keeps them)
    # value rule 2: numbers
    ("12,467", "12467", "", RIGHT),
    ("3.0", "3", "", RIGHT),
    ("$1,200", "1200", "", RIGHT),
    ("45%", "45", "", RIGHT),
    ("3", "3.5", "", WRONG),
    ("12 medals", "12", "", WRONG),  # a counted noun the question does not ask for is not a unit
    # value rule 3: dates
    ("2012-02-28", "February 28, 2012", "", RIGHT),
    ("28th Feb 2012", "28 February 2012", "", RIGHT),
    ("March 2004", "2004-03-xx", "", RIGHT),
    ("1994", "1994", "", RIGHT),  # a year alone is a number
    ("February 27, 2012", "28 February 2012", "", WRONG),
    ("02/03/2012", "3 February 2012", "", WRONG),  # numeric day/month order is ambiguous: not read as a date
    # value rule 4: lists are sets, of the same size
    ("b, a", "a|b", "", RIGHT),
    ("Rome and Paris", "paris|rome", "", RIGHT),
    ("a, b, c", "a|b", "", WRONG),
    ("a", "a|b", "", WRONG),
    ("Bangkok, Thailand", "Bangkok, Thailand", "", RIGHT),  # one expected value: the answer is not split
    # right in substance: a unit after a number
    ("22 laps", "22", LAPS, RIGHT),
    ("3 km", "3", "what distance separates the two junctions?", RIGHT),  # a unit of measure
    ("2 MHz", "2", "what is the difference in frequency?", RIGHT),
    ("12 medals", "12", "how many medals did norway win?", RIGHT),  # the question's own noun
    # right in substance: a repetition
    ("Paris, Paris", "Paris", "where was the final held?", RIGHT),
    ("22 laps and 22", "22", LAPS, RIGHT),
    # right in substance: words restated from the question
    ("The United States is better.", "United States", BETTER, RIGHT),
    ("The total is 5", "5", "what is the total number of goals?", RIGHT),
    ("There are 16 tracks listed in the table", "16", "how many tracks are listed in this table?", RIGHT),
    ("There were 11 winners in the table.", "11", "how many times was there a winner?", RIGHT),
    (
        "Dean Winstanley is listed above Kyle Anderson",
        "Above",
        "is dean winstanley listed above or below kyle anderson?",
        RIGHT,
    ),
    (
        "She competed first at the 2008 Summer Olympics",
        "2008 Summer Olympics",
        "which olympics did she compete in first?",
        RIGHT,
    ),
    ("It is Lake Van", "Lake Van", "other than lake ercek, name a lake in van.", RIGHT),
    # several candidates: asserted where the form says which
    ("more medals in 2008 than in 2004", "2008", MEDALS, RIGHT),
    ("Lake Van is larger than Lake Ercek", "Lake Van", "which is larger, lake van or lake ercek?", RIGHT),
    ("Arsenal won, not Chelsea", "Arsenal", "who won the final, arsenal or chelsea?", RIGHT),
    ("Arsenal won, not Chelsea", "Arsenal", "who won the final?", RIGHT),
    # undecided: several candidates, the form does not say which, one of them the expected answer
    ("It was either 2004 or 2008", "2008", BIRTHS, UNDECIDED),
    ("22 laps or 23 laps", "22", LAPS, UNDECIDED),
    ("fewer medals in 2004 than in 2008", "2008", MEDALS, UNDECIDED),  # compared otherwise than the question asks
    (
        "before 2000: 5.0%, after 2000: 4.7%",
        "after",
        "were the highest rates before or after the year 2000?",
        UNDECIDED,
    ),
    (
        "before 2000: 5.0%, after 2000: 4.7%",
        "after",
        "were the rates highest before or after 2000?",
        UNDECIDED,
    ),  # "after", not "after 2000"
    ("2008 and 2004 both had medals", "2008", "which year had more medals, 2004 or 2008?", UNDECIDED),
    # wrong stays wrong
    ("23 puzzles", "22", "how many puzzles are on the chart?", WRONG),  # another number in the same unit
    ("The total is 21", "36", "what was the total medal count?", WRONG),
    ("Kimi Raikkonen, Fernando Alonso", "Kimi Raikkonen", "who won the race?", WRONG),  # an extra value
    ("Rome, Paris, Lyon", "paris|rome", "which cities hosted it?", WRONG),
    ("Bangkok, Thailand", "Bangkok", "which city in thailand hosted the games?", WRONG),  # a list is not trimmed
    ("0.997 million", "997000", "how many viewers watched?", WRONG),  # a scale is not a unit
    ("2008 Summer Olympics", "2008", "in which year did she first compete?", WRONG),  # a name is not a unit
    ("It was either 2004 or 2008", "1990", BIRTHS, WRONG),  # no candidate is the expected answer
    ("error: t0 has fewer than 23 rows", "23", "what is the total kilometers between the junctions?", WRONG),
    ("SATA 3 Gbit/s", "SATA 6 Gbit/s", "which interface appears first, sata 6 gbit/s or pcie?", WRONG),
    # a bound is not a choice: "15 or more" offers no options to name (seed 7811's nt-828 read as one)
    ("Ajax won 5 or fewer games", "Ajax", "which team won 5 or fewer games?", RIGHT),
    ("No districts hold 15 or more seats.", "Antwerp", "which districts hold 15 or more seats?", WRONG),
    # a comparison denied puts the other option ahead
    (
        "Catherine Jean Milligan did not get a higher placement than Lori Moore",
        "Catherine Jean Milligan",
        "did catherine jean milligan or lori moore get a higher placement?",
        WRONG,
    ),
]


@pytest.mark.parametrize(("answer", "expected", "question", "outcome"), JUDGE_TABLE)
def test_the_judge_reads_the_asserted_value_then_follows_the_official_evaluator(
    answer: str, expected: str, question: str, outcome: Outcome
) -> None:
    assert judge_answer(answer, expected, question=question).outcome is outcome


def test_answers_match_compares_values_as_written_and_the_judgement_says_how_it_read_the_answer() -> None:
    assert not answers_match("22 laps", "22")  # the value comparison alone: the evaluator's
    judged = judge_answer("The answer is 22 laps.", "22", question=LAPS)
    assert (judged.correct, judged.answer, judged.value, judged.how) == (
        True,
        "22 laps",
        "22",
        "unit after the number stripped",
    )
    undecided = judge_answer("It was either 2004 or 2008", "2008", question=BIRTHS)
    assert undecided.correct is None and undecided.value is None and undecided.candidates == ("2004", "2008")
    assert "none asserted" in undecided.how
    assert judge_answer(None, "22", question=LAPS).outcome is WRONG
    assert judge_answer("Paris", "Paris").how == "as written"


def test_two_answers_are_the_same_when_they_assert_the_same_value() -> None:
    assert same_answer("22 laps", "22", question=LAPS)
    assert same_answer("The United States is better.", "United States", question=BETTER)
    assert not same_answer("22 laps", "23", question=LAPS)
    assert not same_answer("It was either 2004 or 2008", "2004", question=BIRTHS)  # undecided asserts nothing
    assert same_answer("It was either 2004 or 2008", "It was either 2004 or 2008", question=BIRTHS)  # as written
    assert same_answer(None, None) and not same_answer("22", None)


def test_values_read_as_the_evaluator_reads_them() -> None:
    assert normalise_text("  \u201cThe  Who\u201d (band) [1] ") == "the who"
    assert answer_value("1,000").number == 1000.0
    assert answer_value("xx-01-02").date == (-1, 1, 2)
    assert answer_value("May").date is None and answer_value("May").text == "may"


def test_a_long_run_of_citation_markers_is_stripped_without_backtracking() -> None:
    """Answers are untrusted: a run of "[1]" markers inside an answer (the stripping regex used to backtrack
    exponentially on it, hanging the consistency check) is compared at once."""
    answer = "Paris" + "[1]" * 400 + " and Lyon"
    assert not answers_match(answer, "Paris")
    assert answers_match("Paris" + "[1]" * 400, "Paris")
    assert judge_answer(answer, "Paris", question="where was it held?").outcome is WRONG
