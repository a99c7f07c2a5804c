"""The chain-of-thought demo agent (BIG-Bench-Mistake style): one model call writes numbered reasoning lines and
an answer. It records OpenInference spans itself (an AGENT root and an LLM span whose output is one line per
step), so its traces assemble into one step per line and replay with the reasoning adapter."""

from __future__ import annotations

from opentelemetry import trace as otel_trace
from opentelemetry.trace import TracerProvider

from reflect_otel.llm.base import ChatMessage, StructuredLLM
from reflect_otel.prompts import CHAIN_OF_THOUGHT_PROMPT, ReasoningContinuation
from reflect_otel.reading.semconv import OpenInferenceSpanKindValues, SpanAttributes
from reflect_otel.record import Stage

__all__ = ["ChainOfThoughtAgent"]


class ChainOfThoughtAgent:
    def __init__(self, llm: StructuredLLM, *, tracer_provider: TracerProvider | None = None) -> None:
        self.llm = llm
        self._tracer = (tracer_provider or otel_trace.get_tracer_provider()).get_tracer("reflect_otel.demo.cot")

    def solve(self, question: str, task: str = "") -> str:
        """Reason step by step; returns the final line, ``So the answer is ...``."""
        prompt = question + (f"\n\nTask: {task}" if task else "")
        messages = [
            ChatMessage(role="system", content=CHAIN_OF_THOUGHT_PROMPT),
            ChatMessage(role="user", content=prompt),
        ]
        kind = SpanAttributes.OPENINFERENCE_SPAN_KIND
        with self._tracer.start_as_current_span(
            "cot_agent",
            attributes={kind: OpenInferenceSpanKindValues.AGENT.value, SpanAttributes.INPUT_VALUE: question},
        ) as root:
            attributes: dict[str, str | int] = {
                kind: OpenInferenceSpanKindValues.LLM.value,
                SpanAttributes.LLM_MODEL_NAME: self.llm.model_name,
            }
            for i, message in enumerate(messages):
                attributes[f"{SpanAttributes.LLM_INPUT_MESSAGES}.{i}.message.role"] = message.role
                attributes[f"{SpanAttributes.LLM_INPUT_MESSAGES}.{i}.message.content"] = message.content
            with self._tracer.start_as_current_span("reason", attributes=attributes) as span:
                completion = self.llm.complete(messages, ReasoningContinuation, stage=Stage.AGENT)
                lines = [line.strip() for text in completion.value.steps for line in text.splitlines() if line.strip()]
                answer = f"So the answer is {completion.value.answer.strip()}"
                span.set_attribute(f"{SpanAttributes.LLM_OUTPUT_MESSAGES}.0.message.role", "assistant")
                span.set_attribute(
                    f"{SpanAttributes.LLM_OUTPUT_MESSAGES}.0.message.content", "\n".join([*lines, answer])
                )
                span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_PROMPT, completion.usage.prompt_tokens)
                span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_COMPLETION, completion.usage.completion_tokens)
            root.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
            return answer
