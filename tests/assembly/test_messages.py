"""An LLM span's messages, read once into frozen values."""

from __future__ import annotations

from reflect_otel.reading.assembly.messages import Message, RequestedCall, read_conversation, read_conversations
from reflect_otel.reading.assembly.tree import SpanTree
from tests.assembly.recorded import LITELLM, recorded_spans

_IN = "llm.input_messages."


def test_a_recorded_conversation_reads_in_index_order() -> None:
    spans = [s for s in recorded_spans(LITELLM) if s.attributes.get("openinference.span.kind") == "LLM"]
    last = max(spans, key=lambda s: s.start_ns)
    conversation = read_conversation(last.attributes)
    assert [m.role for m in conversation.inputs] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert conversation.inputs[2].calls == (RequestedCall("multiply", "call_1", '{"a": 17, "b": 23}'),)
    assert conversation.inputs[3].text == "391" and not conversation.gap
    # LiteLLM records no tool_call_id on tool messages: each answers the calls of the turn before it, in order
    named = conversation.tool_messages_named()
    assert [(m.tool_call_id, m.text) for m in named] == [("call_1", "391"), ("call_2", "396")]


def test_read_conversations_covers_every_decision_span_once() -> None:
    spans = recorded_spans(LITELLM)
    conversations = read_conversations(SpanTree.of(spans))
    assert set(conversations) == {s.span_id for s in spans if s.attributes.get("openinference.span.kind") == "LLM"}


def test_multi_part_content_reads_as_its_text_parts_in_order() -> None:
    attributes = {
        f"{_IN}0.message.role": "user",
        f"{_IN}0.message.contents.1.message_content.text": "second",
        f"{_IN}0.message.contents.0.message_content.text": "first",
        f"{_IN}0.message.contents.0.message_content.type": "text",
    }
    assert read_conversation(attributes).inputs == (Message(role="user", text="first\nsecond"),)


def test_an_explicit_tool_call_id_wins_and_two_results_answer_two_calls_in_order() -> None:
    attributes = {
        f"{_IN}0.message.role": "assistant",
        f"{_IN}0.message.tool_calls.1.tool_call.id": "b",
        f"{_IN}0.message.tool_calls.0.tool_call.id": "a",
        f"{_IN}1.message.role": "tool",
        f"{_IN}1.message.tool_call_id": "b",
        f"{_IN}1.message.content": "B",
        f"{_IN}2.message.role": "tool",
        f"{_IN}2.message.content": "A",
    }
    named = read_conversation(attributes).tool_messages_named()
    assert [(m.tool_call_id, m.text) for m in named] == [("b", "B"), ("a", "A")]


def test_missing_message_indexes_are_a_gap_but_numbering_from_one_is_not() -> None:
    def gap(*indexes: int) -> bool:
        return read_conversation({f"{_IN}{i}.message.role": "user" for i in indexes}).gap

    assert not gap(0, 1, 2) and not gap(1, 2) and gap(0, 2) and gap(2, 3)


def test_the_output_signature_is_the_texts_and_calls() -> None:
    out = "llm.output_messages.0.message."
    one = read_conversation({out + "content": "hi", out + "tool_calls.0.tool_call.function.name": "f"})
    two = read_conversation({out + "content": "hi", out + "tool_calls.0.tool_call.function.name": "g"})
    assert one.output_signature == ("hi", "f", "") and one.output_signature != two.output_signature
