"""What the run was asked and what it answered, and the raw values they were taken from."""

from __future__ import annotations

import json

from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.assembly.question import RunEnd, RunTexts, run_end, run_texts
from reflect_otel.reading.assembly.tree import SpanTree
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.trace import Step, StepKind
from tests.assembly.recorded import SMOLAGENTS_CODE, recorded_spans, rules
from tests.spans import agent_root, span

_FINAL = Step(index=1, span_id="00000000000000c1", kind=StepKind.FINAL_ANSWER, is_final_answer=True, reasoning="42")


def _texts(spans: list[SpanRecord], steps: tuple[Step, ...] = (), user_text: str = "") -> RunTexts:
    return run_texts(SpanTree.of(spans), steps, user_text, rules())


def test_a_recorded_code_agents_question_and_answer() -> None:
    texts = _texts(recorded_spans(SMOLAGENTS_CODE))
    assert (texts.question, texts.answer) == ("What is 17 times 23, plus 5?", "The answer is 396.")


def test_the_roots_messages_state_the_question_and_the_raw_value_is_kept() -> None:
    raw = json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]})
    texts = _texts([agent_root(raw, "4")])
    assert (texts.question, texts.answer, texts.metadata) == ("2+2?", "4", {"raw_input": raw})


def test_a_workflow_state_names_no_question_so_the_agent_span_or_the_model_is_asked() -> None:
    root = span("CHAIN", name="workflow", **{"input.value": json.dumps({"step": 3, "cursor": "x"})})
    agent = span("AGENT", parent=root.span_id, start=1, **{"input.value": "Plan the trip"})
    assert _texts([root, agent]).question == "Plan the trip"
    assert _texts([root], user_text="Ask the model").question == "Ask the model"
    assert _texts([root]).question == json.dumps({"step": 3, "cursor": "x"})  # the state itself, as a last resort


def test_without_an_output_the_final_answer_step_answers() -> None:
    assert _texts([agent_root("q")], steps=(_FINAL,)).answer == "42"
    tool_answer = _FINAL.model_copy(update={"tool_name": "final_answer", "tool_args": {"answer": ["396"]}})
    assert _texts([agent_root("q")], steps=(tool_answer,)).answer == "396"
    assert _texts([agent_root("q")]).answer is None


def test_the_expected_answer_the_agent_recorded_is_kept() -> None:
    root = span("AGENT", **{"input.value": "q", "reflect.expected_answer": "396"})
    assert _texts([root]).metadata == {"expected_answer": "396"}


def test_a_secret_in_the_question_is_counted_once_though_the_raw_input_holds_it_too() -> None:
    key = "sk-" + "Z" * 24
    raw = json.dumps({"question": f"use {key}"})
    texts = _texts([agent_root(raw, f"done with {key}")])
    assert texts.question == "use [REDACTED:api_key]" and texts.answer == "done with [REDACTED:api_key]"
    assert key not in texts.metadata["raw_input"] and texts.secrets == 2
    (warning,) = [w for w in assemble_trace([agent_root(raw)]).warnings if w.code.value == "secrets_redacted"]
    assert warning.message.startswith("1 secret(s)")


def test_the_run_ends_where_the_answer_was_given() -> None:
    """The root's answer: the whole trace is the run. Only an agent's (a harness around it answers nothing): the
    run's end is when that agent returned, and its output, cleaned like tool arguments, is what ended it."""
    key = "sk-" + "Q" * 24
    harness = span("CHAIN", name="main", end=100)
    agent = span("AGENT", parent=harness.span_id, start=1, end=40, **{"output.value": f"33149 {key}"})
    redacted = "33149 [REDACTED:api_key]"
    assert run_end(SpanTree.of([harness, agent]), rules()) == RunEnd((redacted,), 40, {agent.span_id: redacted})
    root = agent_root("q", "4")  # the agent is the root
    assert run_end(SpanTree.of([root]), rules()) == RunEnd(("4",), None, {root.span_id: "4"})
    answered = span("CHAIN", name="main", end=100, **{"output.value": "33149"})
    inner = span("AGENT", parent=answered.span_id, start=1, end=40, **{"output.value": "33149"})
    assert run_end(SpanTree.of([answered, inner]), rules()).answered_at_ns is None
    assert run_end(SpanTree.of([harness]), rules()) == RunEnd((), None, {})


def test_every_agent_gives_its_own_answer() -> None:
    """A sub-agent's output is its own answer, what its last call must carry to hand it back; an agent that
    recorded no output gives none."""
    manager = span("AGENT", name="manager", end=100, **{"output.value": "10"})
    helper = span("AGENT", name="helper", parent=manager.span_id, start=1, end=40, **{"output.value": "Top 10: ..."})
    silent = span("AGENT", name="silent", parent=manager.span_id, start=41, end=50)
    ending = run_end(SpanTree.of([manager, helper, silent]), rules())
    assert ending.agent_outputs == {manager.span_id: "10", helper.span_id: "Top 10: ..."}
