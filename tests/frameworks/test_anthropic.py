"""The Anthropic SDK's own tool loop (a system prompt outside the messages, ``tool_use`` blocks out and
``tool_result`` blocks back in a user turn; the tools have no spans of their own) under OpenInference's Anthropic
instrumentation, against a scripted Messages API server on loopback, streaming and not. The run is rebuilt exactly,
live and from the same spans as OTLP/JSON (imported and received)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reflect_otel.testing.anthropic_server import ScriptedAnthropicServer, anthropic_turns
from tests.frameworks.script import ANSWER, IMPLEMENTATIONS, QUESTION, SCRIPT, STEPS, steps_of
from tests.frameworks.script import TOOLS as OPENAI_TOOLS
from tests.frameworks.tracing import Traced, instrumented_by, same_trace_from_otlp_file

pytestmark = pytest.mark.frameworks
pytest.importorskip("anthropic")

TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in OPENAI_TOOLS
]


def _tool_loop(traced: Traced, base_url: str, *, stream: bool) -> str:
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="test", max_retries=0)
    request: dict[str, Any] = {"model": "scripted-claude", "max_tokens": 256, "system": "Compute.", "tools": TOOLS}
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    with traced.provider.get_tracer("app").start_as_current_span("calculator"):
        while True:
            if stream:
                with client.messages.stream(messages=messages, **request) as events:
                    reply = events.get_final_message()
            else:
                reply = client.messages.create(messages=messages, **request)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                return "".join(b.text for b in reply.content if b.type == "text")
            results = [
                {"type": "tool_result", "tool_use_id": u.id, "content": str(IMPLEMENTATIONS[u.name](**u.input))}
                for u in uses
            ]
            messages.append({"role": "user", "content": results})


@pytest.mark.parametrize("stream", [False, True], ids=["messages.create", "messages.stream"])
def test_anthropic_sdk_tool_loop(stream: bool, tmp_path: Path) -> None:
    from openinference.instrumentation.anthropic import AnthropicInstrumentor

    with instrumented_by(AnthropicInstrumentor()) as traced:
        with ScriptedAnthropicServer(lambda body: SCRIPT[anthropic_turns(body)]) as server:
            assert _tool_loop(traced, server.base_url, stream=stream) == ANSWER
        traced.provider.force_flush()
        (trace,) = traced.traces
        assert (trace.question, trace.final_answer) == (QUESTION, ANSWER)
        assert steps_of(trace) == STEPS
        assert trace.steps[0].model_name == "scripted-claude" and trace.steps[0].prompt_tokens == 50
        assert [t.name for t in trace.tools] == ["multiply", "add"]  # the tools the model was offered
        assert not trace.warnings, trace.warnings
        assert server.requests[0]["system"] == "Compute."
        same_trace_from_otlp_file(traced, trace, tmp_path)
