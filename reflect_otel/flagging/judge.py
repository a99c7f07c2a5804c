"""The judge: whether a run's answer is right, wrong or undecided against an expected answer. One definition, applied
to every method, every run and every replay (:class:`~reflect_otel.flagging.verifiers.OracleVerifier`, the evaluations,
replay fidelity, the consistency vote): :func:`judge_answer`.

**What the judge accepts.** A run's final answer is judged right, wrong or undecided against the expected answer, the
same way for every method, run and replay. The judge first reads the value the answer asserts, from the answer and
the question alone (never from the expected answer): "22 laps" asserts 22 (a unit after a number), "Paris, Paris"
asserts Paris (a repetition), "There are 16 tracks listed in the table" asserts 16, and "The United States is
better." asserts United States for "is the United States or Scotland better?" (words restated from the question).
An answer naming several candidates asserts one only where its form says which: "more medals in 2008 than in 2004"
asserts 2008 for "in which year did China win more medals?", and "Arsenal won, not Chelsea" asserts Arsenal.
*Right*: the answer as written, or the value it asserts, equals the expected answer under the official
WikiTableQuestions evaluator's rules below. *Undecided*: the answer names candidates without saying which it asserts,
and one of them is the expected answer: "It was either 2004 or 2008" for 2008, or "before 2000: 5.0%, after 2000:
4.7%" for "were the rates highest before or after 2000?". An undecided run is neither right nor a failure: online
triage and ``reflect-otel attribute`` do not attribute it, an evaluation counts it apart, and a replay that gives it
is no flip. *Wrong*: anything else, such as another number in the same unit ("23 puzzles" for 22), a list with an
extra value ("Kimi Raikkonen, Fernando Alonso" for one driver), a qualified value ("Zembla, Ruritania" for Zembla),
a number in another scale ("0.997 million" for 997000), a name after a number ("2008 Summer Olympics" for 2008), or
an error message that quotes the expected number ("error: t0 has fewer than 23 rows" for 23). Every judgement says
how the value was read (:attr:`Judgement.how`); the readings are listed in :mod:`reflect_otel.flagging._asserted`.

**How values compare** (:func:`answers_match`): the official WikiTableQuestions evaluator (ppasupat/WikiTableQuestions
``evaluator.py``, version 1.0.2):

1. **Strings** are normalised: diacritics removed; smart quotes and dashes made ASCII; trailing citations
   (``[1]``, ``†``, ``*``) and trailing details in parentheses removed; outermost double quotes removed; a trailing
   period removed; whitespace collapsed; lower case. A value cut out of a sentence is compared without a leading
   article as well ("The United States is better." for United States).
2. **Numbers** compare as numbers (``3`` = ``3.0``, within 1e-6). The official evaluator reads a target's number
   from CoreNLP's tagging (which turns ``12,467`` into 12467); without that tagging, the same reading is applied to
   both sides here: thousands separators, a leading currency sign and a trailing ``%`` are dropped.
3. **Dates** compare as (year, month, day): ``yyyy-mm-dd`` with ``xx`` for an unknown field, as the evaluator reads
   them, and, standing in for CoreNLP's tagging of the targets, dates written in words (``28 February 2012``,
   ``February 28, 2012``, ``February 2012``). A year alone is a number.
4. **Lists** are sets: the expected answer's values are separated by ``|``; the answer must have as many values
   and each expected value must match one of them. An answer is one value, unless the expected answer has several:
   then it is split on commas, semicolons, ``|`` and ``and``.

Nothing here is specific to one question; :data:`JUDGE_TABLE` in the tests pins each rule.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from pydantic import BaseModel, ConfigDict

from reflect_otel.flagging._asserted import Asserted, asserted, extract_answer

__all__ = [
    "AnswerValue",
    "Judgement",
    "Outcome",
    "answer_value",
    "answer_values",
    "answers_match",
    "judge_answer",
    "listed_options",
    "normalise_text",
    "option_label",
    "same_answer",
    "split_answer",
]

_SMART_SINGLE = re.compile("[\u2018\u2019\u00b4`]")
_SMART_DOUBLE = re.compile("[\u201c\u201d]")
_DASHES = re.compile("[\u2010\u2011\u2012\u2013\u2014\u2212]")
# the alternatives match disjoint texts (a digit-only bracket only by the first): overlapping ones backtrack
# exponentially on a run of "[1]" markers
_CITATIONS = re.compile("(?:\\[\\d+\\]|(?<!^)\\[(?!\\d+\\])[^\\]]*\\]|[\u2022\u2666\u2020\u2021*#+])*$")
_PARENTHESES = re.compile(r"(?<!^)( \([^)]*\))*$")
_QUOTED = re.compile(r'^"([^"]*)"$')
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?$", re.IGNORECASE)
_ISO_DATE = re.compile(r"^(\d{1,4}|xx|xxxx)-(\d{1,2}|xx)-(\d{1,2}|xx)$")
_ORDINAL_DAY = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)\b", re.IGNORECASE)
_WORD_DATES = ("%d %B %Y", "%B %d %Y", "%d %b %Y", "%b %d %Y", "%B %Y", "%b %Y")
_LIST_SPLIT = re.compile(r"\s*(?:[,;|\n]|\band\b)\s*", re.IGNORECASE)
_MAX_ANSWER_CHARS = 2000
"""Answers are compared on their first 2,000 characters: a run's answer is untrusted content."""


def normalise_text(text: str) -> str:
    """The official evaluator's string normalisation (rule 1 of the module)."""
    text = "".join(
        c for c in unicodedata.normalize("NFKD", text[:_MAX_ANSWER_CHARS]) if unicodedata.category(c) != "Mn"
    )
    text = _DASHES.sub("-", _SMART_DOUBLE.sub('"', _SMART_SINGLE.sub("'", text)))
    while True:
        before = text
        text = _CITATIONS.sub("", text.strip())
        text = _PARENTHESES.sub("", text.strip())
        text = _QUOTED.sub(r"\1", text.strip())
        if text == before:
            break
    if text.endswith("."):
        text = text[:-1]
    return " ".join(text.split()).lower()


@dataclass(frozen=True, slots=True)
class AnswerValue:
    """One value of an answer: its normalised text, and its number or date when it reads as one."""

    text: str
    number: float | None = None
    date: tuple[int, int, int] | None = None

    def matches(self, other: AnswerValue) -> bool:
        if self.text == other.text:
            return True
        if self.number is not None and other.number is not None:
            return abs(self.number - other.number) < 1e-6
        return self.date is not None and self.date == other.date


def _number(text: str) -> float | None:
    candidate = text.replace(" ", "")
    candidate = candidate[1:] if candidate[:1] in "$€£¥" else candidate
    candidate = candidate[:-1] if candidate.endswith("%") else candidate
    if _THOUSANDS.match(candidate):
        candidate = candidate.replace(",", "")
    if not _NUMBER.match(candidate):
        return None
    try:
        value = float(candidate)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def _date(text: str) -> tuple[int, int, int] | None:
    """(year, month, day) with -1 for an unknown field; None when ``text`` is not a date (rule 3)."""
    iso = _ISO_DATE.match(text)
    if iso:
        year, month, day = (-1 if part.startswith("x") else int(part) for part in iso.groups())
        if (
            (year, month, day) == (-1, -1, -1)
            or not (month == -1 or 1 <= month <= 12)
            or not (day == -1 or 1 <= day <= 31)
        ):
            return None
        return year, month, day
    cleaned = " ".join(_ORDINAL_DAY.sub(r"\1", text.replace(",", " ")).split())
    if not cleaned or len(cleaned) > 40 or not any(c.isdigit() for c in cleaned):
        return None
    for form in _WORD_DATES:
        try:
            parsed = datetime.strptime(cleaned, form)
        except ValueError:
            continue
        return parsed.year, parsed.month, parsed.day if "%d" in form else -1
    return None


def answer_value(text: str) -> AnswerValue:
    """``text`` as one value: a number, a date, or a normalised string (rules 1-3)."""
    normal = normalise_text(text)
    number = _number(normal)
    if number is not None:
        return AnswerValue(normal, number=number)
    date = _date(normal)
    if date is not None and date[1] == date[2] == -1:
        return AnswerValue(normal, number=float(date[0]))
    return AnswerValue(normal, date=date)


def answer_values(expected: str) -> list[str]:
    """The values of an expected answer: ``a|b`` holds two (rule 4). The one place ``|`` is read."""
    return [part.strip() for part in expected.split("|") if part.strip()]


def split_answer(answer: str) -> list[str]:
    """An answer's parts when it lists several values (rule 4)."""
    return [part for part in _LIST_SPLIT.split(answer[:_MAX_ANSWER_CHARS]) if part.strip()]


def _denotation_matches(expected: list[AnswerValue], given: list[AnswerValue]) -> bool:
    if len(set(expected)) != len(set(given)):
        return False
    return all(any(e.matches(g) for g in given) for e in expected)


def answers_match(answer: str, expected: str) -> bool:
    """True when ``answer`` equals ``expected`` under the judge (the module's four rules)."""
    targets = [answer_value(v) for v in answer_values(expected)]
    if not targets:
        return False
    if len(targets) == 1:
        return targets[0].matches(answer_value(answer))
    return _denotation_matches(targets, [answer_value(part) for part in split_answer(answer)])


_OPTION_LABEL = re.compile(r"\s*\(([A-Z])\)\s*")
_OPTION_LINE = re.compile(r"^\s*\(([A-Z])\)\s*(.+?)\s*$", re.MULTILINE)


def option_label(answer: str) -> str | None:
    """The letter of an answer that is an option's label (``(B)``), else None."""
    found = _OPTION_LABEL.fullmatch(answer)
    return found.group(1) if found else None


def listed_options(question: str) -> dict[str, str]:
    """The options ``question`` lists as ``(B) text`` lines, by label (the first line of a label wins)."""
    options: dict[str, str] = {}
    for label, text in _OPTION_LINE.findall(question):
        options.setdefault(label, text)
    return options


# -- the judgement: right, wrong or undecided --------------------------------------------------------------------
class Outcome(str, Enum):
    RIGHT = "right"
    WRONG = "wrong"
    UNDECIDED = "undecided"
    """The answer names several values and its form does not say which it asserts, one of them the expected."""


class Judgement(BaseModel):
    """A run's answer judged against an expected answer: the answer its final message states, the value that answer
    asserts (None when undecided or when nothing is stated), the candidates it names when undecided, and ``how``
    the value was read (see the module)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: Outcome
    answer: str | None
    value: str | None
    candidates: tuple[str, ...] = ()
    how: str

    @property
    def correct(self) -> bool | None:
        """True, False, or None when undecided (a :class:`~reflect_otel.verdict.Verdict`'s ``is_correct``)."""
        return {Outcome.RIGHT: True, Outcome.WRONG: False, Outcome.UNDECIDED: None}[self.outcome]


_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)


def _in_substance(value: str, expected: str, *, cut: bool) -> bool:
    """``value`` equals ``expected`` (:func:`answers_match`); a value cut out of a sentence also without a leading
    article on either side, where one value is expected."""
    if answers_match(value, expected):
        return True
    if not cut or len(answer_values(expected)) != 1:
        return False
    return answers_match(_ARTICLE.sub("", value.strip()), _ARTICLE.sub("", expected.strip()))


def _assertion(answer: str, question: str) -> Asserted:
    """What ``answer`` asserts (:func:`reflect_otel.flagging._asserted.asserted`), a repetition of one value ("Paris, Paris",
    "22 laps and 22") read as that value."""
    parts = split_answer(answer)
    if len(parts) >= 2:
        read = [asserted(part, question=question) for part in parts]
        values = [r.value for r in read]
        first = values[0]
        if first is not None and all(v is not None and answer_value(v).matches(answer_value(first)) for v in values):
            how = "repetition collapsed" + ("" if read[0].how == "as written" else f"; {read[0].how}")
            return Asserted(first, how=how, cut=read[0].cut)
    return asserted(answer, question=question)


def judge_answer(text: str | None, expected: str, *, question: str = "") -> Judgement:
    """Whether the final message ``text`` answers ``question`` with ``expected``: right when the answer it states
    (:func:`~reflect_otel.flagging._asserted.extract_answer`) matches as written or the value it asserts matches, undecided
    when it names several candidates (one of them the expected) without saying which it asserts, else wrong."""
    answer = extract_answer(text)
    if answer is None:
        return Judgement(outcome=Outcome.WRONG, answer=None, value=None, how="no answer stated")
    if answers_match(answer, expected):
        return Judgement(outcome=Outcome.RIGHT, answer=answer, value=answer, how="as written")
    found = _assertion(answer, question)
    if found.value is not None:
        right = _in_substance(found.value, expected, cut=found.cut)
        return Judgement(
            outcome=Outcome.RIGHT if right else Outcome.WRONG, answer=answer, value=found.value, how=found.how
        )
    hits = sum(1 for c in found.candidates if _in_substance(c, expected, cut=found.cut))
    outcome = Outcome.UNDECIDED if 0 < hits < len(found.candidates) else Outcome.RIGHT if hits else Outcome.WRONG
    how = found.how if hits else f"{found.how}, none of them the expected answer"
    return Judgement(outcome=outcome, answer=answer, value=None, candidates=found.candidates, how=how)


def same_answer(first: str | None, second: str | None, *, question: str = "") -> bool:
    """Two answers (as :func:`~reflect_otel.flagging._asserted.extract_answer` states them) to ``question`` are the same: each
    matches the other as written, or they assert the same value ("22 laps" and "22"). An undecided answer is the
    same only as written; None is the same only as None."""
    if first is None or second is None:
        return first is None and second is None
    if answers_match(first, second) and answers_match(second, first):
        return True
    one, other = _assertion(first, question), _assertion(second, question)
    if one.value is None or other.value is None:
        return False
    cut = one.cut or other.cut
    return _in_substance(one.value, other.value, cut=cut) and _in_substance(other.value, one.value, cut=cut)
