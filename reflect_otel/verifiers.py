"""Is a trace's answer correct? The contract and its implementations.

* :class:`OracleVerifier`: deterministic extraction and normalisation, then a match against the expected
  answer. Strict: when no answer can be extracted, the trace is incorrect.
* :class:`BBMVerifier`: BIG-Bench-Mistake answers (multiple choice, numbers, word lists, bracket sequences).
* :class:`SelfVerifier`: an LLM judges the answer without ground truth.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Protocol

from reflect_otel import prompts
from reflect_otel.errors import LLMError
from reflect_otel.llm.base import StructuredLLM, prompt_budget
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = [
    "BBMVerifier",
    "OracleVerifier",
    "SelfVerifier",
    "Verifier",
    "answers_match",
    "bound_to",
    "extract_answer",
    "extract_bbm_answer",
    "normalise_answer",
]


class Verifier(Protocol):
    """Judges a trace's final answer. ``expected`` is the ground truth when known (oracle regime), else None.

    Returns a :class:`Verdict` whose ``is_correct`` is None when it cannot tell; never raises for bad content.
    A verifier that calls a model also implements ``with_llm(llm) -> Verifier``: the same verifier calling
    ``llm`` instead, so that its calls are recorded in the attribution's cost and held to its token budget
    (:func:`bound_to`). Without it, its calls escape both.
    """

    name: str

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict: ...


def bound_to(verifier: Verifier, llm: StructuredLLM) -> Verifier:
    """``verifier`` making its model calls through ``llm`` (see :class:`Verifier`); one that calls no model is
    returned as it is."""
    rebind = getattr(verifier, "with_llm", None)
    if not callable(rebind):
        return verifier
    bound: Verifier = rebind(llm)
    return bound


# -- extraction and normalisation --------------------------------------------------------------------------------
_ANSWER_MARKERS = re.compile(
    r"(?:final answer|the answer is|answer is|answer:|the result is|therefore,? the answer is)\s*(?::|-(?=\s))?\s*",
    re.IGNORECASE,
)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?$", re.IGNORECASE)
_LIST_SPLIT = re.compile(r"\s*(?:[,;|\n]|\band\b)\s*", re.IGNORECASE)


def extract_answer(text: str | None) -> str | None:
    """The answer a final message states: after the last "answer is"/"Answer:" marker, inside ``\\boxed{}``, or
    the whole text; None when there is nothing."""
    if not text or not text.strip():
        return None
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip() or None
    markers = list(_ANSWER_MARKERS.finditer(text))
    answer = text[markers[-1].end() :] if markers else text
    answer = answer.strip().strip("*").strip()
    answer = re.sub(r"[.!]+$", "", answer).strip()
    return answer or None


def _number(text: str) -> Decimal | None:
    candidate = text.replace(" ", "").lstrip("$").rstrip("%")
    if _THOUSANDS.match(candidate):
        candidate = candidate.replace(",", "")
    if not _NUMBER.match(candidate):
        return None
    try:
        return Decimal(candidate).normalize()
    except InvalidOperation:
        return None


_ORDINAL_DAY = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)\b", re.IGNORECASE)
_DATE_FORMATS = ("%d %B %Y", "%B %d %Y", "%d %b %Y", "%b %d %Y", "%Y-%m-%d", "%B %Y", "%b %Y")
"""Dates written out in words or ISO; all-numeric forms like 02/03/2012 are left alone (day and month are
ambiguous)."""


def _date(text: str) -> str | None:
    """``text`` as an ISO date ("2012-02-28", or "2012-02" for a month) when it is a date written in one of
    :data:`_DATE_FORMATS` (commas and ordinal suffixes ignored), else None."""
    cleaned = " ".join(_ORDINAL_DAY.sub(r"\1", text.replace(",", " ")).split())
    if not cleaned or not any(c.isdigit() for c in cleaned) or len(cleaned) > 40:
        return None
    for form in _DATE_FORMATS:
        try:
            parsed = datetime.strptime(cleaned, form)
        except ValueError:
            continue
        return parsed.strftime("%Y-%m" if "%d" not in form else "%Y-%m-%d")
    return None


def normalise_answer(text: str) -> str:
    """Case, accents, whitespace and punctuation folded; numbers in one form ("12,467" == "12467", "3.0" == "3");
    dates in words or ISO in one form ("28 February 2012" == "February 28, 2012" == "2012-02-28")."""
    number = _number(text.strip())
    if number is not None:
        return format(number, "f").rstrip("0").rstrip(".") if "." in format(number, "f") else format(number, "f")
    date = _date(text.strip())
    if date is not None:
        return date
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    folded = re.sub(r"[^\w\s.-]", " ", folded)
    folded = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", folded)
    folded = re.sub(r"\b(the|a|an)\b", " ", folded)
    return " ".join(folded.split())


def _items(text: str) -> list[str]:
    if _THOUSANDS.match(text.strip()):
        return [normalise_answer(text)]
    return sorted(normalise_answer(part) for part in _LIST_SPLIT.split(text) if part.strip())


def answers_match(answer: str, expected: str) -> bool:
    """Normalised equality; several values (``a|b``, ``a, b``) match as sets, in any order."""
    if normalise_answer(answer) == normalise_answer(expected):
        return True
    expected_items = (
        sorted(normalise_answer(part) for part in expected.split("|")) if "|" in expected else _items(expected)
    )
    return len(expected_items) > 1 and _items(answer) == expected_items


class OracleVerifier:
    """Extract, normalise, match. A missing expected answer gives ``is_correct=None`` (it cannot tell)."""

    name = "oracle"

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        extracted = extract_answer(trace.final_answer)
        if expected is None:
            return Verdict(
                verifier=self.name,
                is_correct=None,
                extracted_answer=extracted,
                confidence=0.0,
                reasoning="no expected answer to compare with",
            )
        if extracted is None:
            return Verdict(verifier=self.name, is_correct=False, reasoning="no answer could be extracted")
        correct = answers_match(extracted, expected)
        return Verdict(
            verifier=self.name,
            is_correct=correct,
            extracted_answer=extracted,
            reasoning="matches the expected answer" if correct else "differs from the expected answer",
        )


# -- BIG-Bench Mistake -------------------------------------------------------------------------------------------
_CHOICE = re.compile(r"\(([A-Z])\)")
_BRACKETS = re.compile(r"[\[\](){}<>]")
_SIGNED_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")


def extract_bbm_answer(text: str | None, *, target: str) -> str | None:
    """A BIG-Bench-Mistake answer in the form of ``target``: ``(C)``, a number, a bracket sequence, or words."""
    stated = extract_answer(text)
    if stated is None:
        return None
    if _CHOICE.fullmatch(target.strip()):
        choices = _CHOICE.findall(stated)
        if choices:
            return f"({choices[-1]})"
        bare = re.fullmatch(r"\(?([A-Z])\)?", stated.strip())
        return f"({bare.group(1)})" if bare else None
    if _number(target) is not None:
        numbers = _SIGNED_NUMBER.findall(stated.replace(",", ""))
        return numbers[-1] if numbers else None
    if target.strip() and not _BRACKETS.sub("", target).strip():
        return " ".join(_BRACKETS.findall(stated)) or None
    return " ".join(re.sub(r"[^\w'\s-]", " ", stated.lower()).split()) or None


class BBMVerifier:
    """BIG-Bench-Mistake: extract in the target's form, then compare case-insensitively. Word order matters
    (word sorting is about order)."""

    name = "bbm"

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        if expected is None:
            return Verdict(verifier=self.name, is_correct=None, confidence=0.0, reasoning="no target answer")
        extracted = extract_bbm_answer(trace.final_answer, target=expected)
        if extracted is None:
            return Verdict(verifier=self.name, is_correct=False, reasoning="no answer in the target's form")
        if _number(expected) is not None:
            correct = _number(extracted) == _number(expected)
        else:
            correct = " ".join(extracted.lower().split()) == " ".join(expected.lower().split())
        return Verdict(verifier=self.name, is_correct=correct, extracted_answer=extracted)


class SelfVerifier:
    """An LLM judges the answer from the question and the trace alone (no ground truth is shown, even if known)."""

    name = "self"

    def __init__(self, llm: StructuredLLM, *, max_chars: int = 500, domain_context: str = "") -> None:
        self.llm = llm
        self.max_chars = max_chars
        self.domain_context = domain_context

    def with_llm(self, llm: StructuredLLM) -> SelfVerifier:
        return SelfVerifier(llm, max_chars=self.max_chars, domain_context=self.domain_context)

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        ctx = prompts.PromptContext.of(
            trace,
            None,
            include_expected=False,
            max_chars=self.max_chars,
            budget=prompt_budget(self.llm),
            domain_context=self.domain_context,
        )
        try:
            out = self.llm.complete(prompts.self_verify(ctx, trace.steps), prompts.SelfVerifyOutput, stage="verify")
        except LLMError as error:
            return Verdict(verifier=self.name, is_correct=None, confidence=0.0, reasoning=f"judge failed: {error}")
        judged = out.value
        return Verdict(
            verifier=self.name,
            is_correct=judged.is_correct,
            extracted_answer=extract_answer(trace.final_answer),
            confidence=judged.confidence,
            reasoning=judged.reasoning,
        )
