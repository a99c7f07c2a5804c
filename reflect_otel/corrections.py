"""Concrete corrections read from the trace itself (no LLM), and the rules that refuse a correction that would
prove nothing.

A failed or empty tool call often says what the right call is: a filter that matched nothing lists the values the
column has; an error names the valid columns, options or form; the question names a value no call used; the data
the agent was shown holds the value under another field. Each rule turns such a finding into a replacement call
of the same tool with one or two arguments changed, and says what it came from. The rules read text as any tool
writes it (quoted lists, ``are:``, ``one of``, ``did you mean``, pipe-separated tables under a header); none
knows a dataset or a framework. What they cannot see: a right value the data does not show, a fix that needs
another tool, or several arguments wrong at once.

A replacement that is the final answer, or whose arguments carry the expected answer (:mod:`reflect_otel.leaks`), is
refused: it would flip a replay from any step and prove nothing about the step (see :func:`refusal`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from reflect_otel.evidence import empty_call, failed_call, question_constraints
from reflect_otel.leaks import leak
from reflect_otel.record import Correction, InterventionKind
from reflect_otel.trace import FINAL_ANSWER_TOOLS, Step, StepAction, StepKind, StructuredTrace

__all__ = [
    "RULES",
    "Table",
    "evidence_corrections",
    "listed_options",
    "nearest_option",
    "refusal",
    "tables_in",
]

_MAX_OPTIONS = 100
_MAX_OPTION_CHARS = 80
_MIN_SCORE = 0.5
_RESULT_CHARS = 4000
"""Only the head of a result is read: hints come with the failure, and rules must stay cheap on huge results."""

# A lead-in that introduces the values a tool accepts or has, then the list.
_LISTING = re.compile(
    r"(?P<lead>[^\n;:?]{0,80}?)\b(?:include|includes|are|were|is one of|one of|available|valid(?: \w+)?|allowed|"
    r"expected|options|choices|did you mean|possible values?|known(?: \w+)?|supported(?: \w+)?|such as)\b"
    r"\s*[:?]?\s*(?P<items>[^\n;)]+)",
    re.IGNORECASE,
)
_QUOTED_ITEM = re.compile(r"'([^'\n]{1,80})'|\"([^\"\n]{1,80})\"|`([^`\n]{1,80})`")
_SPLIT = re.compile(r"\s*(?:,|\||\bor\b)\s*")
_NUMBER_IN = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True, slots=True)
class _Listing:
    lead: str
    options: tuple[str, ...]


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w.%$-]+", " ", text.casefold()).split())


def listed_options(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every list of values ``text`` offers, with the words that introduce it: ``values of X include: 'a', 'b'``,
    ``columns are: a, b``, ``must be one of a, b``, ``did you mean 'a'?``. Quoted items when the list quotes them."""
    found = []
    for match in _LISTING.finditer(text[:_RESULT_CHARS]):
        items = match.group("items")
        quoted = [next(g for g in groups if g) for groups in _QUOTED_ITEM.findall(items)]
        if quoted:
            options = quoted
        else:
            options = [o.strip(" .'\"`[]{}") for o in _SPLIT.split(items)]
            if len(options) < 2:  # an unquoted single word after "are" is prose, not a list
                continue
        kept = tuple(dict.fromkeys(o for o in options if o and o != "..." and len(o) <= _MAX_OPTION_CHARS))
        if kept:
            found.append((match.group("lead"), kept[:_MAX_OPTIONS]))
    return found


def _score(value: str, option: str) -> float:
    """How likely ``option`` is what ``value`` meant: 1 for the same text up to case and punctuation, 0.95 for the
    same number written with a unit or suffix (1 -> 1st, 12 -> 12%), 0.9 for a prefix, 0.8 for a whole word
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
        score = _score(value, option)
        if score >= _MIN_SCORE and (best is None or score > best[1]):
            best = (option, score)
    return best


def _replacement(step: Step, name: str, value: str) -> StepAction:
    return StepAction(tool_name=step.tool_name, arguments={**step.tool_args, name: value})


def _string_arguments(step: Step) -> list[tuple[str, str]]:
    return [(str(k), v) for k, v in step.tool_args.items() if isinstance(v, str) and v.strip()]


def _from_listing(step: Step, rule: str) -> list[Correction]:
    """The argument a listing in the step's result corrects: the one named in the listing's lead-in (``op must be
    one of``), else the one whose value is nearest to a listed value."""
    result = step.tool_result or ""
    corrections = []
    for lead, options in listed_options(result):
        lead_words = set(_normal(lead).split())
        arguments = _string_arguments(step)
        named = [(k, v) for k, v in arguments if _normal(k) in lead_words]
        pool = named or arguments
        best: tuple[str, str, float] | None = None
        for name, value in pool:
            nearest = nearest_option(value, options)
            if nearest is not None and (best is None or nearest[1] > best[2]):
                best = (name, nearest[0], nearest[1])
        if best is None:
            continue
        name, option, _ = best
        listed = ", ".join(repr(o) for o in options[:6]) + (", ..." if len(options) > 6 else "")
        corrections.append(
            _correction(
                step,
                rule,
                _replacement(step, name, option),
                f"step {step.index} {'failed' if rule == 'valid_options' else 'returned nothing'} with "
                f"{name}={_short(step.tool_args[name])}; its result lists {listed}",
            )
        )
    return corrections


def listed_values(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """An empty result that lists the values the tool has (a filter on ``'1'`` where the column holds ``'1st'``):
    the same call with the nearest listed value."""
    return _from_listing(step, "listed_values") if empty_call(step) else []


def valid_options(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """A failed call whose error names the valid columns, fields, options or form (``columns are: a, b``, ``must
    be one of``, ``did you mean``): the same call with the nearest valid one."""
    return _from_listing(step, "valid_options") if failed_call(step) else []


def question_value(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """A failed or empty call one of whose values resembles a value the question names that no call used (the
    question says 'Los Angeles', the call 'LA angeles'): the same call with the question's value."""
    if not (failed_call(step) or empty_call(step)):
        return []
    used = " ".join(_normal(str(v)) for s in trace.steps for v in s.tool_args.values())
    absent = [c for c in question_constraints(trace.question) if _normal(c) not in used]
    best: tuple[str, str, float] | None = None
    for name, value in _string_arguments(step):
        nearest = nearest_option(value, absent)
        if nearest is not None and (best is None or nearest[1] > best[2]):
            best = (name, nearest[0], nearest[1])
    if best is None:
        return []
    name, wanted, _ = best
    return [
        _correction(
            step,
            "question_value",
            _replacement(step, name, wanted),
            f"the question names {wanted!r}, which no call used; step {step.index} used {name}="
            f"{_short(step.tool_args[name])} and got nothing",
        )
    ]


_COLUMNS_LINE = re.compile(r"\b(?:columns|fields|headers?)\s*[:=]\s*(?P<names>[^\n]+)$", re.IGNORECASE)
_RULE_LINE = re.compile(r"^\s*\|?\s*:?-{3,}")
_MAX_TABLE_ROWS = 200


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@dataclass(frozen=True, slots=True)
class Table:
    """A table some text shows: its fields' values in row order, and the words before its header (its name)."""

    fields: dict[str, list[str]]
    caption: str


def tables_in(text: str) -> list[Table]:
    """The tables ``text`` shows: pipe-separated rows under a header, where the header is a ``columns: a, b, c``
    line (or ``fields:``/``headers:``) or a pipe row followed by a ``---`` rule (Markdown). Rows with another
    number of cells end the table."""
    lines = text[: _RESULT_CHARS * 4].splitlines()
    found = []
    for i, line in enumerate(lines):
        listed = _COLUMNS_LINE.search(line)
        if listed is not None:
            header, start = [n.strip(" '\"`") for n in listed.group("names").split(",")], i + 1
            caption = line[: listed.start()]
        elif "|" in line and i + 1 < len(lines) and _RULE_LINE.match(lines[i + 1]):
            header, start, caption = _cells(line), i + 2, lines[i - 1] if i else ""
        else:
            continue
        if len(header) < 2 or len(set(header)) != len(header):
            continue
        rows = []
        for row_line in lines[start : start + _MAX_TABLE_ROWS]:
            row = _cells(row_line)
            if "|" not in row_line or len(row) != len(header):
                break
            rows.append(row)
        if rows:
            found.append(Table({name: [row[j] for row in rows] for j, name in enumerate(header)}, caption))
    return found


_LETTERS = re.compile(r"[^\W\d_]")


def other_field(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """An empty call whose value is not a value of the field it named but is one of another field in the data
    the agent was shown (its task context, earlier results): a filter on ``Award = 'Nominated'`` where
    ``'Nominated'`` is a value of ``Result``. The same call with that field and that value."""
    if not empty_call(step):
        return []
    shown = [context, *(s.tool_result or "" for s in trace.steps[: step.index - 1])]
    arguments = _string_arguments(step)
    best: tuple[float, str, str, str, str] | None = None  # score, field argument, field, value argument, value
    for table in (t for text in shown if text for t in tables_in(text)):
        fields = {_normal(name): name for name in table.fields}
        caption = set(_normal(table.caption).split())
        for field_arg, named in arguments:
            own = fields.get(_normal(named))
            if own is None:
                continue
            for value_arg, value in arguments:
                if value_arg == field_arg or len(_LETTERS.findall(value)) < 2 or _normal(value) in caption:
                    continue  # a number or a code is compared, not looked up; the table's own name is no value
                if any(_score(value, cell) >= 0.9 for cell in table.fields[own]):
                    continue  # its own field has it (or something like it): the field is not the mistake
                for name, cells in table.fields.items():
                    if name == own:
                        continue
                    for cell in dict.fromkeys(cells):
                        score = _score(value, cell)
                        if score >= 0.8 and (best is None or score > best[0]):
                            best = (score, field_arg, name, value_arg, cell)
    if best is None:
        return []
    _, field_arg, name, value_arg, cell = best
    replacement = StepAction(tool_name=step.tool_name, arguments={**step.tool_args, field_arg: name, value_arg: cell})
    return [
        _correction(
            step,
            "other_field",
            replacement,
            f"step {step.index} looked for {value_arg}={_short(step.tool_args[value_arg])} in "
            f"{field_arg}={_short(step.tool_args[field_arg])} and got nothing; the data shown has {cell!r} under "
            f"{name!r}",
        )
    ]


RULES = (listed_values, valid_options, question_value, other_field)
"""Each rule: ``(trace, step, context) -> corrections of that step``, ``context`` being what the agent was given
besides its question (``observe(context=...)``); source ``evidence:<rule name>``."""


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _correction(step: Step, rule: str, replacement: StepAction, finding: str) -> Correction:
    return Correction(
        source=f"evidence:{rule}",
        kind=InterventionKind.ACTION,
        step_index=step.index,
        original=StepAction.of_step(step),
        replacement=replacement,
        finding=finding,
    )


def evidence_corrections(trace: StructuredTrace, *, near: int | None = None, context: str = "") -> list[Correction]:
    """Every rule's corrections over the trace's tool calls, deduplicated; those of step ``near`` first, then by
    distance from it (the localized step is the likeliest to matter), else in step order. ``context`` is what the
    agent was given besides its question."""
    found: dict[tuple[object, ...], Correction] = {}
    steps = sorted(trace.steps, key=lambda s: (abs(s.index - near), s.index) if near is not None else (s.index, 0))
    for step in steps:
        if step.kind is not StepKind.TOOL_CALL or not step.tool_name:
            continue
        for rule in RULES:
            for correction in rule(trace, step, context):
                found.setdefault(correction.key, correction)
    return list(found.values())


def _final_answer_tools(trace: StructuredTrace) -> set[str]:
    return {s.tool_name.casefold() for s in trace.steps if s.tool_name and s.is_final_answer} | FINAL_ANSWER_TOOLS


def refusal(correction: Correction, trace: StructuredTrace, expected: str | None) -> str | None:
    """Why ``correction`` must not be tried, or None. Refused: an action that is the final answer or replaces the
    answer step, one whose arguments or text carry the expected answer, and one that repeats the original step."""
    replacement = correction.replacement
    if correction.kind is not InterventionKind.ACTION or replacement is None:
        return None
    if not 1 <= correction.step_index <= len(trace.steps):
        return f"step {correction.step_index} is not a step of the run"
    step = trace.steps[correction.step_index - 1]
    if replacement.tool_name is not None and replacement.tool_name.casefold() in _final_answer_tools(trace):
        return "the replacement is a final answer: it would flip the run from any step"
    leaked = leak(_texts(replacement), expected)
    if leaked is not None:
        return f"the replacement: {leaked}"
    if replacement == StepAction.of_step(step):
        return "the replacement repeats the original step"
    return None


def _texts(action: StepAction) -> str:
    def walk(value: object) -> Iterable[str]:
        if isinstance(value, dict):
            for item in value.values():
                yield from walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                yield from walk(item)
        elif value is not None:
            yield str(value)

    return "\n".join([action.text, *walk(action.arguments)])


def ordered(
    corrections: Sequence[Correction], trace: StructuredTrace, expected: str | None, limit: int
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
        reason = refusal(correction, trace, expected)
        if reason is not None:
            out.append(correction.model_copy(update={"refused": reason}))
            continue
        if correction.kind is InterventionKind.ACTION:
            if tried >= limit:
                continue
            tried += 1
        out.append(correction)
    return out
