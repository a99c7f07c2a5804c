"""What the run was asked and what it answered.

The question is the root's input when it states one, else the first AGENT span's, else the first user message a
model saw, else the root's input as it is (a workflow's state object names no question; the raw value is kept in
the metadata). The answer is the root's output, else the first AGENT span's, else the final-answer step's text.
"""

from __future__ import annotations

from dataclasses import dataclass

from reflect_otel import _values
from reflect_otel.semconv import ReflectAttributes, SpanAttributes
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, Step

from .scrub import Scrubber, TextRules
from .tree import SpanTree

__all__ = ["RunTexts", "run_outputs", "run_texts"]

_RAW_VALUE_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class RunTexts:
    question: str
    answer: str | None
    metadata: dict[str, str]
    """The root's raw input and output when the question or answer was taken out of them, and the expected answer
    the agent recorded (``reflect.expected_answer``)."""
    secrets: int


def run_outputs(tree: SpanTree, rules: TextRules) -> tuple[str, ...]:
    """The run's output as the root and the first AGENT span recorded it (their answer texts, cleaned like tool
    arguments): what the call that ended the run must carry to be its answer (:func:`.steps.mark_final_answer`).
    Their secrets are counted once, by :func:`run_texts`."""
    uncounted = rules.scrubber()
    spans = (tree.root, tree.first_agent)
    texts = (_values.answer_text(s.attributes.get(SpanAttributes.OUTPUT_VALUE)) for s in spans if s is not None)
    return tuple(uncounted.clean(text) for text in texts if text)


def run_texts(tree: SpanTree, steps: tuple[Step, ...], user_text: str, rules: TextRules) -> RunTexts:
    """``user_text``: the first user message a model saw ("" when none)."""
    scrubber = rules.scrubber()
    root = tree.root.attributes
    agent = tree.first_agent
    question = _values.question_text(root.get(SpanAttributes.INPUT_VALUE), whole=False)
    if not question and agent is not None:
        question = _values.question_text(agent.attributes.get(SpanAttributes.INPUT_VALUE), whole=False)
    question = question or user_text
    if not question:
        question = _values.question_text(root.get(SpanAttributes.INPUT_VALUE))
    question = scrubber.text(question)
    answer: str | None = _values.answer_text(root.get(SpanAttributes.OUTPUT_VALUE))
    if not answer and agent is not None:
        answer = _values.answer_text(agent.attributes.get(SpanAttributes.OUTPUT_VALUE))
    answer = scrubber.clean(answer) if answer else _answer_of_steps(steps, scrubber)
    raw = {
        "raw_input": _raw(root.get(SpanAttributes.INPUT_VALUE), question),
        "raw_output": _raw(root.get(SpanAttributes.OUTPUT_VALUE), answer),
        EXPECTED_ANSWER_FIELD: scrubber.text(root.get(ReflectAttributes.EXPECTED_ANSWER)),
    }
    # the raw values hold the question's and answer's own secrets, counted there: cleaned here, not counted again
    uncounted = rules.scrubber()
    metadata = {key: uncounted.text(value) for key, value in raw.items() if value}
    return RunTexts(question=question, answer=answer or None, metadata=metadata, secrets=scrubber.secrets)


def _answer_of_steps(steps: tuple[Step, ...], scrubber: Scrubber) -> str | None:
    """The final-answer step's answer: the answer argument of the call that ended the run, or the reply's text."""
    final = next((s for s in reversed(steps) if s.is_final_answer), None)
    if final is None:
        return None
    if final.tool_name:
        args = final.tool_args
        value = args.get("answer", args.get("input", args.get("args", args)))
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        return scrubber.text(value)
    return final.reasoning


def _raw(value: object, extracted: str | None) -> str | None:
    """The root's raw input or output value when the question or answer was extracted from it (JSON, a repr), cut
    short; None when it is the text itself."""
    if not isinstance(value, str) or value == extracted:
        return None
    return _values.truncate(value, _RAW_VALUE_CHARS)
