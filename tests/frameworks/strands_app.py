"""Run as a script, with Python that has ``strands-agents[openai]`` (Strands needs none of reflect-otel): a Strands
Agents agent with two tools on Strands' OpenAI model provider, against the scripted OpenAI-compatible server at
``BASE_URL``, traced by Strands' own OpenTelemetry tracer (the GenAI conventions). ``latest`` sets
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``: the messages as ``gen_ai.input.messages`` /
``gen_ai.output.messages`` attributes; without it Strands writes them as span events whose content is a list of
Bedrock-style blocks (``{"toolUse": ...}``, ``{"toolResult": ...}``). Prints the answer and the raw spans as
OTLP/JSON, as one JSON object.

    python tests/frameworks/strands_app.py BASE_URL [events|latest]
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

QUESTION = "What is 17 times 23, plus 5?"


def main(base_url: str, form: str) -> None:
    if form == "latest":
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    from google.protobuf.json_format import MessageToDict
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "strands-calculator"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    @tool
    def multiply(a: int, b: int) -> int:
        """multiply two integers"""
        return a * b

    @tool
    def add(a: int, b: int) -> int:
        """add two integers"""
        return a + b

    model = OpenAIModel(client_args={"base_url": base_url, "api_key": "test"}, model_id="scripted-model")
    agent = Agent(
        model=model, tools=[multiply, add], system_prompt="Compute.", name="calculator", callback_handler=None
    )
    result = agent(QUESTION)
    provider.force_flush()
    document: dict[str, Any] = MessageToDict(encode_spans(exporter.get_finished_spans()))
    for resource in document.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    print(json.dumps({"answer": str(result).strip(), "otlp": document}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "events")
