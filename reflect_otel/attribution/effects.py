"""What a replacement of step p changed: its *effect* (what the step produced), not its text.

A replacement changes step p only when what it produced differs from what the original step produced: for a call,
its result (under the tool's own normalisation, :class:`~reflect_otel.replay.NormalisesResults`, else whitespace and
JSON key order aside); for a thought, its content (a step label, quotation marks and spacing aside). Three more
replacements never change step p whatever they produce, since any of them can flip a run from anywhere:

* one that replaces the run's **answer turn** (a call in place of the answer gives the agent more turns);
* one that is a call **the run itself made at a later step**, moved earlier (the run's own later work, sooner);
* one the adapter did not execute as given.

:func:`change_of` says which of these a replayed step p is (:class:`StepChange`), and :func:`screened_change` says
it before any replay where the replacement alone tells (the answer turn, a later call).

The **sensitivity variant** of step p (:func:`sensitivity_variant`) is the same step changed in text but not in
effect: the original call re-serialised (its arguments in another order, a statement laid out otherwise), or the
original thought with a step label. Executed as an action, as every intervention is, it asks whether *any* change of
text at step p flips the run; where it does, no flip there can be credited to a correction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import pairwise
from typing import Any

from reflect_otel import _values
from reflect_otel.attribution._statement import TokenKind, is_statement, tokens
from reflect_otel.prompts import without_step_label
from reflect_otel.record import StepChange
from reflect_otel.trace import Step, StepAction, StructuredTrace

__all__ = [
    "ResultNormaliser",
    "StepChange",
    "change_of",
    "default_normalise",
    "later_call",
    "same_content",
    "same_result",
    "screened_change",
    "sensitivity_variant",
    "variant_replayed_as_given",
]

ResultNormaliser = Callable[[str, str], str]
"""``(tool_name, result) -> the result as compared``: a tool's declaration of what in its result carries no meaning
(row order for a set, a timestamp)."""


_RESULT_CHARS = 200_000
"""Results are compared on their first 200,000 characters (trace content is untrusted)."""


_ECHOED = re.compile(r"^[ \t]*(?:LINE \d+:.*|[ \t^~]*\^[ \t^~]*)$", re.MULTILINE)
"""A statement's text echoed into its error (DuckDB's and PostgreSQL's ``LINE 2: FROM t ...`` and the ``^`` marker
under it): the same error for the same statement laid out otherwise."""


def default_normalise(tool_name: str, result: str) -> str:
    """A result as compared when its tool declares nothing: JSON with its object keys sorted, else the text without
    the statement an error echoes and with its whitespace collapsed."""
    text = result[:_RESULT_CHARS].strip()
    if text[:1] in "[{":
        try:
            return json.dumps(json.loads(text), sort_keys=True, ensure_ascii=False)
        except ValueError:
            pass
    return " ".join(_ECHOED.sub("", text).split())


def same_result(
    original: str | None, replayed: str | None, *, tool_name: str, normalise: ResultNormaliser | None = None
) -> bool:
    """Whether a replayed call's result is the original step's, under ``normalise`` (else
    :func:`default_normalise`). A recorded result the trace cut short is compared on the part it kept, and the
    lengths must agree."""
    if original is None or replayed is None:
        return original is None and replayed is None
    kept, cut = _values.untruncated(original)
    if cut:
        return replayed.startswith(kept) and len(replayed) == len(kept) + cut
    compare = normalise or default_normalise
    try:
        return compare(tool_name, kept) == compare(tool_name, replayed)
    except Exception:  # a tool's normaliser is the agent's code: one that fails compares the text as written
        return default_normalise(tool_name, kept) == default_normalise(tool_name, replayed)


_QUOTES = str.maketrans("", "", "\"'`\u2018\u2019\u201c\u201d")


def _words(text: str) -> str:
    return " ".join(without_step_label(text).translate(_QUOTES).split())


def same_content(replacement: str, original: str) -> bool:
    """Whether two thoughts say the same: equal but for a step label, quotation marks and spacing."""
    return _words(replacement) == _words(original)


def later_call(action: StepAction, trace: StructuredTrace, index: int) -> Step | None:
    """The first step after ``index``, of the same agent as step ``index``, that made ``action``'s call, or None."""
    if action.tool_name is None or not 1 <= index <= len(trace.steps):
        return None
    agent = trace.steps[index - 1].agent
    return next(
        (
            s
            for s in trace.steps[index:]
            if s.tool_name and s.agent == agent and not s.is_final_answer and action.same_as(StepAction.of_step(s))
        ),
        None,
    )


def screened_change(action: StepAction, trace: StructuredTrace, index: int) -> StepChange | None:
    """Why ``action`` at step ``index`` cannot change the step whatever it produces (the answer turn, a later call of
    the run), before any replay; None when only its replay can tell."""
    if not 1 <= index <= len(trace.steps):
        return None
    if trace.steps[index - 1].is_final_answer:
        return StepChange.ANSWER_TURN
    if later_call(action, trace, index) is not None:
        return StepChange.LATER_CALL
    return None


def change_of(
    replayed: Step | None,
    action: StepAction | None,
    original: Step,
    trace: StructuredTrace,
    *,
    normalise: ResultNormaliser | None = None,
) -> StepChange:
    """What the replay's step p (``replayed``, its first regenerated step) changed against ``original``. ``action``
    is the replacement the adapter was given (None: the adapter regenerated the step itself, with guidance)."""
    if replayed is None:
        return StepChange.NOT_EXECUTED
    done = StepAction.of_step(replayed)
    if action is not None and not done.same_as(action):
        return StepChange.NOT_EXECUTED
    if action is None and replayed.is_final_answer:
        return StepChange.ANSWERED
    if original.is_final_answer:
        return StepChange.ANSWER_TURN
    if done.same_as(StepAction.of_step(original)):
        return StepChange.SAME_STEP
    if later_call(done, trace, original.index) is not None:
        return StepChange.LATER_CALL
    if done.tool_name is None and not original.tool_name:
        return StepChange.SAME_EFFECT if same_content(done.text, original.reasoning) else StepChange.CHANGED
    if done.tool_name is not None and original.tool_name == done.tool_name:
        same = same_result(original.tool_result, replayed.tool_result, tool_name=done.tool_name, normalise=normalise)
        return StepChange.SAME_EFFECT if same else StepChange.CHANGED
    return StepChange.CHANGED  # another tool, or a call where a thought was: another effect by kind


# -- the sensitivity variant ---------------------------------------------------------------------------------------

_CLAUSES = re.compile(r"^(?:from|where|group|order|having|limit|join|union)$", re.IGNORECASE)


def _relaid(statement: str) -> str | None:
    """``statement`` laid out otherwise, outside its literals and quoted names: the whitespace before its first
    clause keyword (FROM, WHERE, ...) becomes a line break, or, where it is one already, a space. Whitespace is only
    ever replaced, never removed, so no two tokens run together. None when there is no such place."""
    found = tokens(statement)
    for before, token in pairwise(found):
        if token.kind is not TokenKind.WORD or not _CLAUSES.match(token.value):
            continue
        gap = statement[before.end : token.start]
        match = re.search(r"\s+$", gap)
        if match is None:
            continue
        start = before.end + match.start()
        spacing = " " if "\n" in match.group() else "\n"
        return statement[:start] + spacing + statement[token.start :]
    return None


def sensitivity_variant(step: Step) -> tuple[StepAction | None, str]:
    """Step ``step`` changed in text but not in effect, with how; ``(None, why)`` where no such variant can be made.

    A call with several arguments: the same arguments in reverse order (JSON object members carry no order). A call
    whose one argument is a statement: the statement laid out otherwise (a line break before its first clause). A
    call with the step's own text beside it (a thought the agent wrote with the call): the call alone, as every
    executed replacement is made. A thought: the same words under a step label (``Step 3: ...``), or without the
    label it had."""
    if step.tool_name:
        arguments: dict[str, Any] = dict(step.tool_args)
        if len(arguments) >= 2:
            reordered = dict(reversed(list(arguments.items())))
            return StepAction(tool_name=step.tool_name, arguments=reordered), "its arguments in reverse order"
        strings = [(k, v) for k, v in arguments.items() if isinstance(v, str)]
        if len(strings) == 1 and is_statement(strings[0][1]):
            relaid = _relaid(strings[0][1])
            if relaid is not None:
                action = StepAction(tool_name=step.tool_name, arguments={strings[0][0]: relaid})
                return action, "its statement laid out otherwise"
        if step.reasoning.strip():
            return StepAction.of_step(step), "the call alone, without the text the agent wrote with it"
        return None, (
            "a call with one plain argument and no text beside it has no other spelling the tool surely reads the same"
        )
    thought = step.reasoning.strip()
    if not thought:
        return None, "the step has no text"
    bare = without_step_label(thought)
    if bare != thought:
        return StepAction(text=bare), "its words without their step label"
    return StepAction(text=f"Step {step.index}: {thought}"), "its words under a step label"


def variant_replayed_as_given(replayed: Step, variant: StepAction, original: Step) -> bool:
    """Whether the replay's step p is the variant with a changed text: its arguments in the variant's order, or
    another thought text, or its own text dropped beside the call (an adapter that re-serialises calls in its own
    order, or keeps the step's text, replays the original step unchanged: no sensitivity test)."""
    if variant.tool_name is None:
        return replayed.reasoning.strip() != original.reasoning.strip()
    if list(replayed.tool_args) != list(original.tool_args) or replayed.tool_args != original.tool_args:
        return True
    return replayed.reasoning.strip() != original.reasoning.strip()
