"""Run as a script: a plain OpenAI tool loop (tools run without spans of their own) under OpenLLMetry's OpenAI
instrumentation, against a scripted server on loopback. Prints the run as reflect-otel rebuilt it and the raw
spans as OTLP/JSON. A separate process because OpenLLMetry's instrumentor leaves patches behind after
``uninstrument``."""

from __future__ import annotations

import json
import os
from typing import Any


def main() -> None:
    import openai
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
    from tests.frameworks.script import IMPLEMENTATIONS, QUESTION, SCRIPT, TOOLS, assistant_turns
    from tests.frameworks.tracing import Traced

    os.environ["TRACELOOP_TRACE_CONTENT"] = "true"

    def turn(body: dict[str, Any]) -> ScriptedTurn:
        return SCRIPT[assistant_turns(body)]

    traced = Traced()
    OpenAIInstrumentor().instrument(tracer_provider=traced.provider)
    with ScriptedOpenAIServer(turn) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test")
        with traced.provider.get_tracer("app").start_as_current_span("calculator"):
            messages: list[Any] = [{"role": "user", "content": QUESTION}]
            while True:
                reply = client.chat.completions.create(model="scripted-model", messages=messages, tools=TOOLS)
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    result = IMPLEMENTATIONS[call.function.name](**json.loads(call.function.arguments))
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    traced.print_run(message.content)


if __name__ == "__main__":
    main()
