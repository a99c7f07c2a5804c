"""The rows of a wtq-live ``results.jsonl``, typed: one :class:`LiveRow` per agent run (the last line of a question
wins) holding a :class:`MethodRow` per method that attributed it. Rows are built once and never changed: a method
added to a row is a new row (:meth:`LiveRow.with_method`).

Rows written by older code stay readable: a field that did not exist yet is absent (None, or the default named
below), and keys this code does not know are kept as they were (``extra="allow"``) and written back unchanged when a
resume appends the row again. :meth:`LiveRow.line` writes only the fields the row was given, so a stored row
re-appended keeps its own keys. The ``record`` and ``trace`` stay the JSON the code that ran wrote
(:meth:`AttributionRecord.model_dump` and :meth:`StructuredTrace.model_dump` of that code, which may be older than
this one): :mod:`benchmarks.evaluation._live_records` reads the fields it needs from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from benchmarks.evaluation.runner import read_done
from reflect_otel.errors import InputError

__all__ = ["LIVE", "Judgement", "LiveRow", "MethodRow", "parse_live_row", "read_live_rows"]

LIVE = "wtq-live"
"""The benchmark's name, in ``--benchmark`` and in its folders' ``run_config.json``."""

_ROW = ConfigDict(frozen=True, extra="allow")


class Judgement(BaseModel):
    """How the agent's answer was judged against the expected one (absent from rows made before judging)."""

    model_config = _ROW

    outcome: str
    value: str | None = None
    how: str = ""


class MethodRow(BaseModel):
    """One method's attribution of one failed run: what its record concluded and what it cost."""

    model_config = _ROW

    status: str
    step: int | None = None
    flipped: bool | None = None
    """An intervention replay answered right (rows made before the name: the ``corrected`` key, see :attr:`flip`)."""
    corrected_answer: str | None = None
    verified_by: dict[str, str] | None = None
    effect: dict[str, Any] | None = None
    fidelity: tuple[int, int] | None = None
    """(control replays that gave the run's answer, control replays)."""
    replays: int = 0
    control_replays: int | None = None
    sensitivity_replays: int | None = None
    localization_replays: int | None = None
    claim: str | None = None
    localization_test: str | None = None
    obstacle: str | None = None
    proposals: int | None = None
    oracle_confirms: bool | None = None
    """A method that never saw the answer, judged by it: does the oracle confirm the answer it verified?"""
    llm_calls: int = 0
    """The auditor's requests (the agent's, on the same model, are ``agent_calls``)."""
    agent_calls: int | None = None
    tokens: int = 0
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    seconds: float = 0.0
    failed: bool = False
    errors: tuple[str, ...] = ()
    record: dict[str, Any] | None = None
    """The attribution record as the code that ran dumped it."""

    @property
    def flip(self) -> bool:
        """Whether an intervention replay answered right, under either name a row used for it."""
        if self.flipped is not None:
            return self.flipped
        return bool((self.model_extra or {}).get("corrected"))


class LiveRow(BaseModel):
    """One agent run on one question, and the methods that attributed it when its answer was wrong."""

    model_config = _ROW

    question_id: str
    question: str = ""
    expected: str = ""
    answer: str = ""
    correct: bool | None
    """None: the answer was undecided (it names several values without saying which it asserts), neither right nor
    a failed run."""
    judgement: Judgement | None = None
    agent_steps: int = 0
    agent_seconds: float = 0.0
    methods: dict[str, MethodRow] = {}
    trace: dict[str, Any] | None = None
    """The run's trace (right runs too: labelled data for the verifiers)."""
    method_order: tuple[str, ...] | None = None
    """The methods in the order they ran on this failure (a resume appends the rest); None on right runs and on rows
    made before orders were recorded."""

    @property
    def failed(self) -> bool:
        """A failed run: its answer judged wrong (an undecided one is not)."""
        return self.correct is False

    def with_method(self, name: str, method: MethodRow) -> LiveRow:
        """This row with ``name``'s attribution added, and ``name`` appended to the order where the row keeps one.
        A row with no method yet starts its order here: a failure stored before its first method finished (a stop
        in between) has none, and its resumed methods are its whole order."""
        update: dict[str, Any] = {"methods": {**self.methods, name: method}}
        if self.method_order is not None or not self.methods:
            update["method_order"] = (*(self.method_order or ()), name)
        return self.model_copy(update=update)

    def line(self) -> dict[str, Any]:
        """The row as a JSON object, with the fields it was given (and the keys it was read with) only."""
        return self.model_dump(mode="json", exclude_unset=True)


def read_live_rows(path: Path, *, mend: bool = True) -> dict[str, LiveRow]:
    """The last row of each question in ``path`` (none when it does not exist), typed; ``mend`` as for
    :func:`~benchmarks.evaluation.runner.read_done`. :class:`InputError` naming the question when a row is not one
    this harness wrote."""
    return {key: parse_live_row(key, row) for key, row in read_done(path, key="question_id", mend=mend).items()}


def parse_live_row(key: str, row: dict[str, Any]) -> LiveRow:
    """``row`` as a :class:`LiveRow`; :class:`InputError` naming ``key`` when it is not one."""
    try:
        return LiveRow.model_validate(row)
    except ValidationError as error:
        detail = json.dumps(error.errors(include_url=False, include_input=False)[:3], default=str)
        raise InputError(f"results row {key}: not a wtq-live row ({detail})") from None
