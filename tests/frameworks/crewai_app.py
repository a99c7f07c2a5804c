"""Run as a script, in the environment the ``llamaindex`` and ``crewai`` extras share (both need ``openai<3``, the
other frameworks ``openai>=3``): a one-agent CrewAI crew with its real OpenInference instrumentation (CrewAI's,
and the OpenAI client's for the model calls, as OpenInference documents for CrewAI) against a scripted server on
loopback. Prints the run as reflect-otel rebuilt it, the raw spans as OTLP/JSON and the model's requests."""

from __future__ import annotations

import os
import sys
from typing import Any


def main(kind: str) -> None:
    """``kind``: ``with-openai`` (CrewAI's instrumentor and the OpenAI client's) or ``alone`` (CrewAI's only)."""
    # CrewAI's own telemetry and tracing would phone home: off, as a user without network would set them
    os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
    os.environ["CREWAI_TRACING_ENABLED"] = "false"
    from crewai import LLM, Agent, Crew, Task
    from crewai.tools import tool
    from openinference.instrumentation.crewai import CrewAIInstrumentor
    from openinference.instrumentation.openai import OpenAIInstrumentor

    from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
    from tests.frameworks.script import QUESTION, SCRIPT, assistant_turns
    from tests.frameworks.tracing import Traced

    @tool("multiply")
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @tool("add")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def turn(body: dict[str, Any]) -> ScriptedTurn:
        return SCRIPT[assistant_turns(body)]

    traced = Traced()
    CrewAIInstrumentor().instrument(tracer_provider=traced.provider)
    if kind == "with-openai":
        OpenAIInstrumentor().instrument(tracer_provider=traced.provider)
    with ScriptedOpenAIServer(turn) as server:
        llm = LLM(model="gpt-4o-mini", base_url=server.base_url, api_key="test", max_retries=0)
        agent = Agent(role="Calculator", goal="Compute exactly.", backstory="Careful.", tools=[multiply, add], llm=llm)
        task = Task(description=QUESTION, expected_output="The number.", agent=agent)
        output = Crew(agents=[agent], tasks=[task]).kickoff()
        requests = list(server.requests)
    traced.print_run(output.raw, requests=requests)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "with-openai")
