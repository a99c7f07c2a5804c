"""The value an answer asserts, read from its form: the text the judge compares (:func:`reflect_otel.flagging.judge.judge_answer`).

:func:`extract_answer` finds the answer a final message states (after its last "answer is" marker, or inside
``\\boxed{}``); :func:`asserted` reads which value that answer asserts, from the answer and the question alone (never
from the expected answer, so every run, replay and method is read the same way), by the first reading that applies:

1. **The question's options.** A question offering "A or B" (not one asking for a count) is answered by the option
   the answer names: "The United States is better." names the first of "is the united stated or scotland better?".
   An answer naming both asserts one only where its form says which ("A is older than B" when the question asks for
   the oldest, "A rather than B", "A, not B"); else none (undecided).
2. **A denied value dropped.** "Arsenal won, not Chelsea" asserts what comes before ", not".
3. **Words restated from the question stripped** from the ends of a sentence, with the words every sentence wraps
   a value in ("there", "is", "the", "total"): "There are 16 tracks listed in the table" asserts "16" for "how many
   tracks are listed in this table?". Never in a list (a comma, semicolon, ``|`` or line break sets parts apart:
   "Zembla, Ruritania" stays whole), never a negation, and never a capitalised word a name ends on ("the 2008
   Summer Olympics" keeps "Olympics").
4. **Several values offered** ("either 2004 or 2008"), or two compared other than as the question compares
   ("fewer in 2004 than in 2008" for "which year had more?"): none asserted (undecided), each a candidate. Two
   compared as the question compares ("more medals in 2008 than in 2004" for "more medals"): the first.
5. **A unit after a number stripped** (after any of the above): "22 laps" asserts "22" where each word after the
   number is a unit of measure or a word of the question, never a scale ("0.997 million") nor a name ("2008 Summer
   Olympics").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Asserted", "asserted", "extract_answer"]

_ANSWER_MARKERS = re.compile(
    r"(?:final answer|the answer is|answer is|answer:|the result is|therefore,? the answer is)\s*(?::|-(?=\s))?\s*",
    re.IGNORECASE,
)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


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


@dataclass(frozen=True, slots=True)
class Asserted:
    """What an answer asserts: one ``value``, or (``value`` None) the ``candidates`` it offers without saying which.
    ``how`` names the readings applied ("as written" when none); ``cut`` says the value was cut out of a sentence,
    so a leading article may be the sentence's rather than the value's."""

    value: str | None
    candidates: tuple[str, ...] = ()
    how: str = "as written"
    cut: bool = False


_MAX_CHARS = 2000
_WORD = re.compile(r"[^\W_]+(?:['\u2019./-][^\W_]+)*")
_LIST_MARK = re.compile(r"[;|\n]|,(?!\d{3}\b)")
"""What sets an answer's parts apart (not the comma of "12,467"; a date's is told apart by :func:`_is_list`)."""
_NUMBER = re.compile(r"\d+(?:st|nd|rd|th)\b|[$\u20ac\u00a3\u00a5]?[+-]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)%?", re.IGNORECASE)
_COUNT_QUESTION = re.compile(r"\b(?:how many|how much|number of|what number)\b", re.IGNORECASE)
_DENIED = re.compile(r"\s*,\s*(?:but\s+|and\s+)?not\s+|\s+(?:but|and)\s+not\s+", re.IGNORECASE)
_OFFERED = re.compile(r"\s*,?\s*\bor\b\s*|\s*[;|\n]\s*|\s*,(?!\d{3}\b)(?! \d{4}\b)\s*", re.IGNORECASE)
_OR = re.compile(r"\bor\b", re.IGNORECASE)
_MONTHS = (
    r"\b(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|"
    r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\b"
)
_MONTH = re.compile(_MONTHS, re.IGNORECASE)
_DATE_COMMA = re.compile(_MONTHS + r"\.? \d{1,2}(?:st|nd|rd|th)?$", re.IGNORECASE)
_PREFERRED = re.compile(r"\b(?:rather than|instead of)\b", re.IGNORECASE)

# fmt: off
_FILLER = frozenset({
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "it", "its", "this", "that", "these", "those", "there",
    "here", "in", "on", "of", "at", "to", "for", "from", "by", "with", "as", "has", "have", "had", "he", "she", "they",
    "his", "her", "their", "either", "both", "maybe", "perhaps", "possibly", "probably", "about", "approximately",
    "table", "row", "rows", "column", "listed", "total", "number", "count", "answer", "result", "value",
})
"""The words any sentence wraps its value in, whatever the question: stripped from its ends like the question's."""
_NEGATIONS = frozenset({"not", "no", "never", "none", "neither", "nor"})
_OR_BOUND = frozenset({
    "more", "less", "fewer", "greater", "higher", "lower", "larger", "smaller", "longer", "shorter", "older", "younger",
    "earlier", "later", "above", "below", "over", "under",
})
"""Words that, after a number and "or", make a bound, not a choice: "15 or more seats", "5 or fewer" (while "above
or below" and "higher or lower" offer two options)."""
_OR_HEDGE = frozenset({"so", "not", "else"})
"""Words after "or" that hedge, never an option: "or so", "whether or not"."""
_COPULAS = frozenset({"is", "are", "was", "were"})
_SCALES = frozenset({
    "hundred", "hundreds", "thousand", "thousands", "million", "millions", "billion", "billions", "trillion", "dozen",
    "k", "bn", "mn",
})
_UNITS = frozenset({
    "m", "cm", "mm", "km", "mi", "mile", "miles", "ft", "foot", "feet", "inch", "inches", "yd", "yard", "yards", "metre",
    "metres", "meter", "meters", "kilometre", "kilometres", "kilometer", "kilometers", "centimetre", "centimetres",
    "centimeter", "centimeters", "kg", "g", "mg", "lb", "lbs", "pound", "pounds", "oz", "t", "tonne", "tonnes", "ton",
    "tons", "s", "sec", "secs", "second", "seconds", "min", "mins", "minute", "minutes", "h", "hr", "hrs", "hour",
    "hours", "day", "days", "week", "weeks", "month", "months", "year", "years", "yr", "yrs", "mph", "km/h", "kph", "hz",
    "khz", "mhz", "ghz", "kb", "mb", "gb", "tb", "bit/s", "kbit/s", "mbit/s", "gbit/s", "w", "kw", "mw", "gw", "v",
    "kv", "degrees", "degree", "\u00b0c", "\u00b0f", "percent", "pct", "l", "litres", "liters", "ml", "acres",
    "hectares", "ha", "sq", "dollars", "euros", "usd", "eur", "gbp", "times", "points", "pts", "votes", "people",
    "persons",
})
"""Units of measure and counted things general enough to follow any number (the question's own words count too)."""
_IRREGULAR = {
    "more": "much", "most": "much", "less": "little", "least": "little", "fewer": "few", "fewest": "few",
    "better": "good", "best": "good", "worse": "bad", "worst": "bad",
}
_NOT_GRADED = frozenset({
    "after", "answer", "border", "center", "centre", "chapter", "computer", "corner", "driver", "either", "ever",
    "however", "her", "leader", "letter", "manager", "matter", "member", "minister", "never", "neither", "number",
    "offer", "order", "other", "over", "owner", "paper", "partner", "per", "player", "power", "premier", "quarter",
    "rather", "river", "rider", "singer", "summer", "their", "together", "tower", "under", "user", "water", "whether",
    "winner", "winter", "writer", "interest", "forest", "west", "east", "guest",
})
"""Words ending in -er or -est that grade nothing."""
# fmt: on
_COMPARED_WITHIN = 4
"""A comparison's word stands at most this many words before "than" ("more medals in 2008 than")."""


def _fold(word: str) -> str:
    word = word.casefold().replace("\u2019", "'")
    return word[:-2] if word.endswith("'s") else word


def _same_word(one: str, other: str) -> bool:
    """The same word up to case, a plural, or one letter slipped in a word of five or more ("States" for "stated");
    numbers only exactly."""
    a, b = _fold(one), _fold(other)
    if a == b:
        return True
    if any(c.isdigit() for c in a + b):
        return False
    if b in (a + "s", a + "es") or a in (b + "s", b + "es"):
        return True
    return min(len(a), len(b)) >= 5 and _one_edit(a, b)


def _one_edit(a: str, b: str) -> bool:
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return len(long) - len(short) == 1 and any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def _graded(word: str) -> str | None:
    """The quality a comparative or superlative grades ("older", "oldest": "old"), else None."""
    word = _fold(word)
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if word in _NOT_GRADED:
        return None
    for suffix in ("iest", "ier", "est", "er"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 2:
            stem = word[: -len(suffix)]
            return stem + "y" if suffix.startswith("i") else stem
    return None


def _other_name(word: str, asked: str) -> bool:
    """Whether ``word`` goes on a name where the question's option goes on with another word."""
    return _name_like(word) and not _filler(word) and not _same_word(word, asked)


def _name_like(word: str) -> bool:
    return word[:1].isupper() or any(c.isdigit() for c in word)


def _filler(word: str) -> bool:
    return _fold(word) in _FILLER


def _span(text: str, first: re.Match[str], last: re.Match[str]) -> str:
    """The text from word ``first`` to word ``last``, with a currency sign before and a ``%`` after."""
    start, end = first.start(), last.end()
    if start > 0 and text[start - 1] in "$\u20ac\u00a3\u00a5":
        start -= 1
    if end < len(text) and text[end] == "%":
        end += 1
    if end < len(text) and text[end] == ")" and text.count("(", start, end) > text.count(")", start, end):
        end += 1
    return text[start:end]


def _is_list(text: str) -> bool:
    """Whether a comma, semicolon, ``|`` or line break sets parts of ``text`` apart: not the comma of "12,467" nor
    that of "February 28, 2012"."""
    return any(
        mark.group() != ","
        or not (_DATE_COMMA.search(text, 0, mark.start()) and text[mark.end() :][:5].strip().isdigit())
        for mark in _LIST_MARK.finditer(text)
    )


def _words(text: str) -> list[re.Match[str]]:
    return list(_WORD.finditer(text))


class _Reader:
    """Answers read against one question."""

    def __init__(self, question: str) -> None:
        self.question = [m.group() for m in _WORD.finditer(question[:_MAX_CHARS])]
        self.asks_count = bool(_COUNT_QUESTION.search(question))
        self.grades = {g for q in self.question if (g := _graded(q)) is not None}

    def asks(self, word: str) -> bool:
        """A word of the question (up to a plural or a slip)."""
        return any(_same_word(word, q) for q in self.question)

    def restated(self, word: str) -> bool:
        return _fold(word) not in _NEGATIONS and (_filler(word) or self.asks(word))

    def trim(self, text: str) -> str | None:
        """``text`` without the words it restates at its ends (reading 3); None when that changes nothing, when
        ``text`` is a list, or when it is all restated and no "X is Y" says which side is the value."""
        words = _words(text)
        if len(words) < 2 or _is_list(text) or not self._sentence(words):
            return None
        restated = [self.restated(w.group()) for w in words]
        if all(restated):
            return _copula_side(text, words)
        if not any(restated):
            return None
        first = restated.index(False)
        last = len(words) - 1 - restated[::-1].index(False)
        # a name goes on through the capitalised words the question also has; the first word is capitalised anyway
        while last + 1 < len(words) and _name_like(words[last + 1].group()) and not _filler(words[last + 1].group()):
            last += 1
        while first > 1 and _name_like(words[first - 1].group()) and not _filler(words[first - 1].group()):
            first -= 1
        value = _span(text, words[first], words[last])
        return value if value != text.strip() else None

    def _sentence(self, words: list[re.Match[str]]) -> bool:
        """Whether ``words`` restate the question as a sentence does ("There are 16 tracks"): a copula, or a word
        of the question written in lower case; a name that shares a word with the question ("Lake Zembla") does not."""
        return any(
            _fold(w.group()) in _COPULAS or (w.group().islower() and self.asks(w.group()) and not _filler(w.group()))
            for w in words
        )

    # -- reading 1: the question's options ---------------------------------------------------------------------
    def _keys(self) -> tuple[int, int, int] | None:
        """For a question offering "A or B": the index of "or", and of each option's key word, its word nearest
        "or" that the other option does not also have (the key of "lake van or lake ercek" are "van", "ercek")."""
        if self.asks_count:
            return None
        q = self.question
        at = next((i for i, w in enumerate(q) if w.casefold() == "or" and 0 < i < len(q) - 1), None)
        if at is None or _fold(q[at + 1]) in _OR_HEDGE:
            return None
        if _fold(q[at + 1]) in _OR_BOUND and _NUMBER.fullmatch(q[at - 1]):
            return None
        before, after = q[max(0, at - 4) : at], q[at + 1 : at + 5]
        left = next(
            (i for i in range(at - 1, max(-1, at - 5), -1) if not any(_same_word(q[i], w) for w in after)), None
        )
        right = next(
            (i for i in range(at + 1, min(len(q), at + 5)) if not any(_same_word(q[i], w) for w in before)), None
        )
        return None if left is None or right is None else (at, left, right)

    def choice(self, answer: str) -> Asserted | None:
        """The option the answer names (reading 1); None when the question offers none, or the answer names neither,
        names one in a list or with a negation, or denies both."""
        keys = self._keys()
        if keys is None:
            return None
        at, left, right = keys
        words = _words(answer)
        sides = (
            self._side(answer, words, left, 0, at - 1),
            self._side(answer, words, right, at + 1, len(self.question) - 1),
        )
        named = [side for side in sides if side is not None]
        said = [side for side in named if not _denied(words, side[0])]
        if len(named) == 2:
            if len(said) == 1:
                return Asserted(said[0][1], how="the option not denied", cut=True)
            if not said:
                return None
            ahead = self._comparison(answer, words)
            if ahead is not None:
                return Asserted(sorted(named)[ahead][1], how="the option the comparison puts ahead", cut=True)
            return Asserted(
                None, candidates=tuple(s[1] for s in named), how="both options named, neither asserted", cut=True
            )
        if len(said) != 1 or _is_list(answer) or any(_fold(w.group()) in _NEGATIONS for w in words):
            return None  # "Scotland is not better" names one option and asserts nothing of it
        return Asserted(said[0][1], how="the option the answer names", cut=True)

    def _side(self, answer: str, words: list[re.Match[str]], key: int, low: int, high: int) -> tuple[int, str] | None:
        """Where the answer names the option whose key is question word ``key``, and the option as it writes it."""
        at = next((i for i, w in enumerate(words) if _same_word(w.group(), self.question[key])), None)
        if at is None:
            return None
        span = self._option(answer, words, at, key, low, high)
        return None if span is None else (at, span)

    def _option(self, answer: str, words: list[re.Match[str]], at: int, key: int, low: int, high: int) -> str | None:
        """The option as the answer writes it: the word at ``at`` (question word ``key``) and, where the answer writes
        it as a name, the option's neighbouring words (question words ``low``..``high``) it writes as the name goes on
        ("The United States"; "after", not "after 2000"). None when the answer's name goes on other than the option
        does ("SATA 3 Gbit/s" for "sata 6 gbit/s")."""
        if not _name_like(words[at].group()):  # a word, not a name: the option is that word ("after", "above")
            return _span(answer, words[at], words[at])
        first, q = at, key
        while first > 0 and q > low and self._continues(words[first - 1].group(), q - 1):
            first, q = first - 1, q - 1
        if first > 0 and q > low and _other_name(words[first - 1].group(), self.question[q - 1]):
            return None
        last, q = at, key
        while last + 1 < len(words) and q < high and self._continues(words[last + 1].group(), q + 1):
            last, q = last + 1, q + 1
        if last + 1 < len(words) and q < high and _other_name(words[last + 1].group(), self.question[q + 1]):
            return None
        return _span(answer, words[first], words[last])

    def _continues(self, word: str, q: int) -> bool:
        return _same_word(word, self.question[q]) and _name_like(word) and not _filler(word)

    def _comparison(self, answer: str, words: list[re.Match[str]]) -> int | None:
        """Which of two values ``answer`` puts ahead: 0 the first ("A rather than B", or "A is older than B" for a
        question asking for the oldest), 1 the second ("A is not older than B"), None where it does not compare them
        as the question does."""
        if _PREFERRED.search(answer):
            return 0
        than = next((i for i, w in enumerate(words) if w.group().casefold() == "than"), None)
        if than is None:
            return None
        clause = words[:than]
        graded = (_graded(w.group()) for w in clause[-_COMPARED_WITHIN:])
        if not any(g is not None and g in self.grades for g in graded):
            return None
        return 1 if any(_fold(w.group()) in _NEGATIONS for w in clause) else 0

    # -- reading 4: the answer's own alternatives --------------------------------------------------------------
    def alternatives(self, core: str, answer: str) -> Asserted | None:
        """Several values of one kind offered ("2004 or 2008"), or two compared ("more in 2008 than in 2004")
        (reading 4); None when ``core`` does neither."""
        if _OR.search(core):
            parts = [self.trim(p) or p.strip() for p in _OFFERED.split(core) if p and p.strip()]
            parts = [self.without_unit(p) or p for p in parts]
            if len(parts) >= 2 and _one_kind(parts):
                return Asserted(None, candidates=tuple(parts), how="several values offered, none asserted", cut=True)
        words = _words(answer)
        than = next((i for i, w in enumerate(words) if w.group().casefold() == "than"), None)
        if than is None:
            return None
        sides = [self._values(answer, words[:than]), self._values(answer, words[than + 1 :])]
        if len(sides[0]) != 1 or len(sides[1]) != 1 or not _one_kind([sides[0][0], sides[1][0]]):
            return None
        ahead = self._comparison(answer, words)
        if ahead is not None:
            return Asserted(sides[ahead][0], how="the value the comparison puts ahead", cut=True)
        return Asserted(
            None, candidates=(sides[0][0], sides[1][0]), how="two values compared, neither asserted", cut=True
        )

    def _values(self, text: str, words: list[re.Match[str]]) -> list[str]:
        """The runs of ``words`` that are neither restated from the question nor a comparison's word."""
        runs: list[list[re.Match[str]]] = [[]]
        for word in words:
            if self.restated(word.group()) or _graded(word.group()) is not None or _fold(word.group()) == "than":
                runs.append([])
            else:
                runs[-1].append(word)
        return [_span(text, run[0], run[-1]) for run in runs if run]

    # -- reading 5: a unit after a number ----------------------------------------------------------------------
    def without_unit(self, text: str) -> str | None:
        """The number ``text`` starts with, when every word after it is a unit (reading 5); else None."""
        text = text.strip()
        number = _NUMBER.match(text)
        if number is None:
            return None
        rest = text[number.end() :]
        units = _words(rest)
        if not rest[:1].isspace() or not units or len(units) > 3 or _WORD.sub("", rest).strip(" /.\u00b0"):
            return None
        for unit in units:
            word = _fold(unit.group())
            if word in _SCALES or any(c.isdigit() for c in word):
                return None
            if word not in _UNITS and (_filler(word) or not self.asks(word)):
                return None
        return number.group()


def _copula_side(text: str, words: list[re.Match[str]]) -> str | None:
    """In "X is Y" made of the question's words alone, the side that is more than filler ("It is Lake Zembla")."""
    at = next((i for i, w in enumerate(words[1:-1], start=1) if _fold(w.group()) in _COPULAS), None)
    if at is None:
        return None
    left, right = words[:at], words[at + 1 :]
    left_says = any(not _filler(w.group()) for w in left)
    right_says = any(not _filler(w.group()) for w in right)
    if left_says == right_says:
        return None
    side = left if left_says else right
    return _span(text, side[0], side[-1])


def _kind(value: str) -> str | None:
    """ "number" (a date counts), "name" (capitalised words) or "word" (one lower-case word); None for anything
    else (a clause, an error message)."""
    words = _words(value)
    if not words or len(words) > 6:
        return None
    if _NUMBER.fullmatch(value.strip()) or (any(c.isdigit() for c in value) and _MONTH.search(value)):
        return "number"
    if _WORD.sub("", value).strip(" .,'-&"):
        return None
    if all(_name_like(w.group()) or _filler(w.group()) for w in words) and _name_like(words[0].group()):
        return "name"
    return "word" if len(words) == 1 else None


def _one_kind(values: list[str]) -> bool:
    """Whether ``values`` are candidates for one answer: all numbers, all names or all single words."""
    kinds = {_kind(v) for v in values}
    return len(kinds) == 1 and None not in kinds


def _denied(words: list[re.Match[str]], at: int) -> bool:
    return any(_fold(w.group()) in _NEGATIONS for w in words[max(0, at - 2) : at])


def asserted(answer: str, *, question: str = "") -> Asserted:
    """The value ``answer`` asserts as an answer to ``question`` (the module's readings, the first that applies)."""
    answer = answer[:_MAX_CHARS].strip()
    reader = _Reader(question)
    chosen = reader.choice(answer)
    if chosen is not None:
        return _then_unit(reader, chosen)
    number = reader.without_unit(answer)
    if number is not None:
        return Asserted(number, how="unit after the number stripped")
    how: list[str] = []
    text = answer
    kept, *denied = _DENIED.split(text, maxsplit=1)
    if denied and kept.strip():
        text = kept.strip()
        how.append("a denied value dropped")
    trimmed = reader.trim(text)
    if trimmed is not None:
        how.append("words restated from the question stripped")
    core = trimmed if trimmed is not None else text
    offered = reader.alternatives(core, text)
    if offered is not None:
        how.append(offered.how)
        return _then_unit(reader, Asserted(offered.value, offered.candidates, "; ".join(how), cut=True))
    return _then_unit(reader, Asserted(core, how="; ".join(how) or "as written", cut=bool(how)))


def _then_unit(reader: _Reader, found: Asserted) -> Asserted:
    if found.value is None:
        candidates = tuple(reader.without_unit(c) or c for c in found.candidates)
        return Asserted(None, candidates, found.how, found.cut)
    number = reader.without_unit(found.value)
    if number is None:
        return found
    how = (
        "unit after the number stripped"
        if found.how == "as written"
        else f"{found.how}; unit after the number stripped"
    )
    return Asserted(number, how=how, cut=found.cut)
