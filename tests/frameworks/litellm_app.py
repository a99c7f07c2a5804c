"""Run as a script, in the frameworks' own environment (LiteLLM needs ``openai<3``): a plain tool loop that calls
every model through ``litellm.completion`` (its tools run without spans of their own), under OpenInference's LiteLLM
instrumentation, against a scripted server on loopback that speaks the routed provider's API: ``openai`` (an
OpenAI-compatible server) or ``anthropic`` (the Messages API). Prints the run as reflect-otel rebuilt it and the raw
spans as OTLP/JSON."""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main(provider: str) -> None:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # its bundled price list, not a download at import
    import litellm
    from openinference.instrumentation.litellm import LiteLLMInstrumentor

    from reflect_otel.testing.anthropic_server import ScriptedAnthropicServer, anthropic_turns
    from reflect_otel.testing.openai_server import ScriptedOpenAIServer
    from tests.frameworks.script import IMPLEMENTATIONS, QUESTION, SCRIPT, TOOLS, assistant_turns
    from tests.frameworks.tracing import Traced

    litellm.suppress_debug_info = True  # it prints hints to stdout, where this script prints its result
    traced = Traced()
    LiteLLMInstrumentor().instrument(tracer_provider=traced.provider)
    server: Any = (
        ScriptedAnthropicServer(lambda body: SCRIPT[anthropic_turns(body)])
        if provider == "anthropic"
        else ScriptedOpenAIServer(lambda body: SCRIPT[assistant_turns(body)])
    )
    model = "anthropic/scripted-claude" if provider == "anthropic" else "openai/scripted-model"
    with server, traced.provider.get_tracer("app").start_as_current_span("calculator"):
        messages: list[Any] = [{"role": "system", "content": "Compute."}, {"role": "user", "content": QUESTION}]
        while True:
            reply = litellm.completion(
                model=model, messages=messages, tools=TOOLS, api_base=server.base_url, api_key="test", max_tokens=256
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                result = IMPLEMENTATIONS[call.function.name](**json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    traced.print_run(message.content, requests=server.requests)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "openai")
