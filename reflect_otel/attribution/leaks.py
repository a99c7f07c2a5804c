"""The leak guard: nothing that carries the expected answer reaches a replay, for any method.

In the oracle regime the auditor sees the expected answer. A correction that carries it (a plan saying "answer
Paris", an action filtering on it, a Reflexion memory quoting "5") would flip a replay from any step and prove
nothing about the step. So every text a method puts into a replayed agent's context and every action it executes
there is checked first, and refused, with the refusal recorded, when it

* contains a value of the expected answer as a whole token sequence under the judge's normalisation
  (:mod:`reflect_otel.flagging.judge`): ``12,500`` is found in "pick 12500 tickets", ``Lisbon`` in "filter on 'lisbon'",
  and a lone ``5`` in "step 5" (a one-character answer is not exempt: it cannot be told apart from a leak);
  a date is found written in any form the judge reads; a part that gives the value away alone counts as the value
  (each date of a range, the number of "12 days");
* names it in its own form where the answer is an option label or a bracket sequence: ``(B)`` as "(B)", "option B"
  or the option's text where the question lists ``(B) text`` (never the letter as a word: "a" is in most texts), and
  ``] > )`` written in a run of brackets, spaced or not (a bracket answer has no tokens to find);
* or states an answer ("the correct answer is ...", "answer: ...", the mask "[the answer]" of earlier versions).

Masking the answer out of a correction is not enough: "The correct answer is [the answer]" still tells the agent
to stop and answer. The agent's own decisions are not checked (they are not the oracle's), only what is given to it.
So an action executed in place of a step is checked for what it introduces (:func:`action_leak`): a fix of one
literal in ``... WHERE city = 'boston' LIMIT 1`` is not refused for the agent's own ``1`` when the answer is 1, but
a fix that writes a value of the answer (``'1'`` for 1 where the agent wrote ``'one'``, ``'Paris'``) or states one
is. An argument may correct the agent's own spelling of an answer that the question itself names ("Lisboa" -> "Lisbon"
in "Is Lisbon or Porto older?"): the agent had chosen that value, the question gave it, and the fix only makes
the lookup match. Naming the option alone, where the agent named another or none, is the choice the oracle knows,
and stays refused. The exemption needs all of: a question of at most :data:`QUESTION_CHARS` characters naming the
value as a whole token sequence; a value of at least :data:`QUESTION_VALUE_CHARS` letters and digits ("1" or "a"
appear in most questions); and the agent's own argument holding, for every occurrence the fix writes, the value or a
near spelling of it (as many tokens, similarity at least :data:`NEAR_SPELLING`). Statements of an answer are
refused wherever the value comes from.

The guard stands where text is about to reach a replay, not at the auditor's reply: the auditor is shown the
answer, so its root cause naturally names it, and that text reaches no replay unless it is injected. A repair plan
is checked part by part before it is injected (:func:`guard_plan`): a part that carries the answer is withheld from
the agent and the refusal recorded, the rest is given; the plan's step, error type and corrected step (an action,
checked on its own) are kept.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from difflib import SequenceMatcher

from reflect_otel.flagging.judge import answer_value, answer_values, listed_options, option_label
from reflect_otel.record import RepairPlan
from reflect_otel.trace import StepAction

__all__ = [
    "INSTRUCTION",
    "NEAR_SPELLING",
    "QUESTION_CHARS",
    "QUESTION_VALUE_CHARS",
    "Withheld",
    "action_leak",
    "guard_plan",
    "leak",
    "states_an_answer",
]

_TOKEN = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?|\.\d+|[^\W\d_]+", re.UNICODE)
"""Words and numbers; a comma inside a number only as a thousands separator ("12,467"), so "rows 5, 6" writes 5."""
_MINUSES = re.compile("[\u2010-\u2015\u2212\ufe63\uff0d]")
"""Every dash a minus sign may be written as (the judge reads "\u22127" and "\u20137" as -7): folded to "-"."""
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
_LOOKBACK_CHARS = 40
"""How far back past spaces a minus sign's operand is looked for (more spaces than that: a sign)."""
_BRACKETS = "[](){}<>"
_BRACKET_RUN = re.compile(r"[\[\](){}<>](?:\s*[\[\](){}<>])*")
QUESTION_VALUE_CHARS = 3
"""The shortest answer value (letters and digits) an action may respell because the question names it (the module)."""
QUESTION_CHARS = 300
"""The longest question read for the exemption: a longer one holds more than a question (a table, a context)."""
NEAR_SPELLING = 0.8
"""How alike (difflib's ratio) the agent's spelling and the answer value must be for a fix to be a respelling."""


def _tokens(text: str) -> list[str]:
    folded = "".join(c for c in unicodedata.normalize("NFKD", text[:_MAX_CHARS]) if unicodedata.category(c) != "Mn")
    folded = _MINUSES.sub("-", folded.lower())
    out = []
    for found in _TOKEN.finditer(folded):
        token = found.group()
        if (token[0].isdigit() or token[0] == ".") and _signed(folded, found.start()):
            token = "-" + token
        value = answer_value(token)
        out.append(format(value.number, ".15g") if value.number is not None else token)
    return out


def _signed(text: str, start: int) -> bool:
    """Whether the number at ``start`` has a minus sign, not a subtraction, a hyphen or a bullet before it. After a
    number or a closing bracket on its line a minus subtracts ("5 - 7", "5 -7", "(a)-7"), glued to a word it is a
    hyphen ("C-7", "Boeing-747", "top-5"), between spaces after a word it subtracts ("C - 7"), and first on its line
    with a space after it, it is a bullet ("- 2010: Brazil"). It is a sign at the start of a line ("-7"), after an
    operator or punctuation ("= -7", "(-7)", "x=-7", "= - 7") and after a word and a space ("C is -7")."""
    spaced = text[start - 2 : start] == "- "
    minus = start - 2 if spaced else start - 1
    if minus < 0 or text[minus] != "-":
        return False
    glued = text[minus - 1 : minus]
    line = text[max(0, minus - _LOOKBACK_CHARS) : minus].rsplit("\n", 1)[-1]
    before = line.rstrip()[-1:]
    if not before:
        return not spaced
    if before.isdigit() or before in ")]":
        return False
    if glued.isalnum() or glued == "_":
        return False
    return not (spaced and before.isalnum())


def _occurrences(haystack: list[str], needle: list[str]) -> int:
    if not needle or len(needle) > len(haystack):
        return 0
    return sum(1 for i in range(len(haystack) - len(needle) + 1) if haystack[i : i + len(needle)] == needle)


def _dates(text: str) -> list[tuple[int, int, int]]:
    return [d for d in (answer_value(found).date for found in _DATE_IN_TEXT.findall(text[:_MAX_CHARS])) if d]


def states_an_answer(text: str) -> bool:
    """True when ``text`` states an answer ("the correct answer is", "answer:") whatever it names."""
    return bool(_STATES_ANSWER.search(text[:_MAX_CHARS]))


def _near(words: list[str], needle: list[str]) -> int:
    """How many windows of ``words`` spell ``needle`` (as many tokens, alike by :data:`NEAR_SPELLING` or more)."""
    target, size = " ".join(needle), len(needle)
    return sum(
        1
        for i in range(len(words) - size + 1)
        if SequenceMatcher(None, " ".join(words[i : i + size]), target).ratio() >= NEAR_SPELLING
    )


def _respelled(question: str, value: str, needle: list[str], before: list[str], after: list[str]) -> bool:
    """Whether ``after`` only respells the agent's own ``before`` spelling of ``value``, a value ``question`` names
    (see the module for the conditions)."""
    if not question or len(question) > QUESTION_CHARS or sum(c.isalnum() for c in value) < QUESTION_VALUE_CHARS:
        return False
    if _occurrences(_tokens(question), needle) == 0:
        return False
    return _near(before, needle) >= _occurrences(after, needle)


def _parts(value: str) -> list[str]:
    """The parts of one answer value that give it away alone: each date of a value holding two or more (a range,
    "March 3, 2010 to May 9, 2012": an auditor's "June 1, 2012 vs. March 3, 2010" carried half of it), and the
    number of a number with words ("12 days", "4 home games": "12" is the answer the judge's number rule would then
    read)."""
    dates = [found for found in _DATE_IN_TEXT.findall(value) if answer_value(found).date]
    if len(dates) >= 2:
        return dates
    tokens = _tokens(value)
    numbers = [t for t in tokens if answer_value(t).number is not None]
    if len(numbers) == 1 and len(tokens) > 1 and answer_value(value).date is None:
        return numbers
    return []


def _option_label(text: str, letter: str) -> int:
    """How often ``text`` names the option ``letter``: ``(B)``, "option B", "choice (B)"."""
    return len(re.findall(rf"\(\s*{letter}\s*\)|\b(?:option|choice)\s+{letter}\b", text[:_MAX_CHARS], re.IGNORECASE))


def _bracket_runs(text: str, needle: str) -> tuple[int, int]:
    """How often ``needle`` (brackets, no spaces) is a whole run of brackets in ``text``, and how often it is
    written within one. Both are compared: an original step whose answer "] >" holds ">" must not let a
    replacement that answers ">" alone through."""
    runs = ["".join(run.split()) for run in _BRACKET_RUN.findall(text[:_MAX_CHARS])]
    return sum(run == needle for run in runs), sum(run.count(needle) for run in runs)


def _answer_forms(expected: str, question: str) -> tuple[str | None, str | None, list[str]]:
    """The forms in which ``expected`` is found in a text (see the module): an option label (with the option's text
    among the values, where ``question`` lists it), a bracket sequence, or the values the judge reads."""
    letter = option_label(expected)
    if letter is not None:
        option = listed_options(question).get(letter)
        return letter, None, [option] if option else []  # never the letter as a word: "a" is in most texts
    if expected.strip() and all(c in _BRACKETS or c.isspace() for c in expected):
        return None, "".join(expected.split()), []
    return None, None, [v for whole in answer_values(expected) for v in (whole, *_parts(whole))]


def _carried(
    before: str, after: str, expected: str | None, *, question: str = "", respelling: bool = False
) -> str | None:
    """Why ``after`` carries the answer where ``before`` did not: it states an answer, names the expected option or
    writes the expected bracket sequence, or holds a value of ``expected`` (as a whole token sequence, or as a
    date) more often than ``before`` does, unless (``respelling``: actions' arguments) it respells the agent's own
    spelling of a value ``question`` names (see the module)."""
    if states_an_answer(after) and not states_an_answer(before):
        return "it states an answer ('the answer is ...'): it would tell the agent what to answer"
    if not expected:
        return None
    letter, brackets, values = _answer_forms(expected, question)
    if letter is not None and _option_label(after, letter) > _option_label(before, letter):
        return f"it names the expected option ({letter}): it would flip a replay from any step"
    if brackets is not None and any(
        now > was for now, was in zip(_bracket_runs(after, brackets), _bracket_runs(before, brackets), strict=True)
    ):
        return f"it carries the expected answer {expected!r}: it would flip a replay from any step"
    now, was = _tokens(after), _tokens(before)
    dates_now, dates_was = _dates(after), _dates(before)
    for value in values:
        target = answer_value(value)
        needle = _tokens(value)
        if respelling and question and _respelled(question, value, needle, was, now):
            continue
        if target.date is not None and dates_now.count(target.date) > dates_was.count(target.date):
            return f"it carries the expected answer {value!r} (as a date): it would flip a replay from any step"
        if _occurrences(now, needle) > _occurrences(was, needle):
            return f"it carries the expected answer {value!r}: it would flip a replay from any step"
    return None


def leak(texts: str | Iterable[str], expected: str | None, question: str = "") -> str | None:
    """Why ``texts`` must not reach a replayed agent when ``expected`` is the answer to ``question``, or None (see
    the module; the question gives an option label's text)."""
    joined = texts if isinstance(texts, str) else "\n".join(texts)
    if not joined.strip():
        return None
    return _carried("", joined, expected, question=question)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
    elif value is not None:
        yield str(value)


def action_leak(
    original: StepAction | None, replacement: StepAction, expected: str | None, question: str = ""
) -> str | None:
    """Why executing ``replacement`` in place of the agent's step ``original`` must not reach a replay, or None:
    what the replacement introduces is checked, not what it keeps of the agent's own step. Each argument (and the
    thought) that differs from the original's is read against the original's: refused when it states an answer or
    holds a value of ``expected`` more often than the agent's own argument did (``'boston'`` -> ``'Boston'`` in a
    statement ending ``LIMIT 1`` introduces no 1; ``'one'`` -> ``'1'`` does). A call of another tool (or with
    no original) is new throughout. An argument that respells the agent's own spelling of an answer ``question``
    names is not refused for it (the module says when); the thought is read without that exemption."""
    same_tool = original is not None and original.tool_name == replacement.tool_name
    pairs = [(original.text if original is not None and same_tool else "", replacement.text)]
    for key, value in replacement.arguments.items():
        before = original.arguments.get(key) if original is not None and same_tool else None
        pairs.append(("\n".join(_strings(before)), "\n".join(_strings(value))))
    for number, (before, after) in enumerate(pairs):
        if after != before and after.strip():
            reason = _carried(before, after, expected, question=question, respelling=bool(number))
            if reason is not None:
                return reason
    return None


@dataclass(frozen=True, slots=True)
class Withheld:
    """A part of a repair plan kept from a replayed agent: which part, its text, and why (:func:`leak`'s reason)."""

    part: str
    text: str
    reason: str


INSTRUCTION = "correction instruction"
"""The part of a plan without which there is no guidance to give (:attr:`Withheld.part`)."""


def _next_call(plan: RepairPlan) -> str:
    arguments = plan.expected_next_arguments or {}
    return " ".join([plan.expected_next_tool or "", *(str(v) for v in arguments.values())]).strip()


def guard_plan(plan: RepairPlan, expected: str | None, question: str = "") -> tuple[RepairPlan, tuple[Withheld, ...]]:
    """``plan`` as it may be given to a replayed agent when ``expected`` is the answer, and the parts withheld.

    Each part the guidance writes into the agent's context (the root cause, the instruction, each forbidden action,
    the expected next call with its arguments) is read on its own by :func:`leak`; a part that carries the answer
    or states one is emptied, the others are kept as written. When the instruction is withheld there is no guidance
    left to give (the caller gives none). ``corrected_step`` is kept: it is executed as an action, never injected,
    and is checked as one (:func:`action_leak`)."""
    withheld: list[Withheld] = []

    def kept(part: str, text: str) -> bool:
        reason = leak(text, expected, question)
        if reason is not None:
            withheld.append(Withheld(part, text, reason))
        return reason is None

    root_cause = plan.root_cause if kept("root cause", plan.root_cause) else ""
    instruction = plan.correction_instruction if kept(INSTRUCTION, plan.correction_instruction) else ""
    forbidden = tuple(
        action for number, action in enumerate(plan.forbidden_actions, 1) if kept(f"forbidden action {number}", action)
    )
    call = _next_call(plan)
    update: dict[str, object] = {
        "root_cause": root_cause,
        "correction_instruction": instruction,
        "forbidden_actions": forbidden,
    }
    if call and not kept("expected next call", call):
        update |= {"expected_next_tool": None, "expected_next_arguments": None}
    return (plan.model_copy(update=update) if withheld else plan), tuple(withheld)
