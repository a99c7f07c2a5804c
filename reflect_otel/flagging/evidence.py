"""Evidence checks: facts about a failed run read from the trace itself, with no LLM.

Each check is a pure function ``StructuredTrace -> list[Finding]``; :func:`find_evidence` runs them all. A finding
names the step it is about, its kind, a severity and the text that shows it. They serve three ways: the proxy
verifier flags a run with a critical finding whatever its audit says; the localize and diagnose prompts show the
findings as delimited evidence, so a weak auditor starts from facts; and the ``evidence`` method attributes a run
to its earliest decisive finding.

Severities say how sure a finding is that the run failed, not how bad the step was:

- ``critical``: the run failed, whatever the task (no final answer, a step limit hit, a loop of identical calls,
  an answer given right after a failed call).
- ``warning``: a likely cause that a correct run can also show (an empty result, a one-off repeated call, an
  answer value found in no observation, a question constraint absent from every tool argument).
- ``info``: context for the auditor (a result no later step refers to).

The checks read text the way any agent writes it (error prefixes and library error messages, JSON results with an
``error`` key or an empty row set, ``[]``, ``0 rows``, numbers and names; :mod:`reflect_otel.reading._tool_text`); none
knows a particular framework or dataset. Chain-of-thought traces have no tool results, so most checks find
nothing there; each check's docstring says what it cannot see.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from reflect_otel.reading import _tool_text
from reflect_otel.trace import Step, StepAction, StepKind, StepStatus, StructuredTrace

__all__ = [
    "CHECKS",
    "Finding",
    "FindingKind",
    "Severity",
    "decisive",
    "empty_call",
    "failed_call",
    "find_evidence",
    "question_constraints",
    "render_findings",
]


class Severity(str, Enum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


class FindingKind(str, Enum):
    TOOL_ERROR = "tool_error"
    EMPTY_RESULT = "empty_result"
    REPEATED_CALL = "repeated_call"
    NO_FINAL_ANSWER = "no_final_answer"
    STEP_LIMIT = "step_limit"
    UNSUPPORTED_ANSWER = "unsupported_answer"
    CONSTRAINT_DROPPED = "constraint_dropped"
    UNREAD_RESULT = "unread_result"


class Finding(BaseModel):
    """One fact about one step. ``evidence`` quotes the trace (cut short), so a reader can check it."""

    model_config = ConfigDict(frozen=True)

    step_index: int = Field(ge=1)
    kind: FindingKind
    severity: Severity
    evidence: str


_QUOTE_CHARS = 160
_SEVERITY_ORDER = (Severity.CRITICAL, Severity.WARNING, Severity.INFO)

_LIMIT_TEXT = re.compile(
    r"recursion limit|max(imum)?[ _](number of )?(steps|iterations|turns)|(step|iteration|turn) limit|"
    r"GraphRecursionError|MaxTurnsExceeded|max_steps|max_iterations",
    re.IGNORECASE,
)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3})")
"""A thousands separator (only between digits: "1,2" in a text argument is not 12)."""
_NUMBER = re.compile(r"(?<![\w.])-?\d(?:[\d,]*\d)?(?:\.\d+)?(?![\w])")  # "1000," is 1000: a comma ends it
_QUOTED = re.compile(r"\"([^\"]{2,80})\"|“([^”]{2,80})”|(?<!\w)'([^']{2,80})'(?!\w)")
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][\w&.-]+(?:\s+[A-Z][\w&.-]+)*)")
_FUNCTION_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "answer",
        "at",
        "but",
        "for",
        "i",
        "in",
        "it",
        "no",
        "of",
        "on",
        "or",
        "so",
        "that",
        "the",
        "these",
        "this",
        "those",
        "to",
        "yes",
    ]
)
_WORD = re.compile(r"[^\W_]+(?:[-'][^\W_]+)*", re.UNICODE)
_SMALL_COUNT = 20
_MAX_NUMBERS = 400


# -- the text of a step ---------------------------------------------------------------------------------------------
def _quote(text: str | None) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= _QUOTE_CHARS else flat[: _QUOTE_CHARS - 3] + "..."


def _call(step: Step) -> str:
    return StepAction.of_step(step).key()  # a null argument is the tool's default: the same call


def _args_text(step: Step) -> str:
    return json.dumps(step.tool_args, ensure_ascii=False, default=str) if step.tool_args else ""


def _is_call(step: Step) -> bool:
    return step.kind is StepKind.TOOL_CALL and bool(step.tool_name)


def _failed(step: Step) -> bool:
    return step.status is StepStatus.ERROR or _tool_text.reads_as_error(step.tool_result)


def _empty(step: Step) -> bool:
    return _tool_text.reads_as_empty(step.tool_result)


def failed_call(step: Step) -> bool:
    """A tool call whose status is an error or whose result reads as one (an error line as a library writes it, an
    exception, a JSON object whose ``error`` says so, an HTTP problem; see :mod:`reflect_otel.reading._tool_text`)."""
    return _is_call(step) and _failed(step)


def empty_call(step: Step) -> bool:
    """A tool call that succeeded and returned nothing (``[]``, ``null``, ``0 rows``, ``no results found``, a JSON
    object whose row set is empty or whose count is 0)."""
    return _is_call(step) and not _failed(step) and _empty(step)


def question_constraints(question: str) -> list[str]:
    """The values a question names: quoted phrases, numbers of two digits or more, capitalised names."""
    return _constraints(question)


def _numbers(text: str) -> list[float]:
    found = []
    for match in _NUMBER.findall(text):
        try:
            found.append(float(match.replace(",", "")))
        except ValueError:
            continue
    return found


def _answered(trace: StructuredTrace) -> bool:
    return bool((trace.final_answer or "").strip()) or any(
        s.is_final_answer and s.reasoning.strip() for s in trace.steps
    )


def _answer_step(trace: StructuredTrace) -> Step | None:
    for step in reversed(trace.steps):
        if step.is_final_answer:
            return step
    return None


# -- the checks ---------------------------------------------------------------------------------------------------
def tool_errors(trace: StructuredTrace) -> list[Finding]:
    """A tool call that failed (error status, or a result that reads as an error) and that the run went past.

    Critical when the final answer comes after it with no successful call in between: the answer rests on a
    failure. Cannot see: an error reported in words the agent's tool made up (``"sorry, try later"``), or whether
    a later step actually used the failed result."""
    findings = []
    steps = trace.steps
    for position, step in enumerate(steps):
        if not _is_call(step) or not _failed(step):
            continue
        later = steps[position + 1 :]
        if not later:
            continue
        recovered = any(_is_call(s) and not _failed(s) for s in later)
        answered_after = any(s.is_final_answer for s in later)
        critical = answered_after and not recovered
        tail = (
            "the final answer follows with no successful call after it"
            if critical
            else ("a later call succeeded" if recovered else "no later call succeeded")
        )
        message = step.tool_result if step.tool_result else (step.status_message or "error status")
        findings.append(
            Finding(
                step_index=step.index,
                kind=FindingKind.TOOL_ERROR,
                severity=Severity.CRITICAL if critical else Severity.WARNING,
                evidence=f"{_call(step)} failed: {_quote(message)}; {tail}",
            )
        )
    return findings


def empty_results(trace: StructuredTrace) -> list[Finding]:
    """A tool call that returned nothing (``[]``, ``null``, ``0 rows``, ``no results found``) after which the run
    went on as if it had data. Cannot see: an empty result that is the right answer (a count of zero); the
    severity stays a warning for that reason."""
    findings = []
    for position, step in enumerate(trace.steps):
        if not _is_call(step) or _failed(step) or not _empty(step):
            continue
        later = trace.steps[position + 1 :]
        if not later:
            continue
        answered_next = later[0].is_final_answer
        tail = "the final answer came next" if answered_next else f"{len(later)} step(s) followed"
        findings.append(
            Finding(
                step_index=step.index,
                kind=FindingKind.EMPTY_RESULT,
                severity=Severity.WARNING,
                evidence=f"{_call(step)} returned nothing: {_quote(step.tool_result)}; {tail}",
            )
        )
    return findings


def repeated_calls(trace: StructuredTrace) -> list[Finding]:
    """The same call (tool and arguments) made again; reported once per call, at its first repetition.
    Critical at three or more: a loop. Cannot see: a repetition that is right because the world changed between
    the calls (polling), or near-identical calls that differ in an irrelevant argument."""
    seen: dict[str, list[int]] = {}
    for step in trace.steps:
        if _is_call(step):
            seen.setdefault(_call(step), []).append(step.index)
    findings = []
    for call, indexes in seen.items():
        if len(indexes) < 2:
            continue
        findings.append(
            Finding(
                step_index=indexes[1],
                kind=FindingKind.REPEATED_CALL,
                severity=Severity.CRITICAL if len(indexes) >= 3 else Severity.WARNING,
                evidence=f"{_quote(call)} made {len(indexes)} times (steps {', '.join(map(str, indexes[:8]))})",
            )
        )
    return findings


def unfinished_run(trace: StructuredTrace) -> list[Finding]:
    """The run ended without a final answer, or at a step or recursion limit (a framework's limit error in a
    status, or the answer text naming the limit). Critical: an unfinished run has failed whatever the task.
    Cannot see: a limit the framework enforces silently, returning a normal-looking last message."""
    if not trace.steps:
        return []
    last = trace.steps[-1]
    texts = [(s.index, s.status_message or "") for s in trace.steps]
    texts.append((last.index, trace.final_answer or ""))
    for index, text in texts:
        match = _LIMIT_TEXT.search(text)
        if match:
            return [
                Finding(
                    step_index=index,
                    kind=FindingKind.STEP_LIMIT,
                    severity=Severity.CRITICAL,
                    evidence=f"the run hit a limit: {_quote(text)}",
                )
            ]
    if _answered(trace):
        return []
    return [
        Finding(
            step_index=last.index,
            kind=FindingKind.NO_FINAL_ANSWER,
            severity=Severity.CRITICAL,
            evidence=f"the run ended after {len(trace.steps)} step(s) without a final answer",
        )
    ]


def _observations(trace: StructuredTrace) -> str:
    return "\n".join(s.tool_result for s in trace.steps if s.tool_result and not _failed(s))


def _derivable(value: float, observed: Sequence[float]) -> bool:
    """Observed, a small count, or one addition or subtraction of two observed numbers away."""
    if abs(value) <= _SMALL_COUNT and value == int(value):
        return True
    pool = observed[:_MAX_NUMBERS]
    members = set(pool)
    if value in members:
        return True
    return any((value - a) in members or (a - value) in members for a in pool)


def unsupported_answer(trace: StructuredTrace) -> list[Finding]:
    """A final answer whose numbers or names appear in no successful tool result (nor in the question).

    A number counts as supported when it was observed, is a small count (up to 20), or is one addition or
    subtraction of two observed numbers; a name when its words appear in an observation. Only for runs with tool
    results. Cannot see: a value computed in several steps, a paraphrase, or a correct answer the model knew."""
    observations = _observations(trace)
    answer = (trace.final_answer or "").strip()
    step = _answer_step(trace) or (trace.steps[-1] if trace.steps else None)
    if not observations or not answer or step is None:
        return []
    haystack = f"{observations}\n{trace.question}".lower()
    observed = sorted(set(_numbers(haystack)))
    missing = [n for n in _NUMBER.findall(answer) if not _derivable(float(n.replace(",", "")), observed)]
    for name in _names(answer):
        words = [w for w in _WORD.findall(name.lower()) if len(w) > 2]
        if words and not any(w in haystack for w in words):
            missing.append(name)
    if not missing:
        return []
    return [
        Finding(
            step_index=step.index,
            kind=FindingKind.UNSUPPORTED_ANSWER,
            severity=Severity.WARNING,
            evidence=f"the answer's {', '.join(repr(m) for m in missing[:5])} appear(s) in no tool result",
        )
    ]


def _names(text: str) -> list[str]:
    """Capitalised runs of words, not at a sentence start, without leading function words or end punctuation."""
    names = []
    for match in _NAME.findall(text):
        words = match.strip(".-").split()
        while words and words[0].lower() in _FUNCTION_WORDS:
            words = words[1:]
        if words and len(" ".join(words)) > 2:
            names.append(" ".join(words))
    return names


def _constraints(question: str) -> list[str]:
    quoted = [next(g for g in groups if g) for groups in _QUOTED.findall(question)]
    numbers = [n for n in _NUMBER.findall(question) if len(n.replace(",", "")) >= 2]
    names = _names(question)
    out: list[str] = []
    for item in (*quoted, *numbers, *names):
        if item.lower() not in (o.lower() for o in out):
            out.append(item)
    return out


def dropped_constraints(trace: StructuredTrace) -> list[Finding]:
    """Values the question names (quoted phrases, numbers and years of two digits or more, capitalised names)
    that appear in no tool argument: the paper's constraint drop. Reported at the first tool call, where the
    constraint could first have been used. Only for runs with tool arguments. Cannot see: a constraint the
    agent applied by reading results rather than by filtering, or a name written in lower case."""
    calls = [s for s in trace.steps if _is_call(s) and s.tool_args]
    if not calls:
        return []
    arguments = _THOUSANDS.sub("", "\n".join(_args_text(s) for s in calls).lower())  # 1,250 is 1250
    absent = [c for c in _constraints(trace.question) if _THOUSANDS.sub("", c.lower()) not in arguments]
    if not absent:
        return []
    return [
        Finding(
            step_index=calls[0].index,
            kind=FindingKind.CONSTRAINT_DROPPED,
            severity=Severity.WARNING,
            evidence="the question's " + ", ".join(repr(c) for c in absent[:5]) + " appear(s) in no tool argument",
        )
    ]


def _salient(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) >= 4 or any(ch.isdigit() for ch in w)}


def unread_results(trace: StructuredTrace) -> list[Finding]:
    """A successful, non-empty tool result of which no later step repeats a word (a name, a number, an
    identifier): the agent may have ignored it. Information only. Cannot see: a result read and summarised in
    other words, or one whose only use was to rule something out."""
    findings = []
    steps = trace.steps
    for position, step in enumerate(steps):
        if not _is_call(step) or step.tool_result is None or _failed(step) or _empty(step):
            continue
        later = steps[position + 1 :]
        if not later:
            continue
        words = _salient(step.tool_result)
        if len(words) < 3:
            continue
        after = " ".join(f"{s.reasoning} {_args_text(s)}" for s in later) + f" {trace.final_answer or ''}"
        if words & _salient(after):
            continue
        findings.append(
            Finding(
                step_index=step.index,
                kind=FindingKind.UNREAD_RESULT,
                severity=Severity.INFO,
                evidence=f"no later step refers to the result of {_quote(_call(step))}",
            )
        )
    return findings


CHECKS: tuple[Callable[[StructuredTrace], list[Finding]], ...] = (
    tool_errors,
    empty_results,
    repeated_calls,
    unfinished_run,
    unsupported_answer,
    dropped_constraints,
    unread_results,
)


def find_evidence(trace: StructuredTrace) -> tuple[Finding, ...]:
    """Every check's findings, by step, then severity. Never raises on trace content."""
    found = [finding for check in CHECKS for finding in check(trace)]
    return tuple(sorted(found, key=lambda f: (f.step_index, _SEVERITY_ORDER.index(f.severity), f.kind.value)))


_CAUSES = frozenset(
    {
        FindingKind.TOOL_ERROR,
        FindingKind.EMPTY_RESULT,
        FindingKind.REPEATED_CALL,
        FindingKind.NO_FINAL_ANSWER,
        FindingKind.STEP_LIMIT,
    }
)
"""Kinds that point at the step where things went wrong; the others (a dropped constraint, an unsupported answer)
point at the run as a whole and are placed by convention (first call, answer step)."""


def decisive(findings: Iterable[Finding]) -> Finding | None:
    """The earliest critical or warning finding of a kind that points at a step (a failed or empty call, a
    repetition, the end of an unfinished run); else the earliest other critical or warning finding. A loop's or
    a limit's finding yields to an earlier failed or empty call, since that is what led there."""
    ranked = [f for f in findings if f.severity is not Severity.INFO]
    causes = [f for f in ranked if f.kind in _CAUSES]
    pool = causes or ranked
    return min(pool, key=lambda f: f.step_index) if pool else None


def render_findings(findings: Sequence[Finding]) -> str:
    """One line per finding, for a prompt's evidence block."""
    return "\n".join(f"Step {f.step_index}: [{f.severity.value}] {f.kind.value}: {f.evidence}" for f in findings)
