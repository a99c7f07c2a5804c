"""What the run was asked and what it answered.

The question is the root's input when it states one, else the first AGENT span's, else the first user message a
model saw, else the root's input as it is (a workflow's state object names no question; the raw value is kept in
the metadata). The answer is the root's output, else the first AGENT span's, else the final-answer step's text (its
result, for a run that stopped at a tool).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from reflect_otel import _values
from reflect_otel.reading.semconv import OPENAI_AGENTS_SCOPE, ReflectAttributes, SpanAttributes
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, Step

from .scrub import Scrubber, TextRules
from .tree import AGENT, SpanTree

__all__ = ["RunEnd", "RunTexts", "run_end", "run_texts"]

_RAW_VALUE_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class RunTexts:
    question: str
    answer: str | None
    metadata: dict[str, str]
    """The root's raw input and output when the question or answer was taken out of them, and the expected answer
    the agent recorded (``reflect.expected_answer``)."""
    secrets: int


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How the run ended, for the final-step pass (:func:`.steps.mark_final_answer`)."""

    outputs: tuple[str, ...]
    """The run's output as the root and the first AGENT span recorded it (their answer texts, cleaned like tool
    arguments): what the call that ended the run must carry to be its answer. Their secrets are counted once, by
    :func:`run_texts`."""
    answered_at_ns: int | None
    """When the first AGENT span ended, when its output is the run's answer (the root records none): model turns
    after it are not the agent's (a harness that restates the agent's answer, as TRAIL's GAIA runs do). None when
    the whole trace is the run."""
    agent_outputs: Mapping[str, str]
    """Each AGENT span's answer text by span id (cleaned like tool arguments, not counted): what an agent's last
    call must carry to hand its answer back (:func:`.steps.mark_handed_back`)."""
    stops_at_tools: bool = False
    """The run was recorded by the OpenAI Agents SDK's instrumentation and none of its agents ended in error: a last
    call it answered, with no model turn after, then ended the run with its result as the answer. That SDK's loop
    asks the model again after every tool result unless the agent's ``tool_use_behavior`` (``"stop_on_first_tool"``,
    ``StopAtTools``, a function) stops it there, and a run it stops otherwise (``MaxTurnsExceeded``, a tool that
    raised) marks the agent span with an error. Nothing in its spans names the behaviour, and no span records the
    run's output, so this is the one signal there is (:func:`.steps.mark_final_answer`). Known limit: a streamed run
    cancelled after a turn (``cancel(mode="after_turn")``) ends the same way, unmarked, and reads as a stop at its
    last tool; a run with no agent span at all (a process killed mid-run) does not."""


def run_end(tree: SpanTree, rules: TextRules) -> RunEnd:
    uncounted = rules.scrubber()
    root = _values.answer_text(tree.root.attributes.get(SpanAttributes.OUTPUT_VALUE))
    agent = tree.first_agent
    if agent is not None and agent.span_id == tree.root.span_id:
        agent = None
    answer = _values.answer_text(agent.attributes.get(SpanAttributes.OUTPUT_VALUE)) if agent is not None else ""
    outputs = tuple(uncounted.clean(text) for text in (root, answer) if text)
    agents = {}
    for placed in tree.order:
        if placed.kind == AGENT and placed.span.span_id not in agents:
            text = _values.answer_text(placed.span.attributes.get(SpanAttributes.OUTPUT_VALUE))
            agents[placed.span.span_id] = uncounted.clean(text) if text else ""
    agent_outputs = MappingProxyType({span_id: text for span_id, text in agents.items() if text})
    answered_at = agent.end_ns if agent is not None and answer and not root else None
    return RunEnd(outputs, answered_at, agent_outputs, _stops_at_tools(tree))


def _stops_at_tools(tree: SpanTree) -> bool:
    """An Agents SDK run whose agents all ended without error: at least one agent span must be there (a process
    killed mid-run exports its tool spans but never its agent span, and must not read as a stop at a tool)."""
    if not any(s.scope == OPENAI_AGENTS_SCOPE for s in tree.spans.values()):
        return False
    agents = [p.span for p in tree.order if p.kind == AGENT]
    return bool(agents) and not any(a.status == "error" or a.end_ns is None for a in agents)


def run_texts(
    tree: SpanTree, steps: tuple[Step, ...], user_text: str, rules: TextRules, *, answer_is_result: bool = False
) -> RunTexts:
    """``user_text``: the first user message a model saw ("" when none). With ``answer_is_result`` (a run that
    stops at a tool, :attr:`RunEnd.stops_at_tools`), a final call's answer is what it returned."""
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
    answer = scrubber.clean(answer) if answer else _answer_of_steps(steps, scrubber, answer_is_result)
    raw = {
        "raw_input": _raw(root.get(SpanAttributes.INPUT_VALUE), question),
        "raw_output": _raw(root.get(SpanAttributes.OUTPUT_VALUE), answer),
        EXPECTED_ANSWER_FIELD: scrubber.text(root.get(ReflectAttributes.EXPECTED_ANSWER)),
    }
    # the raw values hold the question's and answer's own secrets, counted there: cleaned here, not counted again
    uncounted = rules.scrubber()
    metadata = {key: uncounted.text(value) for key, value in raw.items() if value}
    return RunTexts(question=question, answer=answer or None, metadata=metadata, secrets=scrubber.secrets)


def _answer_of_steps(steps: tuple[Step, ...], scrubber: Scrubber, answer_is_result: bool) -> str | None:
    """The final-answer step's answer: the answer argument of the call that ended the run (its result, when the run
    stopped at it), or the reply's text."""
    final = next((s for s in reversed(steps) if s.is_final_answer), None)
    if final is None:
        return None
    if final.tool_name and answer_is_result and final.tool_result is not None:
        return final.tool_result  # cleaned with the step
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
