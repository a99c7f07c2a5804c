"""The leak guard: nothing that carries the expected answer reaches a replay, for any method.

In the oracle regime the auditor sees the expected answer. A correction that carries it (a plan saying "answer
Paris", an action filtering on it, a Reflexion memory quoting "5") would flip a replay from any step and prove
nothing about the step. So every text a method puts into a replayed agent's context and every action it executes
there is checked first, and refused, with the refusal recorded, when it

* contains a value of the expected answer as a whole token sequence under the judge's normalisation
  (:mod:`reflect_otel.judge`): ``12,500`` is found in "pick 12500 tickets", ``Kenya`` in "filter on 'kenya'",
  and a lone ``5`` in "step 5" (a one-character answer is not exempt: it cannot be told apart from a leak);
  a date is found written in any form the judge reads;
* or states an answer ("the correct answer is ...", "answer: ...", the mask "[the answer]" of earlier versions).

Masking the answer out of a correction is not enough: "The correct answer is [the answer]" still tells the agent
to stop and answer. The agent's own decisions are not checked (they are not the oracle's), only what is given to it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from reflect_otel.judge import answer_value, answer_values

__all__ = ["leak", "states_an_answer"]

_TOKEN = re.compile(r"\d[\d,]*(?:\.\d+)?|[^\W\d_]+|\d+", re.UNICODE)
_STATES_ANSWER = re.compile(
    r"\b(?:the\s+)?(?:correct|right|expected|true|final|actual)\s+answer\s+(?:is|should\s+be|would\s+be|was|=|:)"
    r"|\banswer\s+(?:is|should\s+be)\b|\banswer\s*:|\[the answer\]",
    re.IGNORECASE,
)
_DATE_IN_TEXT = re.compile(
    r"\b\d{4}-\d{1,2}-\d{1,2}\b"
    r"|\b\d{1,2}(?:st|nd|rd|th)?\s+[A-Za-z]{3,9}\.?,?\s+\d{4}\b"
    r"|\b[A-Za-z]{3,9}\.?\s+\d{1,2}(?:st|nd|rd|th)?,?\s+\d{4}\b"
    r"|\b[A-Za-z]{3,9}\s+\d{4}\b"
)
_MAX_CHARS = 20_000


def _tokens(text: str) -> list[str]:
    folded = "".join(c for c in unicodedata.normalize("NFKD", text[:_MAX_CHARS]) if unicodedata.category(c) != "Mn")
    out = []
    for token in _TOKEN.findall(folded.lower()):
        value = answer_value(token)
        out.append(format(value.number, "g") if value.number is not None else token)
    return out


def _contains(haystack: list[str], needle: list[str]) -> bool:
    if not needle or len(needle) > len(haystack):
        return False
    first = needle[0]
    return any(
        haystack[i] == first and haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1)
    )


def states_an_answer(text: str) -> bool:
    """True when ``text`` states an answer ("the correct answer is", "answer:") whatever it names."""
    return bool(_STATES_ANSWER.search(text[:_MAX_CHARS]))


def leak(texts: str | Iterable[str], expected: str | None) -> str | None:
    """Why ``texts`` must not reach a replayed agent when ``expected`` is the answer, or None (see the module)."""
    joined = texts if isinstance(texts, str) else "\n".join(texts)
    if not joined.strip():
        return None
    if states_an_answer(joined):
        return "it states an answer ('the answer is ...'): it would tell the agent what to answer"
    if not expected:
        return None
    haystack = _tokens(joined)
    dates = {answer_value(found).date for found in _DATE_IN_TEXT.findall(joined[:_MAX_CHARS])} - {None}
    for value in answer_values(expected):
        target = answer_value(value)
        if target.date is not None and target.date in dates:
            return f"it carries the expected answer {value!r} (as a date): it would flip a replay from any step"
        if _contains(haystack, _tokens(value)):
            return f"it carries the expected answer {value!r}: it would flip a replay from any step"
    return None
