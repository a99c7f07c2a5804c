"""Native tool calling on the embedded model: the ``reflect-tools`` chat handler the local llama.cpp server runs.

The first tests read the handler's translation on its own (what a model writes, what the template is given). The
model tests (``local_llm``) send the OpenAI tools API to the default model through the real ``openai`` client:
``tool_choice="auto"`` returns ``tool_calls``, streamed too; an assistant turn with ``content: null`` is accepted
(the server answered 500); and the SQL demo agent runs end to end and replays from its recorded requests.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from reflect_otel.llm._tool_calls import _call_schema, _parsed_call, _template_messages, _written_call
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.replay import ReplayRequest
from tests.conftest import Instrumented

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
NAMES = ["get_weather"]


@pytest.mark.parametrize(
    ("text", "start", "template_form"),
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}', 0, True),
        ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}', 13, True),
        ('<tools>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tools>', 0, False),
        ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', 0, False),
        ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}', 0, False),
        # Qwen2.5's template shows the form as {{"name": ...}} (a Jinja string literal); the default model copies it
        ('{{"name": "get_weather", "arguments": {"city": "Oslo"}}}', 0, False),
        ('<tool_call>\n{{"name": "get_weather", "arguments": {"city": "Oslo"}}}\n', 0, True),
    ],
)
def test_a_call_the_model_writes_in_any_wrapper_is_found(text: str, start: int, template_form: bool) -> None:
    found = _written_call(text, NAMES)
    assert found is not None and found[0] == start and found[2] is template_form
    assert _parsed_call(found[1], NAMES) == ("get_weather", {"city": "Oslo"})


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Oslo.",
        '{"name": "send_email", "arguments": {}}',  # not one of the tools
        'The JSON {"city": "Oslo"} is the argument.',  # prose that quotes JSON naming no tool
    ],
)
def test_text_that_is_no_call_of_a_tool_stays_text(text: str) -> None:
    assert _written_call(text, NAMES) is None


def test_the_template_gets_null_content_as_text_and_arguments_as_objects() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    sent = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    (message,) = _template_messages(sent)
    assert message["content"] == "" and message["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert sent[0]["content"] is None  # the request itself is left as it was


def test_a_constrained_call_is_one_of_the_tools_with_its_parameters() -> None:
    schema = _call_schema([*TOOLS, {"type": "function", "function": {"name": "noop"}}])
    assert [o["properties"]["name"]["const"] for o in schema["oneOf"]] == ["get_weather", "noop"]
    assert schema["oneOf"][0]["properties"]["arguments"] == TOOLS[0]["function"]["parameters"]


# -- on the default model -----------------------------------------------------------------------------------------
def _client(llm: StructuredLLM) -> Any:
    import openai

    server = llm.server  # type: ignore[attr-defined]
    return openai.OpenAI(base_url=server.base_url, api_key="local", timeout=900, max_retries=0)


QUESTION = [
    {"role": "system", "content": "Use the tools to answer."},
    {"role": "user", "content": "What is the weather in Oslo right now?"},
]


@pytest.mark.local_llm
def test_the_default_model_returns_tool_calls_streamed_or_not(default_llm: StructuredLLM) -> None:
    client = _client(default_llm)
    reply = client.chat.completions.create(
        model=default_llm.model_name, messages=QUESTION, tools=TOOLS, tool_choice="auto", temperature=0
    )
    message = reply.choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == "get_weather", message
    assert "oslo" in json.loads(message.tool_calls[0].function.arguments)["city"].lower()
    assert reply.choices[0].finish_reason == "tool_calls" and "<tool_call>" not in (message.content or "")
    chunks = list(
        client.chat.completions.create(
            model=default_llm.model_name, messages=QUESTION, tools=TOOLS, tool_choice="auto", temperature=0, stream=True
        )
    )
    streamed = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or ()]
    assert [c.function.name for c in streamed] == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # the loop's next request: the call as an assistant turn with content null, then its result
    call = message.tool_calls[0]
    after = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": "Oslo", "weather": "light snow"})},
    ]
    answered = client.chat.completions.create(
        model=default_llm.model_name, messages=after, tools=TOOLS, tool_choice="none", temperature=0
    )
    text = answered.choices[0].message.content or ""
    assert not answered.choices[0].message.tool_calls and "snow" in text.lower(), text


@pytest.mark.local_llm
def test_the_sql_agent_runs_on_the_default_model_and_replays_from_its_requests(
    default_llm: StructuredLLM, instrumented: Instrumented
) -> None:
    from reflect_otel.demo.sql_agent import SQLAgent, chat_client
    from reflect_otel.demo.wtq import load_questions
    from reflect_otel.reading.capture import recorded_run
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    provider = instrumented.provider  # the OpenAI instrumentation writes there
    client, model = chat_client(default_llm)
    question = next(q for q in load_questions() if q.id == "nt-1")
    agent = SQLAgent(question, client, model=model, tracer_provider=provider, max_steps=3)
    with recorded_run(provider, "sql_agent") as run:
        answer = agent.answer()
    trace = run.trace
    assert trace is not None and trace.final_answer == (answer or None)
    assert trace.steps[0].tool_name == "schema" and json.loads(trace.steps[0].tool_result or "")["table"] == "data"
    calls = [s for s in trace.steps if s.tool_name]
    assert 1 <= len(calls) <= 3 and trace.steps[-1].is_final_answer
    adapter = OpenAIToolLoopReplayAdapter(
        agent.resume, tracer_provider=provider, execute_tool=agent.execute_tool, client=client, deterministic=True
    )
    replayed = adapter.replay(ReplayRequest.intervention(trace, 1))
    assert replayed.prefix_verified and replayed.continuation  # the recorded request was resent as it was
    (proposal,) = adapter.propose(
        ReplayRequest(trace=trace, rollback_point=1, injection="", temperature=0.7), samples=1
    )
    assert proposal.is_final_answer or proposal.action.tool_name in ("schema", "query")


# -- the reply grammar, read by llama.cpp's own grammar engine ------------------------------------------------------
GRAMMAR_TOOLS: list[dict[str, Any]] = [
    *TOOLS,
    {
        "type": "function",
        "function": {
            "name": "final_answer",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
        },
    },
]


@pytest.fixture(scope="module")
def accepts() -> Any:
    """Whether llama.cpp's grammar sampler lets a model write a text under :func:`reply_grammar` (token by token,
    then the end of the turn): the real engine on a small model's vocabulary, loaded alone (no weights run)."""
    from reflect_otel.llm.models import local_model_missing, resolve_local_model

    small = "smollm2-135m-instruct"
    missing = local_model_missing(small)
    if missing is not None:
        pytest.skip(missing)
    import ctypes
    import math

    import llama_cpp
    from llama_cpp._internals import LlamaModel

    from reflect_otel.llm._tool_calls import reply_grammar

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = LlamaModel(path_model=str(resolve_local_model(small).path), params=params, verbose=False)
    grammar = reply_grammar(GRAMMAR_TOOLS).encode()

    def check(text: str) -> bool:
        sampler = llama_cpp.llama_sampler_init_grammar(model.vocab, grammar, b"root")
        assert sampler, "the grammar does not parse"
        try:
            for token in [*model.tokenize(text.encode(), add_bos=False, special=False), model.token_eos()]:
                data = (llama_cpp.llama_token_data * 1)()
                data[0].id, data[0].logit = token, 0.0
                candidates = llama_cpp.llama_token_data_array(data=data, size=1, selected=-1, sorted=False)
                llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
                if math.isinf(data[0].logit):
                    return False
                if token != model.token_eos():
                    llama_cpp.llama_sampler_accept(sampler, token)
            return True
        finally:
            llama_cpp.llama_sampler_free(sampler)

    yield check
    model.close()


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        '{"name": "final_answer", "arguments": {"answer": "42"}}',
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        "It is sunny in Oslo.",
        "Final answer: 42, since 6 < 7 and 7 > 6.",
        "final answer: 42",  # a tool's name, spelt otherwise
        "Final Answer: 42",
        "get",  # the start of a tool's name, as a whole message
    ],
)
def test_the_reply_grammar_lets_the_model_call_a_tool_or_write_a_plain_message(accepts: Any, text: str) -> None:
    assert accepts(text)


@pytest.mark.parametrize(
    "text",
    [
        "<tools></tools>",  # what the default model wrote where a call belonged
        "final_answer,42",  # ditto: a tool's name as text
        'final_answer({"answer": "42"})',
        'Final_answer("42")',  # in another case (the default model wrote it so once the first was refused)
        "GET_WEATHER for Oslo",
        '{"name": "send_email", "arguments": {}}',  # no such tool
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',  # its required argument left out
        '{{"name": "get_weather", "arguments": {"city": "Oslo"}}}',
        " leading space",
        "",
    ],
)
def test_the_reply_grammar_refuses_text_where_a_call_belongs(accepts: Any, text: str) -> None:
    assert not accepts(text)
