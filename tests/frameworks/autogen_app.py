"""Run as a script, in the frameworks' own environment (AutoGen needs protobuf 5): an AutoGen AgentChat
``AssistantAgent`` with two function tools and an OpenAI chat-completion client against a scripted server on
loopback, traced by OpenInference's AgentChat instrumentor with the OpenAI client's (``openinference``) or alone
(``openinference-alone``). Prints the run as reflect-otel rebuilt it and the raw spans as OTLP/JSON."""

from __future__ import annotations

import asyncio
import sys
from typing import Any


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def main(kind: str) -> None:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient
    from openinference.instrumentation.autogen_agentchat import AutogenAgentChatInstrumentor

    from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
    from tests.frameworks.script import QUESTION, SCRIPT, assistant_turns
    from tests.frameworks.tracing import Traced

    traced = Traced()
    AutogenAgentChatInstrumentor().instrument(tracer_provider=traced.provider)
    if kind == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=traced.provider)

    def turn(body: dict[str, Any]) -> ScriptedTurn:
        return SCRIPT[assistant_turns(body)]

    with ScriptedOpenAIServer(turn) as server:
        client = OpenAIChatCompletionClient(
            model="scripted-model",
            base_url=server.base_url,
            api_key="test",
            model_info={
                "vision": False,
                "function_calling": True,
                "json_output": False,
                "family": "unknown",
                "structured_output": False,
            },
        )
        agent = AssistantAgent(
            "calculator",
            model_client=client,
            tools=[multiply, add],
            system_message="Compute.",
            max_tool_iterations=5,  # call tools until the model answers without one
        )

        async def run() -> str:
            result = await agent.run(task=QUESTION)
            return str(result.messages[-1].content)

        answer = asyncio.run(run())
    traced.print_run(answer, requests=server.requests)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "openinference")
