from __future__ import annotations

import pytest

from reflect_otel.datasets.bbm import BBMVerifier, extract_bbm_answer
from reflect_otel.flagging.verifiers import (
    OracleVerifier,
    SelfVerifier,
    answers_match,
    extract_answer,
    is_undecided,
)
from reflect_otel.testing import ScriptedLLM, make_trace
from reflect_otel.verdict import Verdict


def _trace(answer: str | None):  # type: ignore[no-untyped-def]
    return make_trace("q", [{"reasoning": answer or ""}], final_answer=answer)


@pytest.mark.parametrize(
    ("answer", "expected", "correct"),
    [
        ("12,467", "12467", True),
        ("3.0", "3", True),
        ("The answer is Paris.", "paris", True),
        ("FINAL ANSWER: 33149", "33149", True),
        ("b, a", "a|b", True),
        ("Rome and Paris", "paris|rome", True),
        ("Rome and Paris", "paris, rome", False),  # one expected value (lists are written a|b): compared whole
        ("Café", "cafe", True),
        ("\\boxed{17}", "17", True),
        ("3", "3.5", False),
        ("Paris", "Rome", False),
        ("a, b, c", "a|b", False),
        ("February 28, 2012", "28 February 2012", True),
        ("The answer is: 28th Feb 2012.", "28 February 2012", True),
        ("2012-02-28", "February 28, 2012", True),
        ("March 2004", "mar 2004", True),
        ("February 27, 2012", "28 February 2012", False),
        ("02/03/2012", "3 February 2012", False),  # numeric day/month order is ambiguous: not read as a date
        ("May", "may", True),  # a month alone is a word, not a date
    ],
)
def test_oracle_normalises_then_matches(answer: str, expected: str, correct: bool) -> None:
    verdict = OracleVerifier().verify(_trace(answer), expected=expected)
    assert verdict.is_correct is correct


def test_oracle_is_strict_when_extraction_fails_and_unsure_without_expected() -> None:
    assert OracleVerifier().verify(_trace(None), expected="x").is_correct is False
    assert OracleVerifier().verify(_trace("   "), expected="x").is_correct is False
    assert OracleVerifier().verify(_trace("x"), expected=None).is_correct is None
    assert extract_answer("Thinking... The answer is: 12.") == "12"
    assert answers_match("12 467", "12467")


def test_the_oracle_reads_the_value_asserted_against_the_traces_question_and_says_when_it_cannot_tell() -> None:
    def judged(answer: str, question: str) -> Verdict:
        trace = make_trace(question, [{"reasoning": answer, "is_final_answer": True}], final_answer=answer)
        return OracleVerifier().verify(trace, expected="2008")

    laps = judged("The answer is 2008 laps.", "how many laps did she run?")
    assert laps.is_correct is True and laps.extracted_answer == "2008 laps" and laps.label is None
    assert laps.reasoning == "matches the expected answer: it asserts '2008' (unit after the number stripped)"
    games = judged("2008 Summer Games", "in which year did she first compete?")
    assert games.is_correct is False and games.reasoning == "differs from the expected answer"  # a name, no unit
    undecided = judged("It was either 2004 or 2008", "in what year were there the most births?")
    assert undecided.is_correct is None and undecided.label == "undecided" and is_undecided(undecided)
    assert undecided.reasoning.startswith("undecided: the answer names '2004', '2008'")
    assert not is_undecided(judged("It was 2004", "in what year were there the most births?"))


@pytest.mark.parametrize(
    ("text", "target", "extracted", "correct"),
    [
        ("According to this, ... So the answer is (C)", "(D)", "(C)", False),
        ("So the answer is (D).", "(D)", "(D)", True),
        ("So the answer is D", "(D)", "(D)", True),
        ("... = -58 - (-70) = 12. So the answer is 12", "12", "12", True),
        ("So the answer is -14.", "-14", "-14", True),
        ('So, we need "]", ">". So the answer is ] >', "] >", "] >", True),
        (
            "The answer is ammerman atheism bay basilisk",
            "ammerman atheism basilisk bay",
            "ammerman atheism bay basilisk",
            False,
        ),
        (
            "The answer is Ammerman atheism basilisk bay.",
            "ammerman atheism basilisk bay",
            "ammerman atheism basilisk bay",
            True,
        ),
    ],
)
def test_bbm_extraction_by_target_form(text: str, target: str, extracted: str, correct: bool) -> None:
    assert extract_bbm_answer(text, target=target) == extracted
    assert BBMVerifier().verify(_trace(text), expected=target).is_correct is correct


TRACKING = (
    "Alice, Bob and Claire each hold a ball. At the end of the game, Claire has the\nOptions:\n(A) green ball.\n"
    "(B) orange ball.\n(C) orange and white ball.\n"
)
DYCK = "Complete the rest of the sequence, making sure that the parentheses are closed properly. Input: ( < [ ( )"


@pytest.mark.parametrize(
    ("text", "target", "question", "extracted"),
    [
        ("So the answer is Claire has the green ball.", "(A)", TRACKING, "(A)"),  # the option's text, in a sentence
        ("So the answer is green", "(A)", TRACKING, "(A)"),  # part of one option's text only
        ("So the answer is orange", "(B)", TRACKING, None),  # part of two: names none
        ("So the answer is orange and white ball", "(C)", TRACKING, "(C)"),  # one option's whole text holds another's
        ("So the answer is ball", "(A)", TRACKING, None),
        ("So the answer is green", "(A)", "", None),  # no options listed: a word is no label
        ("So the answer is ( < [ ( ) ] > )", "] > )", DYCK, "] > )"),  # the whole sequence: what it adds
        ("So the answer is ] > )", "] > )", DYCK, "] > )"),
        ("So the answer is ( < [ ( )", "] > )", DYCK, "( < [ ( )"),  # adds nothing: read as written, wrong
    ],
)
def test_bbm_answers_are_read_in_the_questions_terms(text: str, target: str, question: str, extracted: str) -> None:
    assert extract_bbm_answer(text, target=target, question=question) == extracted
    verdict = BBMVerifier().verify(_trace(text).model_copy(update={"question": question}), expected=target)
    assert verdict.is_correct is (extracted == target)


def test_self_verifier_uses_the_llm_without_ground_truth() -> None:
    llm = ScriptedLLM([{"is_correct": False, "confidence": 0.9, "reasoning": "wrong city"}])
    verdict = SelfVerifier(llm).verify(_trace("Rome"), expected="SECRET-TRUTH")
    assert verdict.is_correct is False and verdict.confidence == 0.9
    assert "SECRET-TRUTH" not in llm.requests[0].text
    broken = SelfVerifier(ScriptedLLM(["nope", "still nope"])).verify(_trace("Rome"), expected=None)
    assert broken.is_correct is None and "judge failed" in broken.reasoning


def test_a_verifiers_capabilities_are_found_by_its_methods() -> None:
    """The combined verifier calls a model, resamples the agent and judges replays by the original run; the
    oracle does none of these, so binding it returns it as it is."""
    from reflect_otel.flagging.combined import flagging_verifier
    from reflect_otel.flagging.verifiers import (
        CallsLLM,
        JudgesByOriginal,
        ResamplesRuns,
        bound_to,
        bound_to_original,
        bound_to_runs,
        takes_runs,
        unprovable_by,
    )

    combined = flagging_verifier("combined", ScriptedLLM([]))
    assert isinstance(combined, CallsLLM) and isinstance(combined, ResamplesRuns) and takes_runs(combined)
    assert isinstance(combined, JudgesByOriginal)
    wrong = _trace("Rome")
    judged = bound_to_original(combined, wrong, Verdict(verifier="combined", is_correct=False))
    assert judged is not combined and unprovable_by(judged) is not None  # never resampled: no consensus to judge by
    oracle = OracleVerifier()
    assert not isinstance(oracle, CallsLLM) and not takes_runs(oracle)
    assert bound_to(oracle, ScriptedLLM([])) is oracle and bound_to_runs(oracle, None) is oracle
    assert bound_to_original(oracle, wrong, Verdict(verifier="oracle", is_correct=False)) is oracle
    assert unprovable_by(oracle) is None
