"""The judge: when an answer equals an expected one. One definition, applied to every method, every run and every
replay (:class:`~reflect_otel.verifiers.OracleVerifier`, the evaluations, the leak guard, replay fidelity).

It follows the official WikiTableQuestions evaluator (ppasupat/WikiTableQuestions ``evaluator.py``, version 1.0.2):

1. **Strings** are normalised: diacritics removed; smart quotes and dashes made ASCII; trailing citations
   (``[1]``, ``†``, ``*``) and trailing details in parentheses removed; outermost double quotes removed; a trailing
   period removed; whitespace collapsed; lower case.
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

__all__ = [
    "AnswerValue",
    "answer_value",
    "answer_values",
    "answers_match",
    "listed_options",
    "normalise_text",
    "option_label",
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
