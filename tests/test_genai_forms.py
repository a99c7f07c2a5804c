"""Every message form of the OTel GenAI conventions since v1.28, and the message shapes of the major provider APIs,
each rebuilt into the same run. The run is the conventions' own example ("Tool calls (functions)" in
docs/gen-ai/non-normative/examples-llm-calls.md and, for events, docs/gen-ai/gen-ai-events.md of v1.36): the user
asks for the weather in Paris, the model calls ``get_weather({"location": "Paris"})``, the tool answers
``rainy, 57°F``, and the model replies. Each form is sent as OTLP/JSON through the decoder, as a collector gets it,
with the messages' JSON copied from the conventions' examples where they give one."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from reflect_otel.collectors.otlp import decode_json_document, decode_protobuf
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.trace import StepKind, StructuredTrace

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
QUESTION = "Weather in Paris?"
REPLY = "The weather in Paris is currently rainy with a temperature of 57°F."
CALL_ID = "call_VSPygqKTWdrhaFErNvMV18Yl"
ARGUMENTS = {"location": "Paris"}
RESULT = "rainy, 57°F"
STEPS = [
    (StepKind.TOOL_CALL, "get_weather", ARGUMENTS, RESULT, CALL_ID),
    (StepKind.FINAL_ANSWER, None, {}, None, None),
]


def _value(value: object) -> dict[str, Any]:
    """An OTLP/JSON ``AnyValue``: strings, numbers, and structured values as arrays and key-value lists."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": _value(v)} for k, v in value.items()]}}
    raise TypeError(value)


def _attributes(values: dict[str, object]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in values.items()]


def _span(
    number: int,
    parent: int | None,
    name: str,
    attributes: dict[str, object],
    events: list[tuple[str, dict[str, object]]] = (),
) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": f"{number:016x}",
        "name": name,
        "startTimeUnixNano": str(1000 * number),
        "endTimeUnixNano": str(1000 * number + 500 if parent else 10**9),
        "attributes": _attributes(attributes),
        "events": [{"name": n, "timeUnixNano": str(1000 * number), "attributes": _attributes(a)} for n, a in events],
    }
    if parent is not None:
        span["parentSpanId"] = f"{parent:016x}"
    return span


def _rebuilt(*spans: dict[str, Any], protobuf: bool = False) -> StructuredTrace:
    """The spans as an OTLP/JSON request (or, with ``protobuf``, the same request in protobuf) through the decoder."""
    document = {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "test"}, "spans": list(spans)}]}]}
    if protobuf:
        for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:  # type: ignore[index]
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in span:
                    span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        batch = decode_protobuf(json_format.ParseDict(document, ExportTraceServiceRequest()).SerializeToString())
    else:
        batch = decode_json_document(json.loads(json.dumps(document)))
    assert not batch.rejected, batch.error_message
    return assemble_trace(batch.spans)


def _steps(trace: StructuredTrace) -> list[tuple[Any, ...]]:
    return [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.tool_call_id) for s in trace.steps]


def _agent(**attributes: object) -> dict[str, Any]:
    return _span(1, None, "invoke_agent weather", {"gen_ai.operation.name": "invoke_agent", **attributes})


def _chat(number: int, events: list[tuple[str, dict[str, object]]] = (), **attributes: object) -> dict[str, Any]:
    base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4"}
    return _span(number, 1, "chat gpt-4", base | attributes, events)


# -- the conventions' forms ----------------------------------------------------------------------------------------
SPAN_1_INPUT = [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]
SPAN_1_OUTPUT = [
    {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": CALL_ID, "name": "get_weather", "arguments": ARGUMENTS}],
        "finish_reason": "tool_call",
    }
]
SPAN_2_INPUT = [
    *SPAN_1_INPUT,
    {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": CALL_ID, "name": "get_weather", "arguments": ARGUMENTS}],
    },
    {"role": "tool", "parts": [{"type": "tool_call_response", "id": CALL_ID, "response": RESULT}]},
]
SPAN_2_OUTPUT = [{"role": "assistant", "parts": [{"type": "text", "content": REPLY}], "finish_reason": "stop"}]
TOOL_SPAN = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "get_weather",
    "gen_ai.tool.call.id": CALL_ID,
    "gen_ai.tool.type": "function",
}


def test_messages_as_span_attributes_v1_37_with_an_execute_tool_span() -> None:
    trace = _rebuilt(
        _agent(),
        _chat(
            2,
            **{"gen_ai.input.messages": json.dumps(SPAN_1_INPUT), "gen_ai.output.messages": json.dumps(SPAN_1_OUTPUT)},
        ),
        _span(3, 1, "execute_tool get_weather", TOOL_SPAN | {"gen_ai.tool.call.result": RESULT}),
        _chat(
            4,
            **{"gen_ai.input.messages": json.dumps(SPAN_2_INPUT), "gen_ai.output.messages": json.dumps(SPAN_2_OUTPUT)},
        ),
    )
    assert _steps(trace) == STEPS and trace.steps[0].tool_span_id == f"{3:016x}"
    assert (trace.question, trace.final_answer, trace.warnings) == (QUESTION, REPLY, ())


@pytest.mark.parametrize("protobuf", [False, True])
def test_messages_as_structured_attribute_values_and_tool_arguments_as_a_map(protobuf: bool) -> None:
    """The same attributes as OTLP arrays and key-value lists rather than JSON text (the conventions allow both),
    in OTLP/JSON and in protobuf."""
    trace = _rebuilt(
        _agent(),
        _chat(2, **{"gen_ai.input.messages": SPAN_1_INPUT, "gen_ai.output.messages": SPAN_1_OUTPUT}),
        _span(
            3,
            1,
            "execute_tool get_weather",
            TOOL_SPAN | {"gen_ai.tool.call.arguments": ARGUMENTS, "gen_ai.tool.call.result": {"forecast": RESULT}},
        ),
        _chat(4, **{"gen_ai.input.messages": SPAN_2_INPUT, "gen_ai.output.messages": SPAN_2_OUTPUT}),
        protobuf=protobuf,
    )
    assert _steps(trace) == STEPS and (trace.question, trace.final_answer) == (QUESTION, REPLY)
    assert trace.steps[0].tool_result == RESULT  # the tool's map, and the text the model was shown: the text
    assert trace.steps[0].tool_result_raw is None


def test_messages_on_the_inference_details_event() -> None:
    """``gen_ai.client.inference.operation.details``: the same attributes on an event of the span."""
    details = "gen_ai.client.inference.operation.details"
    trace = _rebuilt(
        _agent(),
        _chat(
            2,
            [
                (
                    details,
                    {
                        "gen_ai.input.messages": json.dumps(SPAN_1_INPUT),
                        "gen_ai.output.messages": json.dumps(SPAN_1_OUTPUT),
                    },
                )
            ],
        ),
        _chat(
            4,
            [
                (
                    details,
                    {
                        "gen_ai.input.messages": json.dumps(SPAN_2_INPUT),
                        "gen_ai.output.messages": json.dumps(SPAN_2_OUTPUT),
                    },
                )
            ],
        ),
    )
    assert _steps(trace) == STEPS and (trace.question, trace.final_answer) == (QUESTION, REPLY)


def _v136_events(choice: dict[str, object], history: bool) -> list[tuple[str, dict[str, object]]]:
    calls = [
        {"id": CALL_ID, "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)}, "type": "function"}
    ]
    events: list[tuple[str, dict[str, object]]] = [("gen_ai.user.message", {"content": QUESTION})]
    if history:
        events += [
            ("gen_ai.assistant.message", {"tool_calls": json.dumps(calls)}),
            ("gen_ai.tool.message", {"content": RESULT, "id": CALL_ID}),
        ]
    return [*events, ("gen_ai.choice", choice)]


@pytest.mark.parametrize("calls_beside_the_message", [False, True])
def test_per_message_events_of_v1_28_to_v1_36(calls_beside_the_message: bool) -> None:
    """The v1.36 example's event bodies, as span event attributes, on spans that name only ``gen_ai.system``; the
    choice's ``tool_calls`` inside its message (the example) or beside it (the body's definition)."""
    calls = [
        {"id": CALL_ID, "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)}, "type": "function"}
    ]
    first: dict[str, object] = {"index": 0, "finish_reason": "tool_calls"}
    if calls_beside_the_message:
        first |= {"message": json.dumps({}), "tool_calls": json.dumps(calls)}
    else:
        first |= {"message": json.dumps({"tool_calls": calls})}
    second = {"index": 0, "finish_reason": "stop", "message": json.dumps({"content": REPLY})}
    legacy = {"gen_ai.system": "openai", "gen_ai.request.model": "gpt-4"}
    trace = _rebuilt(
        _span(1, None, "weather", {}),
        _span(2, 1, "chat gpt-4", legacy, _v136_events(first, history=False)),
        _span(4, 1, "chat gpt-4", legacy, _v136_events(second, history=True)),
    )
    assert _steps(trace) == STEPS and (trace.question, trace.final_answer) == (QUESTION, REPLY)


def test_invoke_agent_states_the_question_and_answer_by_attributes_or_events() -> None:
    by_attributes = _agent(
        **{"gen_ai.input.messages": json.dumps(SPAN_1_INPUT), "gen_ai.output.messages": json.dumps(SPAN_2_OUTPUT)}
    )
    by_events = _span(
        1,
        None,
        "invoke_agent weather",
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather"},
        [
            ("gen_ai.user.message", {"content": QUESTION}),
            ("gen_ai.choice", {"index": 0, "message": json.dumps({"content": REPLY})}),
        ],
    )
    for agent in (by_attributes, by_events):
        trace = _rebuilt(
            agent, _span(3, 1, "execute_tool get_weather", TOOL_SPAN | {"gen_ai.tool.call.result": RESULT})
        )
        assert (trace.question, trace.final_answer) == (QUESTION, REPLY)


JOKES = [
    "Why did the developer bring OpenTelemetry to the party? Because it always knows how to trace the fun!",
    "Why did OpenTelemetry get promoted? It had great span of control!",
]


def test_of_several_choices_the_first_is_the_reply() -> None:
    ask = [{"role": "user", "parts": [{"type": "text", "content": "Tell me a joke about OpenTelemetry"}]}]
    choices = [{"role": "assistant", "parts": [{"type": "text", "content": j}], "finish_reason": "stop"} for j in JOKES]
    by_attributes = _chat(
        2, **{"gen_ai.input.messages": json.dumps(ask), "gen_ai.output.messages": json.dumps(choices)}
    )
    by_events = _span(
        2,
        1,
        "chat gpt-4",
        {"gen_ai.system": "openai"},
        [("gen_ai.user.message", {"content": "Tell me a joke about OpenTelemetry"})]
        + [
            ("gen_ai.choice", {"index": i, "message": json.dumps({"content": j})})
            for i, j in reversed(list(enumerate(JOKES)))
        ],
    )
    for chat in (by_attributes, by_events):
        trace = _rebuilt(_agent(), chat)
        assert [s.reasoning for s in trace.steps] == [JOKES[0]] and trace.final_answer == JOKES[0]


def test_system_instructions_reasoning_multimodal_and_built_in_tool_parts() -> None:
    """The examples for ``gen_ai.system_instructions``, a ``reasoning`` part, blob/uri/file parts and
    ``server_tool_call`` parts: text and reasoning are read, the rest carries no words for a step."""
    instructions = [{"type": "text", "content": "You must never tell jokes"}]
    inputs = [
        {"role": "system", "parts": [{"type": "text", "content": "You are a helpful bot"}]},
        {
            "role": "user",
            "parts": [
                {"type": "text", "content": "What is in the attached data?"},
                {"type": "uri", "modality": "image", "mime_type": "image/png", "uri": "https://example.com/a.png"},
                {"type": "file", "file_id": "provider_fileid_123"},
                {"type": "blob", "modality": "audio", "mime_type": "audio/wav", "content": "aGVsbG8="},
            ],
        },
    ]
    outputs = [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "The user attached an image."},
                {
                    "type": "server_tool_call",
                    "id": "c1",
                    "name": "code_interpreter",
                    "server_tool_call": {"type": "code_interpreter", "code": "1"},
                },
                {
                    "type": "server_tool_call_response",
                    "id": "c1",
                    "server_tool_call_response": {"type": "code_interpreter"},
                },
                {"type": "text", "content": "An OpenTelemetry logo."},
            ],
            "finish_reason": "stop",
        }
    ]
    trace = _rebuilt(
        _agent(),
        _chat(
            2,
            **{
                "gen_ai.system_instructions": json.dumps(instructions),
                "gen_ai.input.messages": json.dumps(inputs),
                "gen_ai.output.messages": json.dumps(outputs),
            },
        ),
    )
    # a trace of one model reply is a chain of thought, a step per line: the reasoning part, then the text
    assert [s.reasoning for s in trace.steps] == ["The user attached an image.", "An OpenTelemetry logo."]
    assert trace.question == "What is in the attached data?" and not trace.warnings


# -- the providers' shapes -----------------------------------------------------------------------------------------
def _openai_call(arguments: object = json.dumps(ARGUMENTS)) -> dict[str, object]:
    return {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


PROVIDERS: dict[str, tuple[list[object], list[object], list[object]]] = {
    # (first call's reply, the history the second call sends after the question, the second call's reply)
    "openai-chat": (
        [{"role": "assistant", "content": None, "tool_calls": [_openai_call()]}],
        [
            {"role": "assistant", "content": None, "tool_calls": [_openai_call()]},
            {"role": "tool", "tool_call_id": CALL_ID, "content": RESULT},
        ],
        [{"role": "assistant", "content": [{"type": "text", "text": REPLY}]}],
    ),
    "openai-responses": (
        [{"type": "function_call", "call_id": CALL_ID, "name": "get_weather", "arguments": json.dumps(ARGUMENTS)}],
        [
            {"type": "function_call", "call_id": CALL_ID, "name": "get_weather", "arguments": json.dumps(ARGUMENTS)},
            {"type": "function_call_output", "call_id": CALL_ID, "output": RESULT},
        ],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": REPLY}]}],
    ),
    "anthropic": (
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": CALL_ID, "name": "get_weather", "input": ARGUMENTS}],
            }
        ],
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": CALL_ID, "name": "get_weather", "input": ARGUMENTS}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": CALL_ID, "content": [{"type": "text", "text": RESULT}]}
                ],
            },
        ],
        [
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "It rains."}, {"type": "text", "text": REPLY}],
            }
        ],
    ),
    "gemini": (
        [{"role": "model", "parts": [{"functionCall": {"id": CALL_ID, "name": "get_weather", "args": ARGUMENTS}}]}],
        [
            {"role": "model", "parts": [{"functionCall": {"id": CALL_ID, "name": "get_weather", "args": ARGUMENTS}}]},
            {
                "role": "user",
                "parts": [{"functionResponse": {"id": CALL_ID, "name": "get_weather", "response": RESULT}}],
            },
        ],
        [{"role": "model", "parts": [{"text": "It rains.", "thought": True}, {"text": REPLY}]}],
    ),
    "bedrock-converse": (
        [
            {
                "role": "assistant",
                "content": [{"toolUse": {"toolUseId": CALL_ID, "name": "get_weather", "input": ARGUMENTS}}],
            }
        ],
        [
            {
                "role": "assistant",
                "content": [{"toolUse": {"toolUseId": CALL_ID, "name": "get_weather", "input": ARGUMENTS}}],
            },
            {
                "role": "user",
                "content": [{"toolResult": {"toolUseId": CALL_ID, "content": [{"text": RESULT}], "status": "success"}}],
            },
        ],
        [{"role": "assistant", "content": [{"text": REPLY}]}],
    ),
    "cohere-v2": (
        [{"role": "assistant", "tool_plan": "I will look it up.", "tool_calls": [_openai_call()]}],
        [
            {"role": "assistant", "tool_plan": "I will look it up.", "tool_calls": [_openai_call()]},
            {"role": "tool", "tool_call_id": CALL_ID, "content": [{"type": "document", "document": {"data": RESULT}}]},
        ],
        [{"role": "assistant", "content": [{"type": "text", "text": REPLY}]}],
    ),
    "mistral": (
        [{"role": "assistant", "content": "", "tool_calls": [_openai_call(ARGUMENTS)]}],
        [
            {"role": "assistant", "content": "", "tool_calls": [_openai_call(ARGUMENTS)]},
            {"role": "tool", "name": "get_weather", "tool_call_id": CALL_ID, "content": RESULT},
        ],
        [{"role": "assistant", "content": [{"type": "text", "text": REPLY}]}],
    ),
    "vercel-ai-sdk": (
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool-call", "toolCallId": CALL_ID, "toolName": "get_weather", "input": ARGUMENTS}
                ],
            }
        ],
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool-call", "toolCallId": CALL_ID, "toolName": "get_weather", "input": ARGUMENTS}
                ],
            },
            {
                "role": "tool",
                "content": [
                    {
                        "type": "tool-result",
                        "toolCallId": CALL_ID,
                        "toolName": "get_weather",
                        "output": {"type": "text", "value": RESULT},
                    }
                ],
            },
        ],
        [{"role": "assistant", "content": [{"type": "text", "text": REPLY}]}],
    ),
}


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_a_providers_own_message_shapes_in_the_genai_attributes(provider: str) -> None:
    """Instrumentations that copy a provider's messages into ``gen_ai.input.messages`` / ``gen_ai.output.messages``
    as the API has them: no execute_tool span, so the result reaches the step from the second call's history."""
    first, history, second = PROVIDERS[provider]
    question = [{"role": "user", "content": QUESTION}]
    trace = _rebuilt(
        _agent(),
        _chat(2, **{"gen_ai.input.messages": json.dumps(question), "gen_ai.output.messages": json.dumps(first)}),
        _chat(
            4, **{"gen_ai.input.messages": json.dumps(question + history), "gen_ai.output.messages": json.dumps(second)}
        ),
    )
    assert _steps(trace) == STEPS
    assert (trace.question, trace.warnings) == (QUESTION, ())
    # the model's thinking (Anthropic, Gemini) is read as its reasoning, before the reply
    assert (
        trace.steps[-1].reasoning in (REPLY, f"It rains.\n{REPLY}") and trace.final_answer == trace.steps[-1].reasoning
    )


def test_cohere_v1_messages_read_their_words_and_calls() -> None:
    """Cohere's v1 chat: ``message``, upper-case roles, calls as ``{name, parameters}`` (no ids, so a result can
    only be matched by a tool span)."""
    reply = [
        {
            "role": "CHATBOT",
            "message": "Looking it up.",
            "tool_calls": [{"name": "get_weather", "parameters": ARGUMENTS}],
        }
    ]
    question = [{"role": "USER", "message": QUESTION}]
    trace = _rebuilt(
        _agent(),
        _chat(2, **{"gen_ai.input.messages": json.dumps(question), "gen_ai.output.messages": json.dumps(reply)}),
        _span(
            3,
            1,
            "execute_tool get_weather",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "get_weather",
                "gen_ai.tool.call.result": RESULT,
            },
        ),
    )
    step = trace.steps[0]
    assert (step.tool_name, step.tool_args, step.tool_result, step.reasoning) == (
        "get_weather",
        ARGUMENTS,
        RESULT,
        "Looking it up.",
    )
    assert trace.question == QUESTION
