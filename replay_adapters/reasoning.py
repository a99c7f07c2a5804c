"""Chain-of-thought replay (BIG-Bench Mistake style): keep reasoning steps 1..p, add the correction, and let the
model continue; one new step per line of reasoning, then the answer. An action is a replacement thought: it is
written as step p+1, after the kept steps, and the model continues after it."""

from __future__ import annotations

import hashlib
import re
import uuid

from reflect_otel.errors import LLMError, ReplayError
from reflect_otel.llm.base import ChatMessage, StructuredLLM
from reflect_otel.prompts import CHAIN_OF_THOUGHT_PROMPT, ReasoningContinuation
from reflect_otel.replay import ProposedStep, ReplayRequest, ReplayResult, check_rollback_point
from reflect_otel.replay_adapters._base import ReplayAdapterBase
from reflect_otel.trace import Step, StepAction, StepKind, StructuredTrace

__all__ = ["ReasoningReplayAdapter", "is_chain_of_thought"]

_ANSWER_LEAD = re.compile(r"^(?:so,?\s+)?the answer is:?\s*", re.IGNORECASE)


def is_chain_of_thought(trace: StructuredTrace) -> bool:
    """True for traces made only of reasoning steps (no tool calls)."""
    return bool(trace.steps) and all(s.tool_name is None and s.kind is not StepKind.TOOL_CALL for s in trace.steps)


class ReasoningReplayAdapter(ReplayAdapterBase):
    """Replays a chain-of-thought trace with ``llm`` as the agent, greedily (its configured temperature, 0 by
    default: ``deterministic``). ``prefix_verified`` holds because the request is built from the kept steps
    verbatim, and checked so before sending. ``propose`` samples the next thought alone."""

    def __init__(self, llm: StructuredLLM, *, task_context: str = "", deterministic: bool = True) -> None:
        self.llm = llm
        self.task_context = task_context
        self.deterministic = deterministic

    @classmethod
    def for_trace(cls, trace: StructuredTrace, llm: StructuredLLM) -> ReasoningReplayAdapter | None:
        """Entry-point factory: claims chain-of-thought traces."""
        return cls(llm) if is_chain_of_thought(trace) else None

    def with_task_context(self, text: str) -> ReasoningReplayAdapter:
        """This adapter, its agent told the task too (see :class:`~reflect_otel.replay.TakesTaskContext`)."""
        return ReasoningReplayAdapter(self.llm, task_context=text, deterministic=self.deterministic)

    def _messages(self, request: ReplayRequest, thought: list[str]) -> list[ChatMessage]:
        trace, injection = request.trace, request.injection
        check_rollback_point(trace, request.rollback_point)
        if not is_chain_of_thought(trace):
            raise ReplayError("ReasoningReplayAdapter replays chain-of-thought traces only (this one calls tools)")
        kept = trace.steps[: request.rollback_point]
        question = trace.question + (f"\n\nTask: {self.task_context}" if self.task_context else "")
        messages = [
            ChatMessage(role="system", content=CHAIN_OF_THOUGHT_PROMPT),
            ChatMessage(role="user", content=question),
        ]
        if kept:
            messages.append(ChatMessage(role="assistant", content="\n".join(s.reasoning for s in kept)))
        if injection:
            messages.append(ChatMessage(role=request.injection_role.value, content=injection))
        if thought and messages[-1].role == "assistant":  # the replacement thought continues the kept ones
            messages[-1] = ChatMessage(role="assistant", content=f"{messages[-1].content}\n{thought[0]}")
        elif thought:
            messages.append(ChatMessage(role="assistant", content=thought[0]))
        messages.append(ChatMessage(role="user", content="Continue the reasoning from here, then give the answer."))
        return messages

    def propose(self, request: ReplayRequest, *, samples: int = 1) -> tuple[ProposedStep, ...]:
        """The next thought as the model would write it (the first line of its continuation), ``samples`` times;
        a continuation that goes straight to the answer is a final answer."""
        messages = self._messages(request, [])
        proposals = []
        for _ in range(samples):
            out = self._complete(messages, request.proposal_temperature)
            lines = [line.strip() for text in out.steps for line in text.splitlines() if line.strip()]
            if lines:
                proposals.append(ProposedStep(action=StepAction(text=lines[0])))
            else:
                answer = _ANSWER_LEAD.sub("", out.answer.strip())
                proposals.append(
                    ProposedStep(action=StepAction(text=f"So the answer is {answer}"), is_final_answer=True)
                )
        return tuple(proposals)

    def _complete(self, messages: list[ChatMessage], temperature: float | None) -> ReasoningContinuation:
        try:
            return self.llm.complete(
                messages, ReasoningContinuation, stage="agent_replay", temperature=temperature
            ).value
        except LLMError as error:
            raise ReplayError(f"the reasoning model failed: {error}") from None

    def _replay(self, request: ReplayRequest) -> ReplayResult:
        trace, rollback_point, action, temperature = (
            request.trace,
            request.rollback_point,
            request.action,
            request.temperature,
        )
        if action is not None and (action.tool_name is not None or not action.text.strip()):
            raise ReplayError("a chain-of-thought replay takes a replacement thought as its action, not a tool call")
        kept = trace.steps[:rollback_point]
        thought = [action.text.strip()] if action is not None else []
        messages = self._messages(request, thought)
        prefix_verified = all(s.reasoning in messages[2].content for s in kept) if kept else True
        out = self._complete(messages, temperature)
        lines = [*thought, *(line.strip() for text in out.steps for line in text.splitlines() if line.strip())]
        answer = _ANSWER_LEAD.sub("", out.answer.strip())  # models often repeat the lead-in: say it once
        answer_line = f"So the answer is {answer}"
        lines.append(answer_line)
        nonce = uuid.uuid4().hex if temperature else ""  # resamples of one run are different runs
        replay_id = hashlib.sha256(
            f"{trace.trace_id}:{rollback_point}:{request.injection}:{thought}:{nonce}".encode()
        ).hexdigest()
        new_steps = [
            Step(
                index=rollback_point + i,
                span_id=hashlib.sha256(f"{replay_id}:{i}".encode()).hexdigest()[:16],
                kind=StepKind.FINAL_ANSWER if i == len(lines) else StepKind.REASONING,
                reasoning=line,
                is_final_answer=i == len(lines),
            )
            for i, line in enumerate(lines, start=1)
        ]
        replayed = trace.model_copy(
            update={"trace_id": replay_id[:32], "steps": (*kept, *new_steps), "final_answer": answer_line, "labels": ()}
        )
        return ReplayResult(
            trace=replayed,
            rollback_point=rollback_point,
            final_answer=answer_line,
            prefix_verified=prefix_verified,
            adapter_info={"adapter": "reasoning", "model": self.llm.model_name},
        )
