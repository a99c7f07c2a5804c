"""Agents with a bug that a correction repairs, for replay tests. The model is deterministic: its reply depends
only on the conversation. Unless a system/user message says FIX, it looks up Lyon instead of Paris.

Buggy run: 1 lookup(Lyon) | 2 add(516000, 1000) + 3 lookup(Rome) in one turn | 4 answer 517000.
With FIX injected after any rollback point (0, 1 or 3; 2 splits a parallel turn), it looks Paris up and
answers 2101000.
"""

from __future__ import annotations

import json
from typing import Any

from reflect_otel.trace import StepAction

QUESTION = "What is the population of Paris plus 1000?"
FIX = "use the city Paris"
ACTION = StepAction(tool_name="lookup_population", arguments={"city": "Paris"})
"""The corrected call: executed in place of any step, the agent continues from Paris's population."""
ACTION_RESULT = "Paris: 2100000"
CORRECT = "The answer is 2101000"
WRONG = "The answer is 517000"
POPULATION = {"Paris": 2_100_000, "Lyon": 516_000, "Rome": 2_800_000}


def lookup_population(city: str) -> str:
    """Population of a city."""
    return f"{city}: {POPULATION.get(city, 0)}"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def decide(instructions: list[str], results: list[tuple[str, str]]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """(text, tool calls) from the non-assistant messages' texts and the tool results (tool name, content)."""
    corrected = any(FIX in text for text in instructions)
    lookups = [
        (i, c) for i, (name, c) in enumerate(results) if name == "lookup_population" and not c.startswith("Rome")
    ]
    adds = [i for i, (name, _) in enumerate(results) if name == "add"]
    if corrected and not any(c.startswith("Paris") for _, c in lookups):
        return "Correcting: looking up Paris.", [("lookup_population", {"city": "Paris"})]
    if not lookups:
        return "Looking up the city.", [("lookup_population", {"city": "Lyon"})]
    last_lookup, text = lookups[-1]
    if not adds or adds[-1] < last_lookup:
        population = int(text.split(": ")[1])
        return "Adding 1000, and checking Rome.", [
            ("add", {"a": population, "b": 1000}),
            ("lookup_population", {"city": "Rome"}),
        ]
    return f"The answer is {results[adds[-1]][1]}", []


# -- LangGraph ---------------------------------------------------------------------------------------------------
def build_graph(requests: list[str] | None = None) -> Any:
    """The graph; each model request's message texts are appended to ``requests`` (the test's probe)."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    turns = {"n": 0}

    class CorrectableModel(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "correctable"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            if requests is not None:
                requests.append("\n".join(str(m.content) for m in messages))
            instructions = [str(m.content) for m in messages if isinstance(m, (HumanMessage, SystemMessage))]
            results = [(m.name or "", str(m.content)) for m in messages if isinstance(m, ToolMessage)]
            text, calls = decide(instructions, results)
            turns["n"] += 1
            message = AIMessage(
                content=text,
                tool_calls=[{"name": n, "args": a, "id": f"call_{turns['n']}_{k}"} for k, (n, a) in enumerate(calls)],
            )
            return ChatResult(generations=[ChatGeneration(message=message)])

    tools = [tool(lookup_population), tool(add)]
    model = CorrectableModel().bind_tools(tools)
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


def run_graph(graph: Any, thread_id: str) -> str:
    from langchain_core.messages import HumanMessage

    state = graph.invoke({"messages": [HumanMessage(QUESTION)]}, {"configurable": {"thread_id": thread_id}})
    return str(state["messages"][-1].content)


# -- OpenAI tool loop --------------------------------------------------------------------------------------------
def openai_client(requests: list[str] | None = None) -> Any:
    import httpx
    import openai

    turns = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        messages = json.loads(request.content)["messages"]
        if requests is not None:
            requests.append("\n".join(str(m.get("content") or "") for m in messages))
        names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
        instructions = [m["content"] for m in messages if m["role"] in ("system", "user", "developer")]
        results = [(names.get(m["tool_call_id"], ""), m["content"]) for m in messages if m["role"] == "tool"]
        text, calls = decide(instructions, results)
        turns["n"] += 1
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{turns['n']}_{k}",
                    "type": "function",
                    "function": {"name": n, "arguments": json.dumps(a)},
                }
                for k, (n, a) in enumerate(calls)
            ]
        return httpx.Response(
            200,
            json={
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "correctable",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
            },
        )

    return openai.OpenAI(
        api_key="k", base_url="http://model.test/v1", http_client=httpx.Client(transport=httpx.MockTransport(handler))
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_population",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    },
]


def execute_tool(name: str, arguments: dict[str, Any]) -> str:
    """The loop's tool executor (what an action replay calls)."""
    functions = {"lookup_population": lookup_population, "add": add}
    return str(functions[name](**arguments))


def traced_tool(tracer: Any, name: str, call_id: str, arguments: dict[str, Any], guard: Any = None) -> str:
    """Run one of the tools under a TOOL span, as a hand-written loop instruments it; ``guard`` first (the replay
    contract)."""
    from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes, ToolCallAttributes

    if guard is not None:
        guard(name, arguments)
    with tracer.start_as_current_span(
        name,
        attributes={
            SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.TOOL.value,
            SpanAttributes.TOOL_NAME: name,
            ToolCallAttributes.TOOL_CALL_ID: call_id,
            SpanAttributes.INPUT_VALUE: json.dumps(arguments),
        },
    ) as span:
        result = execute_tool(name, arguments)
        span.set_attribute(SpanAttributes.OUTPUT_VALUE, result)
    return result


def tool_loop(client: Any, tracer: Any, messages: list[dict[str, Any]], guard: Any = None) -> str:
    """The user's loop: model, tools, repeat. ``guard`` is called before each tool (the replay contract)."""
    while True:
        reply = client.chat.completions.create(model="correctable", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            result = traced_tool(tracer, call.function.name, call.id, arguments, guard)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


def run_loop(client: Any, tracer: Any) -> str:
    from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes

    with tracer.start_as_current_span(
        "agent",
        attributes={
            SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
            SpanAttributes.INPUT_VALUE: QUESTION,
        },
    ) as root:
        answer = tool_loop(client, tracer, [{"role": "user", "content": QUESTION}])
        root.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
        return answer


def scripted_auditor() -> Any:
    """A scripted REFLECT auditor for these agents: it blames step 1 (the Lyon lookup) and plans the fix."""
    from reflect_otel.testing import ScriptedLLM, ScriptedRequest

    def respond(request: ScriptedRequest) -> Any:
        return {
            "localize": {
                "error_step": 1,
                "confidence": 0.7,
                "reasoning": "looked up Lyon",
                "what_should_have_been_done": "Paris",
            },
            "classify": {
                "error_type": "incorrect_problem_identification",
                "confidence": 0.7,
                "explanation": "wrong city",
                "suggested_correction": FIX,
            },
            "diagnose": {
                "root_cause": "the agent looked up the wrong city",
                "correction_instruction": FIX,
                "forbidden_actions": [],
                "expected_next_tool": "lookup_population",
                "confidence": 0.8,
            },
            "gate": {"is_faithful": True, "violation_reason": None, "violation_type": None},
            "explain": {
                "reasoning": "the replay looked up Paris",
                "error_type": "incorrect_problem_identification",
                "explanation": "Lyon instead of Paris",
            },
        }[request.stage]

    return ScriptedLLM(respond=respond)


# -- Anthropic tool loop -----------------------------------------------------------------------------------------
ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}  # type: ignore[index]
    for t in TOOLS
]


def anthropic_turn(body: dict[str, Any]) -> Any:
    """The correctable model as a Messages API turn (for ``ScriptedAnthropicServer``)."""
    from reflect_otel.testing.openai_server import ScriptedToolCall, ScriptedTurn

    system = body.get("system") or ""
    instructions = [system if isinstance(system, str) else " ".join(b.get("text", "") for b in system)]
    names: dict[str, str] = {}
    results: list[tuple[str, str]] = []
    for message in body["messages"]:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks:
            if block["type"] == "tool_use":
                names[block["id"]] = block["name"]
            elif block["type"] == "tool_result":
                results.append((names.get(block["tool_use_id"], ""), str(block["content"])))
            elif block["type"] == "text" and message["role"] == "user":
                instructions.append(block["text"])
    text, calls = decide(instructions, results)
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant") + 1
    return ScriptedTurn(
        text, [ScriptedToolCall(n, a, f"toolu_{turn}_{k}_{len(results)}") for k, (n, a) in enumerate(calls)]
    )


def anthropic_tool_loop(
    client: Any, tracer: Any, system: Any, messages: list[dict[str, Any]], guard: Any = None
) -> str:
    """The user's Messages API loop: model, tools (each under a TOOL span), repeat; ``guard`` before each tool."""
    while True:
        reply = client.messages.create(
            model="correctable", max_tokens=256, system=system, messages=messages, tools=ANTHROPIC_TOOLS
        )
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in reply.content if b.type == "text")
        results = [
            {"type": "tool_result", "tool_use_id": u.id, "content": traced_tool(tracer, u.name, u.id, u.input, guard)}
            for u in uses
        ]
        messages.append({"role": "user", "content": results})


def run_anthropic_loop(client: Any, tracer: Any) -> str:
    from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes

    with tracer.start_as_current_span(
        "agent",
        attributes={
            SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
            SpanAttributes.INPUT_VALUE: QUESTION,
        },
    ) as root:
        answer = anthropic_tool_loop(client, tracer, "You answer with tools.", [{"role": "user", "content": QUESTION}])
        root.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
        return answer
