"""The table-QA demo agent's own correction rule: it fits that agent's tools (a filter taking a field and a value)
and their text (a ``tN: N rows; columns: a, b`` header over `` | `` rows), so it is not in the core, and it runs for
that agent's runs only: the demo's and the evaluation's wiring give :data:`RULES` to the agent's replay adapter
(``LangGraphReplayAdapter(..., correction_rules=RULES)``; see :class:`reflect_otel.replay.HasCorrectionRules`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reflect_otel.attribution.corrections import Rule, rule_correction, similarity, string_arguments
from reflect_otel.flagging.evidence import empty_call
from reflect_otel.record import Correction
from reflect_otel.trace import Step, StepAction, StructuredTrace

__all__ = ["RULES", "Table", "other_field", "tables_in"]

_RESULT_CHARS = 16_000
_COLUMNS_LINE = re.compile(r"\b(?:columns|fields|headers?)\s*[:=]\s*(?P<names>[^\n]+)$", re.IGNORECASE)
_RULE_LINE = re.compile(r"^\s*\|?\s*:?-{3,}")
_MAX_TABLE_ROWS = 200
_LETTERS = re.compile(r"[^\W\d_]")


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w.%$-]+", " ", text.casefold()).split())


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
    lines = text[:_RESULT_CHARS].splitlines()
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


def other_field(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """An empty call whose value is not a value of the field it named but is one of another field in the data
    the agent was shown (its task context, earlier results): a filter on ``Award = 'Nominated'`` where
    ``'Nominated'`` is a value of ``Result``. The same call with that field and that value."""
    if not empty_call(step):
        return []
    shown = [context, *(s.tool_result or "" for s in trace.steps[: step.index - 1])]
    arguments = string_arguments(step)
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
                if any(similarity(value, cell) >= 0.9 for cell in table.fields[own]):
                    continue  # its own field has it (or something like it): the field is not the mistake
                for name, cells in table.fields.items():
                    if name == own:
                        continue
                    for cell in dict.fromkeys(cells):
                        score = similarity(value, cell)
                        if score >= 0.8 and (best is None or score > best[0]):
                            best = (score, field_arg, name, value_arg, cell)
    if best is None:
        return []
    _, field_arg, name, value_arg, cell = best
    replacement = StepAction(tool_name=step.tool_name, arguments={**step.tool_args, field_arg: name, value_arg: cell})
    return [
        rule_correction(
            step,
            "other_field",
            replacement,
            f"step {step.index} looked for {value_arg}={_short(step.tool_args[value_arg])} in "
            f"{field_arg}={_short(step.tool_args[field_arg])} and got nothing; the data shown has {cell!r} under "
            f"{name!r}",
        )
    ]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


RULES: tuple[Rule, ...] = (other_field,)
"""The table-QA agent's own rules, for its replay adapter."""
