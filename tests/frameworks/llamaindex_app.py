"""Run as a script, in an environment with the ``llamaindex`` extra (LlamaIndex needs ``openai<3``, the other
frameworks ``openai>=3``, so it cannot share their environment): a LlamaIndex ``FunctionAgent`` with its real
OpenInference instrumentation against a scripted server on loopback. Prints the run as reflect-otel rebuilt it and
the raw spans as OTLP/JSON."""

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


REACT = [
    'Thought: I multiply first.\nAction: multiply\nAction Input: {"a": 17, "b": 23}',
    'Thought: Now add 5.\nAction: add\nAction Input: {"a": 391, "b": 5}',
    "Thought: I can answer without using any more tools.\nAnswer: The answer is 396.",
]
"""The same run as a ReAct agent writes it: tool calls in the reply's text, parsed by the framework."""


def main(kind: str) -> None:
    from llama_index.core.agent.workflow import FunctionAgent, ReActAgent
    from llama_index.llms.openai import OpenAI
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
    from tests.frameworks.script import QUESTION, SCRIPT, assistant_turns
    from tests.frameworks.tracing import Traced

    def turn(body: dict[str, Any]) -> ScriptedTurn:
        if kind == "react":
            return ScriptedTurn(REACT[assistant_turns(body)])
        return SCRIPT[assistant_turns(body)]

    traced = Traced()
    LlamaIndexInstrumentor().instrument(tracer_provider=traced.provider)
    with ScriptedOpenAIServer(turn) as server:
        # a model name LlamaIndex knows (it looks up the context window); the scripted server answers for any
        llm = OpenAI(model="gpt-4o-mini", api_base=server.base_url, api_key="test", max_retries=0)
        agent: Any = (
            ReActAgent(tools=[multiply, add], llm=llm, system_prompt="Compute.")
            if kind == "react"
            else FunctionAgent(tools=[multiply, add], llm=llm, system_prompt="Compute.")
        )

        async def run() -> str:
            return str(await agent.run(user_msg=QUESTION))

        answer = asyncio.run(run())
    traced.print_run(answer)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "function")
