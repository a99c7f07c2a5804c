"""Public annotated datasets as :class:`StructuredTrace` s with their human labels.

BIG-Bench Mistake rows (``input``, ``steps``, ``answer``, ``target``, ``mistake_index``) become chain-of-thought
traces: one reasoning step per listed step, the last one the final answer; ``mistake_index`` is 0-based and
becomes the 1-based ``step_index`` of an :class:`ErrorLabel`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reflect_otel.errors import InputError
from reflect_otel.flagging.judge import answer_value, listed_options
from reflect_otel.flagging.verifiers import extract_answer
from reflect_otel.trace import ErrorLabel, Step, StepKind, StructuredTrace, TraceSource
from reflect_otel.verdict import Verdict

__all__ = ["BBM_TASKS", "BBMVerifier", "DatasetItem", "bbm_item", "extract_bbm_answer", "is_bbm_row", "read_bbm"]

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


# -- the verifier -------------------------------------------------------------------------------------------
_CHOICE = re.compile(r"\(([A-Z])\)")
_BRACKETS = re.compile(r"[\[\](){}<>]")
_SIGNED_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")


def extract_bbm_answer(text: str | None, *, target: str, question: str = "") -> str | None:
    """A BIG-Bench-Mistake answer in the form of ``target``: ``(C)``, a number, a bracket sequence, or words.

    Read in ``question``'s terms where an answer names its content rather than its form: an option's text for its
    label, where the question lists options as ``(C) text`` lines and exactly one option's text and the answer
    contain one another ("the orange ball" is ``(C) orange ball.``; "ball" names none); and a bracket sequence that
    repeats the question's own sequence before going on, for what it adds (the completion asked for)."""
    stated = extract_answer(text)
    if stated is None:
        return None
    if _CHOICE.fullmatch(target.strip()):
        choices = _CHOICE.findall(stated)
        if choices:
            return f"({choices[-1]})"
        bare = re.fullmatch(r"\(?([A-Z])\)?", stated.strip())
        if bare:
            return f"({bare.group(1)})"
        named = _named_option(stated, question)
        return f"({named})" if named else None
    if _number(target) is not None:
        numbers = _SIGNED_NUMBER.findall(stated.replace(",", ""))
        return numbers[-1] if numbers else None
    if target.strip() and not _BRACKETS.sub("", target).strip():
        brackets, given = _BRACKETS.findall(stated), _BRACKETS.findall(question)
        if given and len(brackets) > len(given) and brackets[: len(given)] == given:
            brackets = brackets[len(given) :]  # the whole sequence written out: what it adds is the answer
        return " ".join(brackets) or None
    return _words(stated) or None


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^\w'\s-]", " ", text.lower()).split())


def _named_option(stated: str, question: str) -> str | None:
    """The label of the one option of ``question`` whose text and ``stated`` contain one another as whole words."""
    said = _words(stated)
    if not said:
        return None
    named = set()
    for label, text in listed_options(question).items():
        option = _words(text)
        if option and (f" {option} " in f" {said} " or f" {said} " in f" {option} "):
            named.add(label)
    return named.pop() if len(named) == 1 else None


class BBMVerifier:
    """BIG-Bench-Mistake: extract in the target's form (:func:`extract_bbm_answer`, read in the question's terms),
    then compare case-insensitively. Word order matters (word sorting is about order)."""

    name = "bbm"

    def verify(self, trace: StructuredTrace, *, expected: str | None) -> Verdict:
        if expected is None:
            return Verdict(verifier=self.name, is_correct=None, confidence=0.0, reasoning="no target answer")
        extracted = extract_bbm_answer(trace.final_answer, target=expected, question=trace.question)
        if extracted is None:
            return Verdict(verifier=self.name, is_correct=False, reasoning="no answer in the target's form")
        if _number(expected) is not None:
            correct = _number(extracted) == _number(expected)
        else:
            correct = " ".join(extracted.lower().split()) == " ".join(expected.lower().split())
        return Verdict(verifier=self.name, is_correct=correct, extracted_answer=extracted)


def _number(text: str) -> float | None:
    return answer_value(text).number
