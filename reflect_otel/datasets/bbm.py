"""Public annotated datasets as :class:`StructuredTrace` s with their human labels.

BIG-Bench Mistake rows (``input``, ``steps``, ``answer``, ``target``, ``mistake_index``) become chain-of-thought
traces: one reasoning step per listed step, the last one the final answer; ``mistake_index`` is 0-based and
becomes the 1-based ``step_index`` of an :class:`ErrorLabel`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reflect_otel.errors import InputError
from reflect_otel.trace import ErrorLabel, Step, StepKind, StructuredTrace, TraceSource

__all__ = ["BBM_TASKS", "DatasetItem", "bbm_item", "is_bbm_row", "read_bbm"]

BBM_TASKS = {
    "word_sorting": "Sort a list of words alphabetically.",
    "tracking_shuffled_objects": "Track objects as people swap them; answer with the option letter.",
    "logical_deduction": "Deduce the order of objects from clues; answer with the option letter.",
    "multistep_arithmetic": "Evaluate a nested arithmetic expression.",
    "dyck_languages": "Complete a sequence so that every bracket is closed in the right order.",
}
_BBM_KEYS = frozenset({"input", "steps", "target"})


@dataclass(frozen=True, slots=True)
class DatasetItem:
    """A trace, its expected answer and a description of its task (the prompts' domain-context slot)."""

    trace: StructuredTrace
    expected: str | None
    task: str
    domain_context: str


def _stable_id(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:32]


def is_bbm_row(row: object) -> bool:
    return isinstance(row, Mapping) and row.keys() >= _BBM_KEYS and isinstance(row.get("steps"), list)


def bbm_item(row: Mapping[str, Any], task: str) -> DatasetItem:
    """One BIG-Bench-Mistake row. Raises :class:`InputError` on a malformed row."""
    if not is_bbm_row(row):
        raise InputError(f"not a BIG-Bench-Mistake row (needs {sorted(_BBM_KEYS)})")
    texts = [str(s) for s in row["steps"]]
    if not texts:
        raise InputError("BIG-Bench-Mistake row has no steps")
    trace_id = _stable_id("bbm", task, str(row["input"]))
    steps = tuple(
        Step(
            index=i,
            span_id=_stable_id(trace_id, str(i))[:16],
            kind=StepKind.FINAL_ANSWER if i == len(texts) else StepKind.REASONING,
            reasoning=text,
            is_final_answer=i == len(texts),
        )
        for i, text in enumerate(texts, start=1)
    )
    mistake = row.get("mistake_index")
    labels: tuple[ErrorLabel, ...] = ()
    if isinstance(mistake, int) and 0 <= mistake < len(texts):
        labels = (ErrorLabel(step_index=mistake + 1, span_id=steps[mistake].span_id, category="reasoning_mistake"),)
    answer = row.get("answer")
    trace = StructuredTrace(
        trace_id=trace_id,
        question=str(row["input"]),
        final_answer=texts[-1]
        if answer is None or "answer is" in texts[-1].lower()
        else f"{texts[-1]}\nSo the answer is {answer}",
        steps=steps,
        source=TraceSource(framework="chain_of_thought", collector="dataset:bbm"),
        metadata={"dataset": "bbm", "task": task},
        labels=labels,
    )
    return DatasetItem(
        trace=trace,
        expected=str(row["target"]),
        task=task,
        domain_context=f"{task}: {BBM_TASKS.get(task, 'a BIG-Bench task')}",
    )


def read_bbm(path: Path) -> Iterator[DatasetItem]:
    """Items of a BIG-Bench-Mistake ``TASK.jsonl`` file; the task is the file's stem."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                yield bbm_item(row, path.stem)
            except (ValueError, InputError) as error:
                raise InputError(f"{path}:{number}: {error}") from None
