"""Run as a script, in the frameworks' own environment (Google ADK needs an older OpenTelemetry SDK): an ADK
``LlmAgent`` with two function tools against a scripted Gemini API server on loopback, traced by OpenInference's
ADK and google-genai instrumentors (``openinference``) or by ADK's own GenAI spans with message content captured (``genai``) or not
(``genai-no-content``); ``openinference-alone`` is the ADK instrumentor without the instrumentor of the model client
ADK calls (google-genai). Prints the run as reflect-otel rebuilt it and the raw spans as OTLP/JSON."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The OTel GenAI variable ADK reads: ``SPAN_ONLY`` puts the messages on the spans (``true`` sends them to log events
only, which a trace does not carry)."""


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def main(kind: str) -> None:
    os.environ[CAPTURE] = "NO_CONTENT" if kind == "genai-no-content" else "SPAN_ONLY"
    from opentelemetry import trace

    from reflect_otel.testing.gemini_server import ScriptedGeminiServer, gemini_turns
    from reflect_otel.testing.openai_server import ScriptedTurn
    from tests.frameworks.script import QUESTION, SCRIPT
    from tests.frameworks.tracing import Traced

    traced = Traced()
    if kind.startswith("openinference"):  # as OpenInference documents it: the instrumentors given the provider
        from openinference.instrumentation.google_adk import GoogleADKInstrumentor

        GoogleADKInstrumentor().instrument(tracer_provider=traced.provider)
        if kind == "openinference":
            from openinference.instrumentation.google_genai import GoogleGenAIInstrumentor

            GoogleGenAIInstrumentor().instrument(tracer_provider=traced.provider)
    else:
        trace.set_tracer_provider(traced.provider)  # ADK's own spans go to the global provider

    from google.adk.agents import LlmAgent
    from google.adk.models import Gemini
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    def turn(body: dict[str, Any]) -> ScriptedTurn:
        return SCRIPT[gemini_turns(body)]

    with ScriptedGeminiServer(turn) as server:
        os.environ["GOOGLE_API_KEY"] = "test"
        agent = LlmAgent(
            name="calculator",
            model=Gemini(model="scripted-gemini", base_url=server.base_url),
            instruction="Compute.",
            tools=[multiply, add],
        )
        runner = InMemoryRunner(agent=agent, app_name="calculator-app")

        async def run() -> str:
            session = await runner.session_service.create_session(app_name="calculator-app", user_id="user")
            answer = ""
            message = types.Content(role="user", parts=[types.Part(text=QUESTION)])
            async for event in runner.run_async(user_id="user", session_id=session.id, new_message=message):
                if event.is_final_response() and event.content and event.content.parts:
                    answer = "".join(p.text or "" for p in event.content.parts)
            return answer

        answer = asyncio.run(run())
    traced.print_run(answer, requests=server.requests)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "openinference")
