"""Run as a script: the plain OpenAI tool loop of ``tests.agents`` instrumented only by the official OTel GenAI
instrumentation (``opentelemetry-instrumentation-openai-v2``, latest experimental conventions, content on spans),
with the tools traced by the application as ``execute_tool`` spans per the GenAI conventions. Prints the trace our
span processor assembled, and the raw spans as OTLP/JSON, as one JSON document.

A separate process because that instrumentor patches the ``openai`` client globally, as OpenInference's does in
the test session."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "span_only"


def main() -> None:
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

    from reflect_otel.collectors.span_processor import ReflectSpanProcessor
    from tests.agents import QUESTION, TOOLS_SCHEMA, add, lookup_population, otlp_json, scripted_openai_client

    traces: list[Any] = []
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(ReflectSpanProcessor(traces.append))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("genai-app")
    client = scripted_openai_client()
    functions = {"lookup_population": lookup_population, "add": add}
    with tracer.start_as_current_span(
        "invoke_agent population_agent",
        attributes={
            gen_ai.GEN_AI_OPERATION_NAME: "invoke_agent",
            gen_ai.GEN_AI_AGENT_NAME: "population_agent",
            gen_ai.GEN_AI_CONVERSATION_ID: "conversation-1",
            gen_ai.GEN_AI_INPUT_MESSAGES: json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]
            ),
        },
    ) as root:
        messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        while True:
            reply = client.chat.completions.create(model="scripted-model", messages=messages, tools=TOOLS_SCHEMA)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                with tracer.start_as_current_span(
                    f"execute_tool {call.function.name}",
                    attributes={
                        gen_ai.GEN_AI_OPERATION_NAME: "execute_tool",
                        gen_ai.GEN_AI_TOOL_NAME: call.function.name,
                        gen_ai.GEN_AI_TOOL_CALL_ID: call.id,
                        gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS: call.function.arguments,
                    },
                ) as span:
                    result = str(functions[call.function.name](**json.loads(call.function.arguments)))
                    span.set_attribute(gen_ai.GEN_AI_TOOL_CALL_RESULT, result)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        answer = message.content or ""
        root.set_attribute(
            gen_ai.GEN_AI_OUTPUT_MESSAGES,
            json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": answer}], "finish_reason": "stop"}]
            ),
        )
    provider.force_flush()
    provider.shutdown()
    json.dump(
        {"traces": [t.model_dump(mode="json") for t in traces], "otlp": otlp_json(exporter.get_finished_spans())},
        sys.stdout,
    )


if __name__ == "__main__":
    main()
