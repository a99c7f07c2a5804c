"""Concrete corrections read from the trace itself (no LLM), and the rules that refuse a correction that would
prove nothing.

A failed or empty tool call often says what the right call is: an error names the valid columns, options or form, or
a candidate for the name it could not find; an empty result lists the values that exist; the question names a value
no call used; the data the agent was shown writes the value another way. Each rule turns such a finding into a
replacement call of the same tool with one argument changed, and says what it came from. When the argument is a
statement (SQL, a query string) the rule rewrites one identifier or literal in it, the one the error names or the
one compared with a value the data writes differently, never the whole statement.

Tool results are read as any tool writes them (:mod:`reflect_otel._tool_text`): JSON objects and arrays (keys naming
the available, valid or existing values; empty row sets; an ``error`` key), library error messages (DuckDB's
``Candidate bindings``, ``Did you mean``, PostgreSQL's ``HINT``, SQLite's ``no such column``, Python exceptions,
HTTP problem+json) and prose (``are:``, ``one of``). None knows a dataset or a framework. A rule that only fits one
agent's tools runs for that agent only: its replay adapter carries it (:class:`reflect_otel.replay.HasCorrectionRules`,
as the table demo's wiring gives its own); third parties may also install rules for every trace (entry-point group
``reflect_otel.correction_rules``, see :mod:`reflect_otel.plugins`). Either kind that raises or returns nonsense is
logged by name and skipped. What the rules cannot see: a right value the data does not show, a fix that needs
another tool, or several arguments wrong at once.

A replacement that is the final answer, or that introduces the expected answer into the step
(:mod:`reflect_otel.leaks`), is refused: it would flip a replay from any step and prove nothing about the step; so
is one that changes nothing (the step itself, or a pure tool's call the prefix already made). :func:`refusal` lists
every refusal.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from reflect_otel import _tool_text, plugins
from reflect_otel._statement import (
    Token,
    TokenKind,
    comparisons,
    is_statement,
    marked,
    name_at,
    qualifier_of,
    rewrite,
    tokens,
)
from reflect_otel.evidence import empty_call, failed_call, question_constraints
from reflect_otel.leaks import action_leak
from reflect_otel.prompts import CORRECTED_STEP_ASK, without_step_label
from reflect_otel.record import Correction, InterventionKind
from reflect_otel.trace import Step, StepAction, StepKind, StructuredTrace

__all__ = [
    "RULES",
    "Rule",
    "agent_corrections",
    "evidence_corrections",
    "listed_options",
    "nearest_option",
    "ordered",
    "refusal",
    "rule_correction",
    "rules",
    "similarity",
    "string_arguments",
]

_log = logging.getLogger("reflect_otel.corrections")

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
        if nearest is not None:
            fixes.append(_Fix(nearest[1], name, rewrite(value, token, nearest[0]), token.value, nearest[0]))
    return fixes


def _fixes(step: Step, options: Sequence[str], *, named: Sequence[str] = (), literals: bool = False) -> list[_Fix]:
    """Each string argument rewritten toward ``options``, best first (of equal scores, the first in the statement).
    When the error names what is wrong, an argument that is a name it names is replaced whole, and any other argument
    holding one as a token (``SELECT custmer FROM orders``, however short) has that token rewritten, quoted as
    written: the occurrence the error marks (DuckDB's and PostgreSQL's ``^`` under the echoed line), else each in
    turn. Otherwise a value is replaced whole, and in a statement, with ``literals``, each string literal is
    rewritten. A fix changes one identifier or literal (one reference: :mod:`reflect_otel._statement`), never more."""
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
    An error that names a wrong name and offers nothing (SQLite's ``no such column: x``) is corrected from the field
    names the data shown before it has (a schema, rows)."""
    if not failed_call(step):
        return []
    named = _tool_text.named(step.tool_result)
    found = _from_hints(step, "valid_options", named=named)
    if found or not named:
        return found
    names = list(dict.fromkeys(n for text in _shown_texts(trace, step, context) for n in _tool_text.shown_names(text)))
    fixes = _fixes(step, names, named=named) if names else []
    if not fixes:
        return []
    fix = fixes[0]
    return [
        rule_correction(
            step,
            "valid_options",
            _replaced(step, fix),
            f"step {step.index} failed on {_short(fix.was)} ({_short(_first_line(step.tool_result))}); the data "
            f"shown before it has the field {fix.now!r}",
        )
    ]


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
    fixes = _fixes(step, absent, literals=True) if absent else []
    if not fixes:
        return []
    fix = fixes[0]
    return [
        rule_correction(
            step,
            "question_value",
            _replaced(step, fix),
            f"the question names {fix.now!r}, which no call used; step {step.index} used {_what(fix, step)} and "
            "got nothing",
        )
    ]


def shown_value(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """An empty call that compares a field with a value the data shown before it (its context, earlier results:
    JSON rows, a schema's sample rows, Markdown tables) writes differently under that field: ``"status" = 'done'``
    where the rows shown write ``'Done'``, or an argument named like the field (``city="LA"``). The same call with
    the value as the data writes it (in a statement, that literal rewritten)."""
    if not empty_call(step):
        return []
    shown: dict[str, list[str]] = {}
    for text in _shown_texts(trace, step, context):
        for field_name, field_values in _tool_text.shown_fields(text).items():
            known = shown.setdefault(_normal(field_name), [])
            known += [v for v in field_values if v not in known]
    if not shown:
        return []
    fixes: list[_Fix] = []
    for name, value in string_arguments(step):
        if _is_value(value):
            nearest = nearest_option(value, shown.get(_normal(name), []))
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


Rule = Callable[[StructuredTrace, Step, str], list[Correction]]
"""``(trace, step, context) -> corrections of that step``, ``context`` being what the agent was given besides its
question (``observe(context=...)``); each correction's source is ``evidence:<rule name>``."""

RULES: tuple[Rule, ...] = (listed_values, valid_options, question_value, shown_value)
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
    :func:`reflect_otel.leaks.action_leak`), a thought that is no step of the agent's (:func:`not_a_step`), one
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
    """A rewritten thought that is no step of the agent's: the prompt's own request copied back (seed 48's BBM
    replayed "Step 2 as it should have been, with concrete values taken from the data above" twice), advice about
    the agent ("The agent should have ..."), or commentary on the run ("The erroneous step was ...", "The correct
    sequence should be ...", a text that tells the run in the third person, "The agent incorrectly assumed ...",
    "The agent's reasoning was ...", or a verdict such as "Step 7 (final_answer) was incorrect because ...": 13 of
    the 30 rewritten thoughts replayed as interventions in BBM seed 7725's 40 traces). A thought in the agent's own
    voice that names an error ("The error is that the column has a space, so quote it") is a step."""
    if _VERDICT.search(thought):
        return True
    thought = without_step_label(thought)
    lowered = " ".join(thought.lower().split())
    return CORRECTED_STEP_ASK in lowered or bool(_ADVICE.search(thought) or _COMMENTARY.search(thought))


_QUOTES = str.maketrans("", "", "\"'`\u2018\u2019\u201c\u201d")


def _words(text: str) -> str:
    """A thought's words, without the step label a model may have copied from the prompt's layout, and without
    quotation marks (seed 7725's auditor rewrote 'So, we need "]" and ">"' as 'So, we need ] and >')."""
    return " ".join(without_step_label(text).translate(_QUOTES).split())


def _commentary_added(replacement: StepAction, step: Step) -> bool:
    """The step's own thought with commentary on the run after it (seed 7725: the original step, then "The agent
    has produced an incorrect result.")."""
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
