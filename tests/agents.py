"""Two small real agents for tests: a LangGraph ReAct graph and a plain OpenAI tool-calling loop.

Both use a deterministic model whose reply depends only on the conversation so far, so runs are repeatable.
The script: look up Paris; then, in one turn, add 1000 to it and look up Rome; then answer.
"""

from __future__ import annotations

import json
from typing import Any

QUESTION = "What is the population of Paris plus 1000, and what is the population of Rome?"
ANSWER = "Paris plus 1000 is 2101000; Rome has 2800000 people."
POPULATIONS = {"Paris": 2_100_000, "Rome": 2_800_000}

# (reasoning, [(tool, args, call id)]) per turn, chosen by how many tool results the model has seen.
SCRIPT: list[tuple[str, list[tuple[str, dict[str, Any], str]]]] = [
    ("I need the population of Paris.", [("lookup_population", {"city": "Paris"}, "call_paris")]),
    (
        "Now add 1000 to it and look up Rome.",
        [("add", {"a": 2_100_000, "b": 1000}, "call_add"), ("lookup_population", {"city": "Rome"}, "call_rome")],
    ),
    (ANSWER, []),
]


def lookup_population(city: str) -> str:
    """Population of a city."""
    return str(POPULATIONS.get(city, "unknown"))


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def scripted_turn(tool_results_seen: int) -> tuple[str, list[tuple[str, dict[str, Any], str]]]:
    return SCRIPT[min(tool_results_seen, len(SCRIPT) - 1)]


# -- LangGraph ---------------------------------------------------------------------------------------------------
def build_langgraph_agent() -> Any:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    class ScriptedChatModel(BaseChatModel):
        """A chat model whose reply is a function of the conversation alone."""

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            text, calls = scripted_turn(sum(isinstance(m, ToolMessage) for m in messages))
            message = AIMessage(
                content=text, tool_calls=[{"name": name, "args": args, "id": cid} for name, args, cid in calls]
            )
            return ChatResult(generations=[ChatGeneration(message=message)])

    tools = [tool(lookup_population), tool(add)]
    model = ScriptedChatModel().bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


def run_langgraph_agent(graph: Any, thread_id: str) -> str:
    from langchain_core.messages import HumanMessage

    state = graph.invoke({"messages": [HumanMessage(QUESTION)]}, {"configurable": {"thread_id": thread_id}})
    return str(state["messages"][-1].content)


# -- OpenAI tool loop --------------------------------------------------------------------------------------------
TOOLS_SCHEMA = [
    {
        "type": "function",
        "function": {
            "name": "lookup_population",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]


def scripted_openai_client() -> Any:
    """The real ``openai`` client over an ``httpx.MockTransport`` that answers like the chat completions API."""
    import httpx
    import openai

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        text, calls = scripted_turn(sum(m.get("role") == "tool" for m in body["messages"]))
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for name, args, cid in calls
            ]
        return httpx.Response(
            200,
            json={
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": 0,
                "model": "scripted-model",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
            },
        )

    return openai.OpenAI(
        api_key="test-key",
        base_url="http://model.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


def run_openai_agent(client: Any, tracer: Any) -> str:
    """A plain tool loop: call the model, run the tools it asks for, repeat; spans by OpenInference conventions."""
    from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes, ToolCallAttributes

    functions = {"lookup_population": lookup_population, "add": add}
    with tracer.start_as_current_span(
        "population_agent",
        attributes={
            SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
            SpanAttributes.INPUT_VALUE: QUESTION,
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
                    call.function.name,
                    attributes={
                        SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.TOOL.value,
                        SpanAttributes.TOOL_NAME: call.function.name,
                        ToolCallAttributes.TOOL_CALL_ID: call.id,
                        SpanAttributes.INPUT_VALUE: call.function.arguments,
                    },
                ) as span:
                    result = str(functions[call.function.name](**json.loads(call.function.arguments)))
                    span.set_attribute(SpanAttributes.OUTPUT_VALUE, result)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        root.set_attribute(SpanAttributes.OUTPUT_VALUE, message.content or "")
        return message.content or ""


def otlp_json(spans: Any) -> dict[str, Any]:
    """SDK spans as an OTLP/JSON ``ExportTraceServiceRequest`` (ids in hex, as OTLP/JSON requires)."""
    import base64

    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    document = MessageToDict(encode_spans(spans))
    for resource in document.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return document


def write_example(path: str) -> None:
    """Regenerate the example shipped in ``reflect_otel/demo/data/examples`` from a real instrumented LangGraph run."""
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    LangChainInstrumentor().instrument(tracer_provider=provider)
    try:
        run_langgraph_agent(build_langgraph_agent(), thread_id="example-thread")
    finally:
        LangChainInstrumentor().uninstrument()
    with open(path, "w", encoding="utf-8") as file:
        json.dump(otlp_json(exporter.get_finished_spans()), file, indent=1)
        file.write("\n")


if __name__ == "__main__":
    import sys

    write_example(sys.argv[1])
