"""Concrete corrections read from the trace itself (no LLM), and the rules that refuse a correction that would
prove nothing.

A failed or empty tool call often says what the right call is: an error names the valid columns, options or form, or
a candidate for the name it could not find; an empty result lists the values that exist; the question names a value
no call used; the data the agent was shown writes the value another way. Others say what kind of mistake it was: a
parser stopped inside a column name with spaces written unquoted, a text field was compared with a number (or a number
with text), an index asked for a row past the last one the data has. Each rule turns such a finding into a
replacement call of the same tool with one argument changed, and says what it came from. When the argument is a
statement (SQL, a query string) the rule rewrites one identifier or literal in it (one reference: a name written
twice is quoted at both places), the one the error names or the one compared with a value the data writes
differently, never the whole statement. A rule proposes only values read from the trace (the tool's result, earlier
results, the agent's context, the question) and stays silent where they do not tell.

Tool results are read as any tool writes them (:mod:`reflect_otel.reading._tool_text`): JSON objects and arrays (keys naming
the available, valid or existing values; empty row sets; an ``error`` key), library error messages (DuckDB's
``Candidate bindings``, ``Did you mean``, ``Conversion Error``, PostgreSQL's ``HINT`` and ``operator does not exist``,
SQLite's ``no such column`` and ``near "x": syntax error``, pandas' and Python's exceptions, HTTP problem+json) and
prose (``are:``, ``one of``). None knows a dataset or a framework. A rule that only fits one
agent's tools runs for that agent only: its replay adapter carries it (:class:`reflect_otel.replay.HasCorrectionRules`,
as the table demo's wiring gives its own); third parties may also install rules for every trace (entry-point group
``reflect_otel.correction_rules``, see :mod:`reflect_otel.plugins`). Either kind that raises or returns nonsense is
logged by name and skipped. What the rules cannot see: a right value the data does not show, a fix that needs
another tool, or several arguments wrong at once.

A replacement that is the final answer, or that introduces the expected answer into the step
(:mod:`reflect_otel.attribution.leaks`), is refused: it would flip a replay from any step and prove nothing about the step; so
is one that changes nothing (the step itself, or a pure tool's call the prefix already made). :func:`refusal` lists
every refusal.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from reflect_otel import plugins
from reflect_otel.attribution._statement import (
    Token,
    TokenKind,
    bare_spellings,
    comparisons,
    identifier_quote,
    is_sql,
    is_statement,
    marked,
    name_at,
    needs_quotes,
    qualified_start,
    qualifier_of,
    quote_name,
    rewrite,
    tokens,
)
from reflect_otel.attribution.leaks import action_leak
from reflect_otel.flagging.evidence import empty_call, failed_call, question_constraints
from reflect_otel.prompts import CORRECTED_STEP_ASK, without_step_label
from reflect_otel.reading import _tool_text
from reflect_otel.record import Correction, InterventionKind
from reflect_otel.replay import Rule
from reflect_otel.trace import Step, StepAction, StepKind, StructuredTrace

__all__ = [
    "RULES",
    "Rule",
    "agent_corrections",
    "evidence_corrections",
    "last_row",
    "listed_options",
    "listed_values",
    "nearest_option",
    "ordered",
    "question_value",
    "refusal",
    "rule_correction",
    "rules",
    "shown_value",
    "similarity",
    "string_arguments",
    "unquoted_name",
    "valid_options",
    "value_type",
]

_log = logging.getLogger("reflect_otel.attribution.corrections")

_MIN_SCORE = 0.5
_NUMBER_IN = re.compile(r"-?\d+(?:\.\d+)?")
_VALUE_WORDS = 4
_VALUE_CHARS = 80
"""An argument longer than this, or a statement, is rewritten token by token, never replaced whole."""


def listed_options(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every list of values ``text`` offers instead of the one it was given, with the words (or the JSON key) that
    introduce it: ``values of X include: 'a', 'b'``, ``columns are: a, b``, ``must be one of a, b``, ``did you mean
    'a'?``, ``Candidate bindings: "a", "b"``, ``{"valid_values": ["a", "b"]}``."""
    return _tool_text.hints(text)


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w.%$-]+", " ", text.casefold()).split())


def similarity(value: str, option: str) -> float:
    """How likely ``option`` is what ``value`` meant: 1 for the same text up to case and punctuation, 0.95 for the
    same number written with a unit or suffix (5 -> 5 kg, 12 -> 12%), 0.9 for a prefix, 0.8 for a whole word
    contained, 0.7 for an abbreviation (its letters in order, same first letter), else the edit-distance ratio
    scaled down."""
    a, b = _normal(value), _normal(option)
    if not a or not b:
        return 0.0
    if a == b:
        return 1.0
    numbers_a, numbers_b = _NUMBER_IN.findall(a), _NUMBER_IN.findall(b)
    if len(numbers_a) == 1 and numbers_a == numbers_b and (a == numbers_a[0] or b == numbers_b[0]):
        return 0.95
    if b.startswith(a) or a.startswith(b):
        return 0.9 if min(len(a), len(b)) >= 2 or not a.isdigit() else 0.6
    if re.search(rf"(?<!\w){re.escape(a)}(?!\w)", b) or re.search(rf"(?<!\w){re.escape(b)}(?!\w)", a):
        return 0.8
    short, long = sorted((a, b), key=len)
    if len(short) >= 2 and short[0] == long[0] and _subsequence(short, long):
        return 0.7  # an abbreviation: avg -> average
    return difflib.SequenceMatcher(None, a, b).ratio() * 0.75


def _subsequence(short: str, long: str) -> bool:
    letters = iter(long)
    return all(ch in letters for ch in short)


def nearest_option(value: str, options: Iterable[str]) -> tuple[str, float] | None:
    """The option ``value`` most likely meant, with its score, when one scores at least 0.5 and differs from it."""
    best: tuple[str, float] | None = None
    for option in options:
        if option == value:
            return None  # the value is listed: nothing to correct in it
        score = similarity(value, option)
        if score >= _MIN_SCORE and (best is None or score > best[1]):
            best = (option, score)
    return best


def string_arguments(step: Step) -> list[tuple[str, str]]:
    """The step's arguments whose values are non-empty strings, as ``(name, value)``."""
    return [(str(k), v) for k, v in step.tool_args.items() if isinstance(v, str) and v.strip()]


def _is_value(text: str) -> bool:
    """A value (a name, a word or a few), replaced whole; not a statement, whose tokens are rewritten one at a
    time."""
    return len(text) <= _VALUE_CHARS and len(text.split()) <= _VALUE_WORDS and not is_statement(text)


def _same_name(a: str, b: str) -> bool:
    """The same name up to case, quotes and a qualifier (``o.status`` names ``status``)."""
    x, y = a.strip("\"'`[]").casefold(), b.strip("\"'`[]").casefold()
    return x == y or x.rsplit(".", 1)[-1] == y or y.rsplit(".", 1)[-1] == x


def _unqualified(options: Sequence[str], token: Token, qualifier: str | None = None) -> list[str]:
    """``options`` as a token of a statement can take them: a qualified name (``o.status``) unqualified when the
    token is not; when the token is qualified in the statement (``o.custmer``), only the options of that qualifier
    and the unqualified ones (``p.custmer`` is another table's column, not a fix of ``o.custmer``)."""
    if "." in token.value:
        return list(options)
    if qualifier is not None:
        options = [o for o in options if o.count(".") != 1 or o.split(".", 1)[0].strip('"`[]').casefold() == qualifier]
    return list(dict.fromkeys(o.rsplit(".", 1)[-1] if o.count(".") == 1 else o for o in options))


@dataclass(frozen=True, slots=True)
class _Fix:
    """One argument rewritten: its new value, and the token or value replaced (``was``) by what (``now``)."""

    score: float
    argument: str
    value: str
    was: str
    now: str


def _token_fixes(
    name: str, value: str, options: Sequence[str], wanted: Callable[[Token], bool], at: int | None = None
) -> list[_Fix]:
    """A fix per wanted token of the statement ``value`` (only those of the name at offset ``at``, where the error
    marks one), in statement order: each rewrites that token's reference (:func:`.rewrite`), no other."""
    fixes = []
    candidates = [t for t in tokens(value) if t.kind is not TokenKind.NUMBER and wanted(t)]
    marked_name = name_at(value, at) if at is not None else []
    pointed = [t for t in candidates if t in marked_name]
    for token in pointed or candidates:
        nearest = nearest_option(token.value, _unqualified(options, token, qualifier_of(value, token)))
        if nearest is None or _spelt_bare(value, token, nearest[0]):
            continue
        fixes.append(_Fix(nearest[1], name, rewrite(value, token, nearest[0]), token.value, nearest[0]))
    return fixes


def _spelt_bare(value: str, token: Token, option: str) -> bool:
    """Whether the statement writes ``option``, a name with spaces or symbols, unquoted where ``token`` is (``Train``
    of ``SELECT Train No``): rewriting the token alone would leave the name's other words behind as an alias
    (``"Train No" No``); :func:`unquoted_name` quotes the name whole."""
    return any(start <= token.start < end for start, end in bare_spellings(value, option))


def _first_fix(step: Step, rule: str, fixes: Sequence[_Fix], why: Callable[[_Fix], str]) -> list[Correction]:
    """The rule's correction of ``step`` by the first of ``fixes`` (none when there is none), ``why`` saying why."""
    if not fixes:
        return []
    return [rule_correction(step, rule, _replaced(step, fixes[0]), why(fixes[0]))]


def _fixes(step: Step, options: Sequence[str], *, named: Sequence[str] = (), literals: bool = False) -> list[_Fix]:
    """Each string argument rewritten toward ``options``, best first (of equal scores, the first in the statement).
    When the error names what is wrong, an argument that is a name it names is replaced whole, and any other argument
    holding one as a token (``SELECT custmer FROM orders``, however short) has that token rewritten, quoted as
    written: the occurrence the error marks (DuckDB's and PostgreSQL's ``^`` under the echoed line), else each in
    turn. Otherwise a value is replaced whole, and in a statement, with ``literals``, each string literal is
    rewritten. A fix changes one identifier or literal (one reference: :mod:`reflect_otel.attribution._statement`), never more."""
    fixes: list[_Fix] = []
    for name, value in string_arguments(step):
        if named and any(_same_name(value, n) for n in named):
            nearest = nearest_option(value, options)
            if nearest is not None:
                fixes.append(_Fix(nearest[1], name, nearest[0], value, nearest[0]))
        elif named:
            at = next(
                (m for text in _tool_text.messages(step.tool_result) if (m := marked(value, text)) is not None), None
            )
            fixes += _token_fixes(
                name,
                value,
                options,
                lambda t: t.kind is not TokenKind.LITERAL and any(_same_name(t.value, n) for n in named),
                at,
            )
        elif _is_value(value):
            nearest = nearest_option(value, options)
            if nearest is not None:
                fixes.append(_Fix(nearest[1], name, nearest[0], value, nearest[0]))
        elif literals:
            fixes += _token_fixes(name, value, options, lambda t: t.kind is TokenKind.LITERAL)
    return sorted(fixes, key=lambda f: -f.score)


def _replaced(step: Step, fix: _Fix) -> StepAction:
    return StepAction(tool_name=step.tool_name, arguments={**step.tool_args, fix.argument: fix.value})


def _what(fix: _Fix, step: Step) -> str:
    whole = step.tool_args.get(fix.argument) == fix.was
    return f"{fix.argument}={_short(fix.was)}" if whole else f"{_short(fix.was)} in {fix.argument}"


def _from_hints(step: Step, rule: str, *, named: Sequence[str] = ()) -> list[Correction]:
    """The argument a hint in the step's result corrects: the one named in the hint's lead-in (``op must be one
    of``), else the one the error names, else the one nearest to a hinted value."""
    corrections = []
    for lead, options in _tool_text.hints(step.tool_result):
        lead_words = set(_normal(lead).split())
        fixes = _fixes(step, options, named=named, literals=rule == "listed_values")
        led = [f for f in fixes if _normal(f.argument) in lead_words]
        if not (led or fixes):
            continue
        fix = (led or fixes)[0]
        listed = ", ".join(repr(o) for o in options[:6]) + (", ..." if len(options) > 6 else "")
        corrections.append(
            rule_correction(
                step,
                rule,
                _replaced(step, fix),
                f"step {step.index} {'failed' if rule == 'valid_options' else 'returned nothing'} with "
                f"{_what(fix, step)}; its result lists {listed}",
            )
        )
    return corrections


def _shown_texts(trace: StructuredTrace, step: Step, context: str) -> list[str]:
    """What the agent was shown before ``step``: its context and the results of the calls before it."""
    return [context, *(s.tool_result or "" for s in trace.steps[: step.index - 1] if not failed_call(s))]


def listed_values(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """An empty result that lists the values the tool has (a lookup of ``'ny'`` where the field holds ``'NY'``;
    a JSON key such as ``available_values``): the same call with the nearest listed value (in a statement, the
    literal nearest to one rewritten)."""
    return _from_hints(step, "listed_values") if empty_call(step) else []


def valid_options(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """A failed call whose error names the valid columns, fields, options or form (``columns are: a, b``, ``must
    be one of``, ``did you mean``, ``Candidate bindings``, ``HINT: Perhaps you meant``, a JSON key such as
    ``valid_fields``): the same call with the nearest valid one; in a statement, the name the error names rewritten.
    An error that names a wrong name and offers nothing (SQLite's ``no such column: x`` and ``no such table: x``,
    PostgreSQL's ``relation "x" does not exist``, pandas' ``KeyError: 'x'``) is corrected from the names the data
    shown before it has: its tables where the error is about a table, else its fields (a schema, rows)."""
    if not failed_call(step):
        return []
    named = _tool_text.named(step.tool_result)
    found = _from_hints(step, "valid_options", named=named)
    if found or not named:
        return found
    texts = _shown_texts(trace, step, context)
    table = _TABLE_ERROR.search(_first_line(step.tool_result)) is not None
    shown = _tool_text.shown_tables if table else _tool_text.shown_names
    names = list(dict.fromkeys(n for text in texts for n in shown(text)))
    failure, kind = _short(_first_line(step.tool_result)), "table" if table else "field"

    def why(fix: _Fix) -> str:
        return (
            f"step {step.index} failed on {_short(fix.was)} ({failure}); "
            f"the data shown before it has the {kind} {fix.now!r}"
        )

    return _first_fix(step, "valid_options", _fixes(step, names, named=named) if names else [], why)


_TABLE_ERROR = re.compile(
    r"\b(?:no such table|relation \S+ does not exist|table\b[^\n]{0,90}\b(?:does not exist|not found))", re.IGNORECASE
)
"""An error about a table, not a column: SQLite's ``no such table``, PostgreSQL's ``relation "x" does not exist``."""


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0]


def question_value(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """A failed or empty call one of whose values resembles a value the question names that no call used (the
    question says 'San Diego', the call 'San Deigo'): the same call with the question's value (in a statement,
    the literal rewritten)."""
    if not (failed_call(step) or empty_call(step)):
        return []
    used = " ".join(_normal(str(v)) for s in trace.steps for v in s.tool_args.values())
    absent = [c for c in question_constraints(trace.question) if _normal(c) not in used]

    def why(fix: _Fix) -> str:
        return (
            f"the question names {fix.now!r}, which no call used; "
            f"step {step.index} used {_what(fix, step)} and got nothing"
        )

    return _first_fix(step, "question_value", _fixes(step, absent, literals=True) if absent else [], why)


def _shown_values(trace: StructuredTrace, step: Step, context: str) -> dict[str, list[str]]:
    """The values the data shown before ``step`` writes under each field (by its normalized name), in order."""
    shown: dict[str, list[str]] = {}
    for text in _shown_texts(trace, step, context):
        for field_name, field_values in _tool_text.shown_fields(text).items():
            known = shown.setdefault(_normal(field_name), [])
            known += [v for v in field_values if v not in known]
    return shown


def _field_argument(step: Step, fields: Collection[str]) -> tuple[str, str] | None:
    """``(argument, field)`` for the one argument whose value names one of ``fields`` (normalized names), as a
    tool that takes a column and a value as two arguments has; None when no argument or several do."""
    naming = [(name, _normal(value)) for name, value in string_arguments(step) if _normal(value) in fields]
    return naming[0] if len(naming) == 1 else None


def shown_value(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """An empty call that compares a field with a value the data shown before it (its context, earlier results:
    JSON rows, a schema's sample rows, Markdown tables) writes differently under that field: ``"status" = 'done'``
    where the rows shown write ``'Done'``, or an argument named like the field (``city="LA"``). The same call with
    the value as the data writes it (in a statement, that literal rewritten). A tool that takes the field and the
    value as two arguments (``filter(column="city", value="boston")``) compares the value with the field the other
    argument names."""
    if not empty_call(step):
        return []
    shown = _shown_values(trace, step, context)
    if not shown:
        return []
    fixes: list[_Fix] = []
    field_argument = _field_argument(step, shown)
    for name, value in string_arguments(step):
        if _is_value(value):
            if _normal(name) in shown:
                field = _normal(name)
            elif field_argument is not None and name != field_argument[0]:
                field = field_argument[1]
            else:
                continue
            nearest = nearest_option(value, shown[field])
            if nearest is not None:
                fixes.append(_Fix(nearest[1], name, nearest[0], value, nearest[0]))
            continue
        for column, literal in comparisons(value):
            values = shown.get(_normal(column.value), [])
            if "%" in literal.value or literal.value in values:
                continue  # a pattern is not a value; a value the data has is not the mistake
            nearest = nearest_option(literal.value, values)
            if nearest is not None:
                fixes.append(_Fix(nearest[1], name, rewrite(value, literal, nearest[0]), literal.value, nearest[0]))
    if not fixes:
        return []
    fix = max(fixes, key=lambda f: f.score)
    return [
        rule_correction(
            step,
            "shown_value",
            _replaced(step, fix),
            f"step {step.index} looked for {_what(fix, step)} and got nothing; the data shown before it writes "
            f"{fix.now!r}",
        )
    ]


_NEAR = re.compile(r'\bnear "((?:[^"]|"")*)"')
"""Where a syntax error stopped: DuckDB's and PostgreSQL's ``at or near "No"``, SQLite's ``near "No"``."""


def _known_names(trace: StructuredTrace, step: Step, context: str) -> tuple[list[str], set[str]]:
    """The field names known at ``step``: those the data shown before it has (a schema, rows), then the candidates
    its own error lists; and which of them the error lists."""
    shown = [n for text in _shown_texts(trace, step, context) for n in _tool_text.shown_names(text)]
    offered = {o for _, options in _tool_text.hints(step.tool_result) for o in options}
    return list(dict.fromkeys([*shown, *sorted(offered)])), offered


def _pointed(value: str, step: Step) -> tuple[int | None, list[str]]:
    """Where the error of ``step`` points in the statement ``value``: the offset its marker shows, and the words it
    names (``near "No"``, ``no such column: Train``)."""
    texts = _tool_text.messages(step.tool_result)
    at = next((m for text in texts if (m := marked(value, text)) is not None), None)
    words = [m.group(1).replace('""', '"') for text in texts for m in _NEAR.finditer(text)]
    return at, [w for w in [*words, *_tool_text.named(step.tool_result)] if w.strip()]


def _fits(value: str, start: int, end: int, at: int | None, words: Sequence[str]) -> bool:
    """Whether the error points at the place ``value[start:end]``: its marker inside it or right after it (a parser
    stops at the word after the name, ``pos. =``), else a word it names inside it or right after it."""
    if at is not None:
        return start <= at < end or (at >= end and not value[end:at].strip())
    inside = {w.casefold() for w in re.findall(r"\w+", value[start:end])}
    after = value[end:].lstrip().casefold()
    return any(w.casefold() in inside or after.startswith(w.casefold()) for w in words)


def _spaced_name(value: str, step: Step, names: Sequence[str]) -> tuple[str, list[tuple[int, int]]] | None:
    """The name with spaces or symbols that the statement ``value`` writes bare where the error of ``step`` points,
    and the places it writes it; with an error that points nowhere, the one such name it writes bare."""
    places = sorted((start, -end, name) for name in names for start, end in bare_spellings(value, name))
    if not places:
        return None
    at, words = _pointed(value, step)
    if at is None and not words:
        chosen = places[0][2] if len({name for _, _, name in places}) == 1 else ""
    else:
        chosen = next((name for start, end, name in places if _fits(value, start, -end, at, words)), "")
    return (chosen, bare_spellings(value, chosen)) if chosen else None


def _folded_name(value: str, step: Step, names: Sequence[str]) -> tuple[str, list[tuple[int, int]]] | None:
    """A name in capitals that the statement ``value`` writes bare and the error names folded to lower case
    (PostgreSQL's ``column "attendance" does not exist`` where the data has ``Attendance``), and its bare places."""
    for wrong in _tool_text.named(step.tool_result):
        word = wrong.rsplit(".", 1)[-1]
        if word != word.casefold():
            continue
        unqualified = (n.rsplit(".", 1)[-1] if n.count(".") == 1 and not n.endswith(".") else n for n in names)
        name = next((n for n in unqualified if n != word and n.casefold() == word), None)
        spans = [(t.start, t.end) for t in tokens(value) if t.kind is TokenKind.WORD and t.value.casefold() == word]
        if name is not None and spans:
            return name, spans
    return None


def unquoted_name(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """A failed statement that writes a field name with spaces or symbols unquoted (``SELECT Train No FROM t``,
    ``WHERE Length (miles) > 30``, ``pos. = 'FW'``), where the error points into that name or right after it (the
    marker DuckDB and PostgreSQL put under the statement, ``at or near "No"``, SQLite's ``near "No"`` or ``no such
    column: Train``) and the data shown before it (a schema, rows) or the error's own candidates have a field of that
    name: the same call with the name quoted whole (``"Train No"``; the name as the data writes it, ``"Train No:"``
    where the agent left out the colon), at each place the statement writes it bare, never one word quoted and the
    next left as an alias. A statement that is not SQL (a pandas ``query``) is quoted with backticks. When the error
    points nowhere (Python's ``SyntaxError`` under a reformatted line), only a statement that writes one such name
    bare is corrected. Likewise a name in capitals written bare that the engine folded to lower case (PostgreSQL's
    ``column "attendance" does not exist`` where the data has ``Attendance``)."""
    if not failed_call(step):
        return []
    known, offered = _known_names(trace, step, context)
    if not known:
        return []
    spaced = [n for n in known if needs_quotes(n)]
    for argument, value in string_arguments(step):
        if not is_statement(value):
            continue
        found = _spaced_name(value, step, spaced) or _folded_name(value, step, known)
        if found is None:
            continue
        chosen, spans = found
        quoted = quote_name(chosen, identifier_quote(value))
        fixed = _spliced(value, [(start, end, quoted) for start, end in spans])
        written = value[spans[0][0] : spans[0][1]]
        where = "its error lists" if chosen in offered else "the data shown before it has"
        return [
            rule_correction(
                step,
                "unquoted_name",
                StepAction(tool_name=step.tool_name, arguments={**step.tool_args, argument: fixed}),
                f"step {step.index} failed ({_short(_first_line(step.tool_result))}) where {argument} writes "
                f"{written!r} unquoted; {where} the field {chosen!r}: quoted whole as {quoted}",
            )
        ]
    return []


_EQUALITY = re.compile(r"\s*(?:=|==|!=|<>|(?:not\s+)?in\s*\(|is(?:\s+not)?)\s*", re.IGNORECASE)
_ORDERING = re.compile(r"\s*(?:<|>|<=|>=)\s*")
_NUMERIC_TEXT = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")
_OPERATOR_VALUES = frozenset({"=", "==", "!=", "<>", "eq", "ne", "equals", "in", "not in", "is", "is not"})
_ORDERING_VALUES = frozenset({"<", ">", "<=", ">=", "lt", "gt", "le", "ge", "lte", "gte"})


def _as_number(text: str) -> str | None:
    """``text`` as a number literal when it reads as one (``'1,000'`` -> ``1000``: thousands separators dropped)."""
    stripped = text.strip()
    return stripped.replace(",", "") if _NUMERIC_TEXT.fullmatch(stripped) else None


@dataclass(frozen=True, slots=True)
class _Shown:
    """What the data shown before a step says of each field (by normalized name): its kinds and its values."""

    kinds: dict[str, set[_tool_text.Kind]]
    values: dict[str, list[str]]

    def kind(self, field: str) -> _tool_text.Kind | None:
        kinds = self.kinds.get(_normal(field), set())
        return next(iter(kinds)) if len(kinds) == 1 else None

    def numbers(self, field: str) -> set[str]:
        """The field's values shown that read as numbers, as number literals."""
        return {n for v in self.values.get(_normal(field), []) if (n := _as_number(v)) is not None}


def _shown(trace: StructuredTrace, step: Step, context: str) -> _Shown:
    kinds: dict[str, set[_tool_text.Kind]] = {}
    for text in _shown_texts(trace, step, context):
        for name, found in _tool_text.shown_kinds(text).items():
            kinds.setdefault(_normal(name), set()).update(found)
    return _Shown(kinds, _shown_values(trace, step, context))


@dataclass(frozen=True, slots=True)
class _Retyped:
    """One comparison's value rewritten as its field holds it: the new argument value, what was written, what now."""

    argument: str
    value: object
    was: str
    now: str
    field: str
    kind: _tool_text.Kind


def _clash_kind(
    clash: _tool_text.TypeClash, field: Token, operands: Sequence[Token], start: int, at: int | None
) -> _tool_text.Kind | None:
    """What the error says ``field`` holds, when it is about this comparison: it names the field, or the value
    compared, or its marker falls in the comparison; None otherwise."""
    if clash.column is not None:
        return clash.field_kind if _same_name(clash.column, field.value) else None
    if clash.value is not None:
        return clash.field_kind if any(o.value == clash.value for o in operands) else None
    if at is not None:
        return clash.field_kind if start <= at <= operands[-1].end else None
    return None


def _statement_retypes(
    argument: str, value: str, clash: _tool_text.TypeClash | None, at: int | None, shown: _Shown
) -> list[_Retyped]:
    """Each comparison of the statement ``value`` whose operands are of the other kind than its field holds, rewritten
    (see :func:`value_type`); with an error, only the comparisons it is about."""
    grouped: dict[int, tuple[Token, list[Token]]] = {}
    for field, operand in comparisons(value, numbers=True):
        grouped.setdefault(field.start, (field, []))[1].append(operand)
    found = []
    for field, operands in grouped.values():
        start = qualified_start(value, field)
        kind = _clash_kind(clash, field, operands, start, at) if clash is not None else shown.kind(field.value)
        kinds = {o.kind for o in operands}
        operator = value[field.end : operands[0].start]
        if kind == "text" and kinds == {TokenKind.NUMBER}:
            if _EQUALITY.fullmatch(operator):
                if clash is None and not shown.numbers(field.value) & {o.value for o in operands}:
                    continue  # nothing shown says the field writes this number as text
                parts = [(o.start, o.end, "'" + o.value + "'") for o in operands]
                now = ", ".join(f"'{o.value}'" for o in operands)
            elif (
                _ORDERING.fullmatch(operator)
                and shown.values.get(_normal(field.value))
                and all(_as_number(v) is not None for v in shown.values[_normal(field.value)])
            ):
                parts = [(start, field.end, f"CAST({value[start : field.end]} AS NUMERIC)")]
                now = parts[0][2]
            else:
                continue
        elif kind == "number" and kinds == {TokenKind.LITERAL}:
            numbers = [_as_number(o.value) for o in operands]
            if any(n is None for n in numbers):
                continue  # 'abc' is no number however it is quoted
            if clash is None and not shown.numbers(field.value) & {n for n in numbers if n}:
                continue
            parts = [(o.start, o.end, n) for o, n in zip(operands, numbers, strict=True) if n is not None]
            now = ", ".join(n for n in numbers if n)
        else:
            continue
        was = value[min(p[0] for p in parts) : max(p[1] for p in parts)]
        found.append(_Retyped(argument, _spliced(value, parts), was, now, field.value, kind))
    return found


def _spliced(text: str, parts: Sequence[tuple[int, int, str]]) -> str:
    out, last = [], 0
    for start, end, new in sorted(parts):
        out += [text[last:start], new]
        last = end
    return "".join(out) + text[last:]


def _argument_retypes(step: Step, clash: _tool_text.TypeClash | None, shown: _Shown) -> list[_Retyped]:
    """The value argument of a tool that takes the field as another argument (``filter(column="amount", op=">",
    value="5")``), or an argument named like the field (``find(year="1985")``), given as the kind the field holds:
    ``"5"`` -> ``5`` for a number field, ``1`` -> ``"1"`` for a text field compared for (in)equality."""
    fields = set(shown.kinds) | set(shown.values) | ({_normal(clash.column)} if clash and clash.column else set())
    named = _field_argument(step, fields)
    ordering = any(isinstance(v, str) and v.strip().casefold() in _ORDERING_VALUES for v in step.tool_args.values())
    found = []
    for name, given in step.tool_args.items():
        if isinstance(given, bool) or not isinstance(given, str | int | float):
            continue
        if isinstance(given, str) and given.strip().casefold() in _OPERATOR_VALUES | _ORDERING_VALUES:
            continue
        field = _normal(str(name)) if _normal(str(name)) in fields else named[1] if named and named[0] != name else None
        if field is None:
            continue
        kind = clash.field_kind if clash is not None else shown.kind(field)
        if kind == "number" and isinstance(given, str) and (number := _as_number(given)) is not None:
            if clash is None and number not in shown.numbers(field):
                continue
            now: object = float(number) if "." in number else int(number)
        elif kind == "text" and not isinstance(given, str) and not ordering:
            now = str(given)
            if clash is None and now not in shown.values.get(field, []):
                continue
        else:
            continue
        found.append(_Retyped(str(name), now, f"{name}={json.dumps(given)}", json.dumps(now), field, kind))
    return found


def value_type(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """A call that compared a field with a value of the other type and failed or found nothing. Text compared with a
    number: DuckDB's ``Could not convert string 'Replay' to INT32 when casting from source column Tie no`` and
    ``Cannot compare values of type VARCHAR and type INTEGER_LITERAL``, PostgreSQL's ``operator does not exist: text
    = integer``, pandas' ``Invalid comparison between dtype=str and int``, or nothing found (SQLite, pandas ``==``)
    where the data shown writes that number as text under the field. A number compared with text: ``Could not
    convert string '1,000' to INT32``, ``invalid input syntax for type integer: "1,000"``, ``Invalid comparison
    between dtype=int64 and str``, or nothing found where the data shown holds that number as a number. The same call
    with the value as the field holds it: the number quoted (``= '1'``; only for (in)equality, where a text
    comparison means the same), the literal unquoted (``> 1000``, thousands separators dropped; text that is no number
    is left alone), or, for a text field ordered against a number whose shown values all read as numbers, the field
    cast (``CAST(x AS NUMERIC) > 5``). What the field holds comes from the error, else from the data shown before the
    call (a schema's column types, the JSON types of rows' cells); an error that is not about types corrects
    nothing."""
    failed = failed_call(step)
    if not (failed or empty_call(step)):
        return []
    clash = _tool_text.type_clash(step.tool_result) if failed else None
    if failed and clash is None:
        return []
    shown = _shown(trace, step, context)
    retypes: list[_Retyped] = []
    for argument, value in string_arguments(step):
        if is_statement(value):
            at = next((m for t in _tool_text.messages(step.tool_result) if (m := marked(value, t)) is not None), None)
            retypes += _statement_retypes(argument, value, clash, at, shown)
    if not retypes:
        retypes = _argument_retypes(step, clash, shown)
    if len(retypes) != 1:
        return []  # none, or several the error does not tell apart
    (fix,) = retypes
    why = (
        f"failed ({_short(_first_line(step.tool_result))}): its error says {fix.field!r} holds "
        + ("text" if fix.kind == "text" else "numbers")
        if failed
        else f"got nothing; the data shown before it writes that value under {fix.field!r} as "
        + ("text" if fix.kind == "text" else "a number")
    )
    return [
        rule_correction(
            step,
            "value_type",
            StepAction(tool_name=step.tool_name, arguments={**step.tool_args, fix.argument: fix.value}),
            f"step {step.index} compared {fix.field!r} with {fix.was} and {why}; written {fix.now} instead",
        )
    ]


_OUT_OF_RANGE = re.compile(
    r"out of range|out of bounds|out-of-bounds|fewer than \d+ (?:rows?|items?|records?|entries)|"
    r"index \d+ (?:is )?(?:past|beyond)|beyond the (?:last|end)",
    re.IGNORECASE,
)
_INDEX_ARGUMENT = re.compile(
    r"(?:row|item|record|entry|element|line|position|pos|index|idx|offset|nth|i|n|k|iloc|loc)"
    r"(?:_?(?:index|idx|number|num|no|position|pos|offset))?",
    re.IGNORECASE,
)
_TABLE_ARGUMENT = re.compile(r"(?:table|df|dataframe|frame|sheet|relation|dataset)(?:_?name)?", re.IGNORECASE)
_FROM_ONE = re.compile(r"(?:1|one)[- ](?:based|indexed)|start(?:s|ing)? (?:at|from) 1\b", re.IGNORECASE)
_FROM_ZERO = re.compile(r"(?:0|zero)[- ](?:based|indexed)|start(?:s|ing)? (?:at|from) 0\b", re.IGNORECASE)
_NOT_ONE_TABLE = frozenset(
    {"where", "join", "group", "having", "distinct", "union", "intersect", "except", "qualify", "using", "sample"}
)


def _counts_from_one(trace: StructuredTrace, step: Step, index: int) -> bool:
    """Whether the tool counts rows from 1: its recorded definition says so (``(1-based)``), or its error asks for
    as many rows as the index (``t0 has fewer than 26 rows`` for row 26); else from 0, as Python and SQL offsets do."""
    definition = next((t for t in trace.tools if t.name == step.tool_name), None)
    said = f"{definition.description} {json.dumps(definition.parameters)}" if definition is not None else ""
    if _FROM_ONE.search(said):
        return True
    if _FROM_ZERO.search(said):
        return False
    return re.search(rf"\bfewer than {index} (?:rows?|items?|records?|entries)\b", step.tool_result or "") is not None


def _row_count(trace: StructuredTrace, step: Step, context: str, tables: Collection[str]) -> tuple[int, str] | None:
    """How many rows the call's table has, and where that is said: the error's own size; else the latest earlier
    result that gives the count of a table the call names; for a call that names none, the one count every earlier
    result that gives one agrees on. None when nothing says, or the results disagree."""
    size = _tool_text.stated_size(step.tool_result)
    if size is not None:
        return size, "its error"
    earlier = [(s.index, s.tool_result or "") for s in trace.steps[: step.index - 1] if not failed_call(s)]
    counts: list[tuple[str | None, int, int]] = []  # (table, count, step index; 0 for the context)
    for where, text in [(0, context), *earlier]:
        counts += [(table, count, where) for table, count in _tool_text.row_counts(text)]
    if tables:
        named = [(c, w) for t, c, w in counts if t is not None and _normal(t) in tables]
        if not named:
            return None
        count, where = named[-1]
    else:
        if len({c for _, c, _ in counts}) != 1:
            return None
        count, where = counts[-1][1], counts[-1][2]
    return count, f"step {where}'s result" if where else "the agent's context"


def _one_table_offset(value: str) -> tuple[str, Token] | None:
    """The table and the ``OFFSET`` number of a statement that reads one table's rows unfiltered (``SELECT * FROM t
    ORDER BY x LIMIT 1 OFFSET 26``): there its offset counts the table's rows. None for any other statement."""
    if not is_sql(value):
        return None
    found = tokens(value)
    words = [t.value.casefold() for t in found if t.kind is TokenKind.WORD]
    if words.count("from") != 1 or words.count("select") != 1 or _NOT_ONE_TABLE & set(words):
        return None
    at = next(i for i, t in enumerate(found) if t.kind is TokenKind.WORD and t.value.casefold() == "from")
    offset = next((i for i, t in enumerate(found) if t.kind is TokenKind.WORD and t.value.casefold() == "offset"), None)
    if at + 1 >= len(found) or offset is None or offset + 1 >= len(found) or "," in value[found[at].end :]:
        return None
    table, number = found[at + 1], found[offset + 1]
    if table.kind not in (TokenKind.WORD, TokenKind.QUOTED) or number.kind is not TokenKind.NUMBER:
        return None
    return table.value, number


@dataclass(frozen=True, slots=True)
class _Index:
    """An index argument of a call: its name, the row it asked for, and its value with another row in its place."""

    argument: str
    index: int
    written: Callable[[int], object]
    label: str


def _index_arguments(step: Step) -> list[_Index]:
    """The arguments that ask for a row by its position (``row``, ``index``, ``position``, ...; an integer or a
    string of digits), those whose number the error repeats first when it repeats one."""
    found = []
    for name, given in step.tool_args.items():
        if not _INDEX_ARGUMENT.fullmatch(str(name)):
            continue
        if type(given) is int:
            found.append(_Index(str(name), given, int, f"{name}={given}"))
        elif isinstance(given, str) and given.strip().isdigit():
            found.append(_Index(str(name), int(given), str, f"{name}={given!r}"))
    repeated = [i for i in found if re.search(rf"(?<![\d.]){i.index}(?!\d)", step.tool_result or "")]
    return repeated or found


def _with_offset(value: str, token: Token, row: int) -> str:
    return value[: token.start] + str(row) + value[token.end :]


def last_row(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """A call that asked for a row past the last one, where the error or an earlier result says how many rows there
    are: an error that says the index is out of range (``t0 has fewer than 26 rows``, pandas' ``single positional
    indexer is out-of-bounds``, ``{"error": "index 26 out of range (10 items)"}``) with an index argument past the
    rows (``row``, ``index``, ``position``, ...), or a statement that reads one table unfiltered and found nothing at
    an ``OFFSET`` past its rows. The count comes from the error (``with size 10``, ``(10 items)``), else from the
    latest earlier result about the table the call names (``t0: 10 rows``, a schema's ``row_count``, a DataFrame's
    ``shape``), else from the one count the earlier results agree on. The same call with the last row (the count,
    less one where the tool counts from 0): a guess, which the finding says and the replay tests."""
    failed = failed_call(step)
    if (failed and not _OUT_OF_RANGE.search(step.tool_result or "")) or not (failed or empty_call(step)):
        return []
    tables = {_normal(v): v for k, v in string_arguments(step) if _TABLE_ARGUMENT.fullmatch(k)}
    if failed:
        candidates = _index_arguments(step)
    else:
        candidates = []
        for name, value in string_arguments(step):
            found = _one_table_offset(value)
            if found is not None:
                tables = {_normal(found[0]): found[0]}
                offset = int(found[1].value)
                written = partial(_with_offset, value, found[1])
                candidates.append(_Index(name, offset, written, f"OFFSET {offset} in {name}"))
    count = _row_count(trace, step, context, tables) if candidates else None
    if count is None or count[0] < 1:
        return []
    rows, where = count
    fixes = []
    for candidate in candidates:
        base = 1 if failed and _counts_from_one(trace, step, candidate.index) else 0
        if candidate.index > rows - 1 + base:
            fixes.append((candidate, rows - 1 + base, base))
    if len(fixes) != 1:
        return []  # no index past the rows, or several
    candidate, last, base = fixes[0]
    table = next(iter(tables.values())) if len(tables) == 1 else "the data"
    outcome = f"failed ({_short(_first_line(step.tool_result))})" if failed else "got nothing"
    return [
        rule_correction(
            step,
            "last_row",
            StepAction(
                tool_name=step.tool_name, arguments={**step.tool_args, candidate.argument: candidate.written(last)}
            ),
            f"step {step.index} asked for {candidate.label} and {outcome}; {where} says {table} has {rows} rows, so "
            f"{last} is its last row, counted from {base}: a guess the replay tests",
        )
    ]


RULES: tuple[Rule, ...] = (
    listed_values,
    valid_options,
    unquoted_name,
    value_type,
    last_row,
    question_value,
    shown_value,
)
"""The built-in rules. Beside them run the rules installed by third parties (entry-point group
``reflect_otel.correction_rules``) and the agent's own (``evidence_corrections(agent_rules=...)``; an agent's replay
adapter carries them, see :class:`reflect_otel.replay.HasCorrectionRules`)."""


def _installed() -> list[tuple[str, Rule]]:
    """``(entry-point name, rule)`` for every rule installed in ``reflect_otel.correction_rules``, by name; one that
    cannot be loaded, or is not callable, is logged with its name and skipped."""
    found = []
    for name in plugins.names(plugins.CORRECTION_RULES):
        try:
            rule = plugins.load(plugins.CORRECTION_RULES, name)
        except Exception:
            _log.warning("correction rule %r (entry point) could not be loaded; skipped", name, exc_info=True)
            continue
        if not callable(rule):
            _log.warning("correction rule %r (entry point) is not callable; skipped", name)
            continue
        found.append((f"{name} (entry point)", rule))
    return found


def rules() -> tuple[Rule, ...]:
    """The built-in rules, then every rule installed in the entry-point group ``reflect_otel.correction_rules``
    (by name; one that cannot be loaded is skipped)."""
    return RULES + tuple(rule for _, rule in _installed())


def _rule_name(rule: Rule) -> str:
    return f"{getattr(rule, '__module__', '?')}.{getattr(rule, '__qualname__', type(rule).__name__)}"


def _guarded(name: str, rule: Rule, trace: StructuredTrace, step: Step, context: str) -> list[Correction] | None:
    """``rule``'s corrections of ``step``; None, logged with the rule's name, when it raises or returns anything but
    a list of :class:`Correction`: one broken plugin must not sink the attribution."""
    try:
        found = rule(trace, step, context)
    except Exception:
        _log.warning("correction rule %s failed on step %d; skipped", name, step.index, exc_info=True)
        return None
    if not isinstance(found, list) or not all(isinstance(c, Correction) for c in found):
        _log.warning("correction rule %s returned %s, not a list of Correction; skipped", name, _short(found))
        return None
    return found


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def rule_correction(step: Step, rule: str, replacement: StepAction, finding: str) -> Correction:
    """A rule's correction of ``step`` (source ``evidence:<rule>``), for plugin rules too."""
    return Correction(
        source=f"evidence:{rule}",
        kind=InterventionKind.ACTION,
        step_index=step.index,
        original=StepAction.of_step(step),
        replacement=replacement,
        finding=finding,
    )


def evidence_corrections(
    trace: StructuredTrace, *, near: int | None = None, context: str = "", agent_rules: Sequence[Rule] = ()
) -> list[Correction]:
    """Every rule's corrections over the trace's tool calls, deduplicated; those of step ``near`` first, then by
    distance from it (the localized step is the likeliest to matter), else in step order. ``context`` is what the
    agent was given besides its question. The built-in rules run, then the installed ones, then ``agent_rules``
    (rules that fit this agent's tools, given by whoever runs it); an installed or agent rule that raises or returns
    anything but a list of corrections is logged by name and not run again on this trace, and the others go on."""
    steps = sorted(trace.steps, key=lambda s: (abs(s.index - near), s.index) if near is not None else (s.index, 0))
    extra = [*_installed(), *((_rule_name(rule), rule) for rule in agent_rules)]
    return _corrections(trace, steps, RULES, extra, context)


def agent_corrections(trace: StructuredTrace, rules: Sequence[Rule], *, context: str = "") -> list[Correction]:
    """Only ``rules``' corrections over the trace's tool calls, in step order, deduplicated, each rule guarded as
    :func:`evidence_corrections` guards an agent's rules. What an agent that serves its replays over HTTP answers
    when asked for its own rules' corrections (``reflect_otel.replay_adapters.http``): the rules run where they
    live, beside the agent, and the collector runs the built-in ones itself."""
    return _corrections(trace, trace.steps, (), [(_rule_name(rule), rule) for rule in rules], context)


def _corrections(
    trace: StructuredTrace,
    steps: Sequence[Step],
    built_in: Sequence[Rule],
    extra: Sequence[tuple[str, Rule]],
    context: str,
) -> list[Correction]:
    found: dict[tuple[object, ...], Correction] = {}
    broken: set[int] = set()
    for step in steps:
        if step.kind is not StepKind.TOOL_CALL or not step.tool_name:
            continue
        for rule in built_in:
            for correction in rule(trace, step, context):
                found.setdefault(correction.key, correction)
        for number, (name, rule) in enumerate(extra):
            if number in broken:
                continue
            corrections = _guarded(name, rule, trace, step, context)
            if corrections is None:
                broken.add(number)
            for correction in corrections or ():
                found.setdefault(correction.key, correction)
    return list(found.values())


def _final_answer_tools(trace: StructuredTrace) -> set[str]:
    """The tools the run and its agents answered with: the tools of its final step and of the calls by which an
    agent handed back its answer (a message; how each ended says which tool is final, not its name)."""
    return {
        s.tool_name.casefold() for s in trace.steps if s.tool_name and (s.is_final_answer or s.kind is StepKind.MESSAGE)
    }


def refusal(
    correction: Correction, trace: StructuredTrace, expected: str | None, *, pure: Collection[str] = ()
) -> str | None:
    """Why ``correction`` must not be tried, or None. Refused: an action that is an answer (a call of a tool the run
    or one of its agents answered with), a call of a tool the agent's recorded definitions do not have, one that
    introduces the expected answer into the step (what it changes, not what it keeps of the agent's own step:
    :func:`reflect_otel.attribution.leaks.action_leak`), a thought that is no step of the agent's (:func:`not_a_step`), one
    that repeats the original step (its words, but for a step label, spacing and quotation marks) or repeats it with
    commentary added, and one that repeats a call of a ``pure`` tool (:class:`~reflect_otel.replay.HasPureTools`)
    that the prefix made and got a result from (:func:`repeated_call`). A thought that changes the step's content in
    any other way (a deletion, another step's words) is a change, however poor a repair: the control decides
    whether its flip proves anything. The agent's own proposals are screened by the same rules before the gate."""
    replacement = correction.replacement
    if correction.kind is not InterventionKind.ACTION or replacement is None:
        return None
    if not 1 <= correction.step_index <= len(trace.steps):
        return f"step {correction.step_index} is not a step of the run"
    step = trace.steps[correction.step_index - 1]
    if replacement.tool_name is not None and replacement.tool_name.casefold() in _final_answer_tools(trace):
        return "the replacement is a final answer: it would flip the run from any step"
    recorded = {t.name for t in trace.tools if t.recorded}
    if replacement.tool_name is not None and recorded and replacement.tool_name not in recorded:
        return f"the replacement calls {replacement.tool_name!r}, which is not one of the agent's tools"
    leaked = action_leak(StepAction.of_step(step), replacement, expected, trace.question)
    if leaked is not None:
        return f"the replacement: {leaked}"
    if replacement.tool_name is None and not_a_step(replacement.text):
        return (
            "the replacement is no step of the agent's (commentary on the run, advice about the agent or the prompt's "
            "request copied back): the hard gate could not judge it as a step"
        )
    if replacement.same_as(StepAction.of_step(step)) or _same_words(replacement, step):
        return "the replacement repeats the original step"
    if _commentary_added(replacement, step):
        return "the replacement is the original step with commentary on the run added: it corrects nothing in it"
    earlier = repeated_call(replacement, trace, correction.step_index, pure)
    if earlier is not None:
        return (
            f"the replacement repeats an earlier call of a pure tool (step {earlier.index}'s), whose result the agent "
            "already has: it would add only a turn, no correction"
        )
    return None


_ADVICE = re.compile(r"\bthe agent (?:should|must|needs? to|ought to|has to)\b", re.IGNORECASE)
_COMMENTARY = re.compile(
    r"\bthe (?:erroneous|wrong|incorrect|faulty|mistaken) step\b"
    r"|\bthe (?:correct|corrected|right) (?:thought|step|sequence|reasoning) (?:would|should|is|was)\b"
    # the run told in the third person ("The agent incorrectly assumed ...", "The agent's reasoning was ..."), not
    # a sentence about an agent in the data ("The agent earns a 3% commission")
    r"|^\W*the agent's\s+(?:\w+\s+){0,2}?(?:reasoning|step|thought|answer|mistake|error|approach|logic)\b"
    r"|^\W*the agent\s+(?:\w+ly\s+)?(?:incorrectly|wrongly|mistakenly|failed|chose|assumed|made|did|has|had"
    r"|produced|computed|calculated|missed|forgot|ignored|misread|misinterpreted|miscounted|overlooked)\b"
    r"|^\W*the model(?:'s)? (?:incorrectly|wrongly|mistakenly)\b",
    re.IGNORECASE,
)
_VERDICT = re.compile(
    r"^\W*(?:in\s+)?step\s+\d+\b[^.\n]{0,80}?\b(?:was|is)\s+(?:incorrect|wrong|erroneous|flawed)\b", re.IGNORECASE
)
"""A verdict on a step, read before its label is taken off: "Step 7 (final_answer) was incorrect because ..."."""


def not_a_step(thought: str) -> bool:
    """A rewritten thought that is no step of the agent's: the prompt's own request copied back ("Step 2 as it
    should have been, with concrete values taken from the data above"), advice about the agent ("The agent should
    have ..."), or commentary on the run ("The erroneous step was ...", "The correct sequence should be ...", a text
    that tells the run in the third person, "The agent incorrectly assumed ...", "The agent's reasoning was ...", or
    a verdict such as "Step 7 (final_answer) was incorrect because ..."). A thought in the agent's own voice that
    names an error ("The error is that the column has a space, so quote it") is a step."""
    if _VERDICT.search(thought):
        return True
    thought = without_step_label(thought)
    lowered = " ".join(thought.lower().split())
    return CORRECTED_STEP_ASK in lowered or bool(_ADVICE.search(thought) or _COMMENTARY.search(thought))


_QUOTES = str.maketrans("", "", "\"'`\u2018\u2019\u201c\u201d")


def _words(text: str) -> str:
    """A thought's words, without the step label a model may have copied from the prompt's layout, and without
    quotation marks (an auditor may rewrite 'So, we need "]" and ">"' as 'So, we need ] and >')."""
    return " ".join(without_step_label(text).translate(_QUOTES).split())


def _commentary_added(replacement: StepAction, step: Step) -> bool:
    """The step's own thought with commentary on the run after it (the original step, then "The agent has
    produced an incorrect result.")."""
    if replacement.tool_name is not None or step.tool_name:
        return False
    given, original = _words(replacement.text), _words(step.reasoning)
    return (
        bool(original)
        and len(given) > len(original)
        and given.startswith(original)
        and not_a_step(given[len(original) :])
    )


def _same_words(replacement: StepAction, step: Step) -> bool:
    """A thought that is the step's own, but for line breaks, spacing, quotation marks and a step label."""
    return replacement.tool_name is None and not step.tool_name and _words(replacement.text) == _words(step.reasoning)


def repeated_call(action: StepAction, trace: StructuredTrace, index: int, pure: Collection[str]) -> Step | None:
    """The step before ``index``, of the same agent, that made ``action``'s call of a ``pure`` tool and got a result,
    or None. Such a call in place of step ``index`` gives the agent what it has: a flip would credit the step with
    what any extra turn does. A failed call may be retried (its failure can be transient), and a tool not declared
    pure may answer again differently."""
    if action.tool_name is None or action.tool_name not in pure or not 1 <= index <= len(trace.steps) + 1:
        return None
    agent = trace.steps[index - 1].agent if index <= len(trace.steps) else None
    return next(
        (
            s
            for s in trace.steps[: index - 1]
            if s.tool_name and s.agent == agent and not failed_call(s) and action.same_as(StepAction.of_step(s))
        ),
        None,
    )


def ordered(
    corrections: Sequence[Correction],
    trace: StructuredTrace,
    expected: str | None,
    limit: int,
    *,
    pure: Collection[str] = (),
) -> list[Correction]:
    """``corrections`` deduplicated (first kept), each refused one with its reason, and at most ``limit`` actions
    left to try; refused ones stay in the list (the record shows them) but count for nothing."""
    seen: set[tuple[object, ...]] = set()
    out: list[Correction] = []
    tried = 0
    for correction in corrections:
        if correction.key in seen:
            continue
        seen.add(correction.key)
        reason = refusal(correction, trace, expected, pure=pure)
        if reason is not None:
            out.append(correction.model_copy(update={"refused": reason}))
            continue
        if correction.kind is InterventionKind.ACTION:
            if tried >= limit:
                continue
            tried += 1
        out.append(correction)
    return out
