"""LiteLLM routing a plain tool loop's model calls to a provider, under OpenInference's LiteLLM instrumentation, in
the frameworks' own environment: to an OpenAI-compatible server and to the Anthropic Messages API, each a scripted
server on loopback. OpenInference records the loop's tool messages without the call they answer (no
``tool_call_id``): each is paired with the calls of the assistant turn before it, in order. The run is rebuilt
exactly, live and from the same spans as OTLP/JSON (imported and received)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflect_otel.trace import StructuredTrace
from tests.frameworks.script import ANSWER, QUESTION, STEPS, steps_of
from tests.frameworks.tracing import run_app, same_trace_from_otlp_json

pytestmark = [pytest.mark.frameworks, pytest.mark.slow]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_litellm_tool_loop(provider: str, tmp_path: Path, openai2_python: Path) -> None:
    run = run_app("tests.frameworks.litellm_app", provider, python=openai2_python)
    assert run["answer"] == ANSWER
    (trace,) = [StructuredTrace.model_validate(t) for t in run["traces"]]
    assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
    assert steps_of(trace) == STEPS
    model = "anthropic/scripted-claude" if provider == "anthropic" else "openai/scripted-model"
    assert {s.model_name for s in trace.steps} == {model}
    assert not trace.warnings, trace.warnings
    # the provider's own API was spoken: the Messages API keeps the system prompt out of the messages
    first = run["requests"][0]
    if provider == "anthropic":
        assert first["messages"][0] == {"role": "user", "content": [{"type": "text", "text": QUESTION}]}
        assert first["system"] == [{"type": "text", "text": "Compute."}]
    else:
        assert first["messages"][0] == {"role": "system", "content": "Compute."}
    same_trace_from_otlp_json(run["otlp"], trace, tmp_path)
