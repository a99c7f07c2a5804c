"""AutoGen AgentChat: an ``AssistantAgent`` with two function tools and AutoGen's OpenAI chat-completion client
against a scripted server on loopback, under OpenInference's AgentChat instrumentor, in the frameworks' own
environment; with the OpenAI client's instrumentor too, and alone. AutoGen's model span keeps the model's words
apart from its calls (its ``CreateResult.thought``): they are read from the client's span nested in it, or from the
result object when there is no such span. The run is rebuilt exactly, live and from the same spans as OTLP/JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflect_otel.trace import StructuredTrace
from tests.frameworks.script import ANSWER, QUESTION, STEPS, steps_of
from tests.frameworks.tracing import run_app, same_trace_from_otlp_json

pytestmark = [pytest.mark.frameworks, pytest.mark.slow]


@pytest.mark.parametrize("kind", ["openinference", "openinference-alone"])
def test_autogen_assistant_agent(kind: str, tmp_path: Path, openai2_python: Path) -> None:
    run = run_app("tests.frameworks.autogen_app", kind, python=openai2_python)
    assert run["answer"] == ANSWER
    (trace,) = [StructuredTrace.model_validate(t) for t in run["traces"]]
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert steps_of(trace) == STEPS
    # each model call counted once, though two spans record it when the client is instrumented too
    assert [s.prompt_tokens for s in trace.steps] == [50, 50, 50] and len(run["requests"]) == 3
    assert not trace.warnings, trace.warnings
    same_trace_from_otlp_json(run["otlp"], trace, tmp_path)
