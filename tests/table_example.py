"""The shipped example ``table_agent_nt1.otlp.json``: a run of the real table-QA demo agent (LangGraph, its DuckDB
table tools, the OpenInference LangChain instrumentation) on the bundled question nt-1, its model a scripted
OpenAI-compatible server on loopback that makes the decisions the default model made when we ran the demo: filter
``Position = "1"`` where the table writes ``1st``, then answer from the empty result. The filter's result lists the
values the column holds, so the evidence checks find the failing step with no model.

The run's root span is the agent's, as ``reflect-otel demo-agent`` writes it: kind AGENT, the question, the answer,
and ``reflect.expected_answer``. ``python -m tests.table_example PATH`` writes the file again."""

from __future__ import annotations

import json
import sys
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import format_trace_id

from reflect_otel.reading.semconv import OpenInferenceSpanKindValues, ReflectAttributes, SpanAttributes
from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
from tests.agents import otlp_json

QUESTION_ID = "nt-1"
DECISIONS = (
    {"thought": "Keep the rows where Position is 1.", "action": {"tool": "filter_rows", "table": "t0",
     "column": "Position", "op": "=", "value": "1"}},
    {"thought": "No row has Position 1.", "action": {"tool": "final_answer", "answer": "No 1st place finishes found."}},
)  # fmt: skip


def _turn(body: dict[str, Any]) -> ScriptedTurn:
    """The agent's next decision, by how many tool results its prompt holds."""
    results = sum(1 for m in body.get("messages", []) if str(m.get("content", "")).startswith("Result of "))
    return ScriptedTurn(text=json.dumps(DECISIONS[min(results, len(DECISIONS) - 1)]))


def record(provider: TracerProvider, spans: Any) -> dict[str, Any]:
    """Run the agent once on ``provider`` (which must carry the LangChain instrumentation) and return the OTLP/JSON
    of its run, taken from ``spans()`` (the finished spans of an in-memory exporter on ``provider``)."""
    from reflect_otel.config import LLMConfig
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.demo.wtq import load_questions
    from reflect_otel.llm.openai_compat import OpenAICompatibleLLM

    question = {q.id: q for q in load_questions()}[QUESTION_ID]
    tracer = provider.get_tracer("reflect_otel.demo.remote_agent")
    with ScriptedOpenAIServer(_turn) as server:
        llm = OpenAICompatibleLLM(LLMConfig(base_url=server.base_url, api_key="scripted", model="scripted-model"))
        agent = TableQAAgent(question, llm, max_steps=6)
        attributes = {
            SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
            SpanAttributes.INPUT_VALUE: question.question,
            ReflectAttributes.EXPECTED_ANSWER: question.expected,
        }
        with tracer.start_as_current_span("table_qa", attributes=attributes) as root:
            answer = agent.answer(thread_id=f"example-{QUESTION_ID}")
            root.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
            trace_id = format_trace_id(root.get_span_context().trace_id)
    provider.force_flush()
    ours: list[ReadableSpan] = [s for s in spans() if format_trace_id(s.context.trace_id) == trace_id]
    return otlp_json(ours)


def main(path: str) -> None:
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.sdk.trace import SpanLimits
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=10_000, max_attribute_length=None))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    LangChainInstrumentor().instrument(tracer_provider=provider)
    try:
        document = record(provider, exporter.get_finished_spans)
    finally:
        LangChainInstrumentor().uninstrument()
    with open(path, "w", encoding="utf-8") as file:
        json.dump(document, file, indent=1)
        file.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
