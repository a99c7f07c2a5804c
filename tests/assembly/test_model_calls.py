"""An LLM span read as the model call it records."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.assembly.messages import read_conversation
from reflect_otel.reading.assembly.model_calls import ModelCall, ToolRequest, mean_logprob, read_model_call
from reflect_otel.reading.assembly.tree import LLM, SpanTree
from reflect_otel.reading.spans import SpanRecord
from tests.assembly.recorded import AUTOGEN, AUTOGEN_ALONE, recorded_spans, rules
from tests.spans import agent_root, llm


def _calls(spans: list[SpanRecord]) -> list[ModelCall | None]:
    tree = SpanTree.of(spans)
    return [
        read_model_call(p, read_conversation(p.span.attributes), tree, rules())
        for p in tree.order
        if p.kind == LLM and p.span.span_id not in tree.nested_llm
    ]


def test_a_wrappers_words_come_from_the_client_span_inside_it_or_its_result_object() -> None:
    for recording in (AUTOGEN, AUTOGEN_ALONE):  # with the OpenAI client's span nested, and without
        calls = [c for c in _calls(recorded_spans(recording)) if c is not None]
        assert [c.requests[0].name if c.requests else None for c in calls] == ["multiply", "add", None]
        assert calls[0].reasoning == "I multiply first." and calls[1].reasoning == "Now add 5."
        assert calls[0].requests[0].args == {"a": 17, "b": 23} and calls[0].prompt_tokens == 50


def test_an_llm_span_that_made_no_call_is_none_but_one_that_counted_tokens_is_a_call() -> None:
    root = agent_root("q")
    prep = replace(llm("", parent=root.span_id, start=1), attributes={"openinference.span.kind": LLM})
    counted = replace(prep, attributes={**prep.attributes, "llm.token_count.prompt": 12})
    assert _calls([root, prep]) == [None]
    (call,) = _calls([root, counted])
    assert call is not None and (call.prompt_tokens, call.reasoning, call.requests) == (12, "", ())


def test_what_the_model_was_asked_and_offered_is_kept() -> None:
    root = agent_root("q")
    span = llm(
        "",
        [("lookup.__call__", '{"key": "sk-AAAAAAAAAAAAAAAAAAAAAAAA"}', "c1")],
        parent=root.span_id,
        **{
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.content": "look it up",
            "llm.model_name": "m-1",
            "input.value": '{"messages": []}',
            "llm.tools.0.tool.json_schema": '{"type": "function", "function": {"name": "lookup"}}',
        },
    )
    (call,) = _calls([root, span])
    assert call is not None
    assert (call.user_text, call.model_name, call.model_input) == ("look it up", "m-1", '{"messages": []}')
    assert call.requests == (ToolRequest("lookup", "c1", {"key": "[REDACTED:api_key]"}),)
    assert [t.name for t in call.tools] == ["lookup"] and call.secrets == 1


def test_the_mean_token_log_probability_of_a_reply_is_kept_where_the_response_carries_it() -> None:
    """An endpoint asked for logprobs returns them in the response the instrumentation records as output.value
    (OpenAI's chat completion under choices[0], LangChain's result under generation_info); a reply without them
    has none, and the step the call becomes carries it."""
    root = agent_root("q")
    tokens = [{"token": "Par", "logprob": -0.5}, {"token": "is", "logprob": -0.1}, {"token": ".", "logprob": 0.0}]
    openai = {"choices": [{"message": {"role": "assistant", "content": "Paris."}, "logprobs": {"content": tokens}}]}
    langchain = {"generations": [[{"text": "Paris.", "generation_info": {"logprobs": {"content": tokens}}}]]}
    for output in (openai, langchain):
        span = llm("Paris.", parent=root.span_id, **{"output.value": json.dumps(output)})
        (call,) = _calls([root, span])
        assert call is not None and call.logprob == pytest.approx(-0.2)
        (step,) = assemble_trace([root, span], collector="test").steps
        assert step.logprob == pytest.approx(-0.2)
    none_asked = {"choices": [{"message": {"role": "assistant", "content": "Paris."}, "logprobs": None}]}
    assert mean_logprob(none_asked) is None
    (bare,) = _calls([root, llm("Paris.", parent=root.span_id, **{"output.value": json.dumps(none_asked)})])
    assert bare is not None and bare.logprob is None
