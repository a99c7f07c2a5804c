"""Run as a script: an application that traces its LangGraph agent (``ChatOpenAI`` on a scripted server on
loopback) with its own tracer provider and OpenInference's LangChain instrumentation, then adds reflect-otel's
``observe``, which turns on the OpenAI client's instrumentation too: each model call is then recorded twice (the
chat model's span and the client's span, which LangChain does not nest under it). Prints the run as reflect-otel
rebuilt it, the names of the LLM spans in it and its spans as OTLP/JSON. A separate process because instrumentors patch
libraries globally."""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any


def main() -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import reflect_otel
    from reflect_otel.collectors.span_processor import ReflectSpanProcessor
    from reflect_otel.testing import ScriptedLLM
    from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
    from tests.agents import otlp_json
    from tests.frameworks.script import ANSWER, QUESTION, SCRIPT, assistant_turns

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def turn(body: dict[str, Any]) -> ScriptedTurn:
        return SCRIPT[assistant_turns(body)]

    # the application's own tracing
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traces: list[Any] = []
    provider.add_span_processor(ReflectSpanProcessor(traces.append))
    LangChainInstrumentor().instrument(tracer_provider=provider)
    # then reflect-otel, attached to that provider (no model is asked: the answer is right)
    with tempfile.TemporaryDirectory() as folder:
        reflect_otel.configure(store=f"{folder}/app.duckdb", llm=ScriptedLLM(), tracer_provider=provider, proxy=False)
        with ScriptedOpenAIServer(turn) as server:
            agent = create_react_agent(
                ChatOpenAI(model="scripted-model", base_url=server.base_url, api_key="test"), [multiply, add]
            )

            @reflect_otel.observe(name="calculator")
            def ask(question: str) -> str:
                out = agent.invoke({"messages": [("user", question)]})
                return str(out["messages"][-1].content)

            with reflect_otel.expect(ANSWER):
                answer = ask(QUESTION)
        reflect_otel.shutdown()
    provider.force_flush()
    (trace,) = [t for t in traces if t.agent == "calculator"]
    llm_spans = [
        s.name
        for s in exporter.get_finished_spans()
        if format(s.context.trace_id, "032x") == trace.trace_id and s.attributes.get("openinference.span.kind") == "LLM"
    ]
    spans = [s for s in exporter.get_finished_spans() if format(s.context.trace_id, "032x") == trace.trace_id]
    json.dump(
        {"answer": answer, "trace": trace.model_dump(mode="json"), "llm_spans": llm_spans, "otlp": otlp_json(spans)},
        sys.stdout,
    )


if __name__ == "__main__":
    main()
