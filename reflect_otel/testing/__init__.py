"""Test doubles shipped with the library, named as doubles: a scripted LLM, a scripted replay adapter and trace
builders. They exercise reflect-otel's own logic deterministically; real parts are tested with real parts."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel

from reflect_otel.attribution.corrections import Rule
from reflect_otel.errors import LLMError, ReplayError
from reflect_otel.llm.base import ChatMessage, Check, Completion, LLMUsage, OutputT, complete_with_repair
from reflect_otel.replay import InjectionRole, ProposedStep, ReplayRequest, ReplayResult, check_rollback_point
from reflect_otel.trace import Step, StepAction, StepKind, StructuredTrace

__all__ = [
    "ScriptedLLM",
    "ScriptedProposingAdapter",
    "ScriptedReplayAdapter",
    "ScriptedReplayCall",
    "ScriptedRequest",
    "ScriptedResampler",
    "TraceSink",
    "make_step",
    "make_trace",
    "wait_until",
]

Response = Union[str, Mapping[str, Any], BaseModel, Exception]  # noqa: UP007 - a runtime alias


@dataclass(frozen=True, slots=True)
class ScriptedRequest:
    """What the scripted model was asked: the stage, the whole conversation, the output model's name."""

    stage: str
    messages: tuple[ChatMessage, ...]
    output: str
    temperature: float | None = None
    """The temperature the caller asked this call to sample at (None: the model's configured one)."""

    @property
    def text(self) -> str:
        return "\n".join(m.content for m in self.messages)


class ScriptedLLM:
    """A :class:`~reflect_otel.llm.StructuredLLM` double. Replies come from ``by_stage[stage]`` queues, then the
    shared ``responses`` queue, then ``respond(request)``. A reply is JSON text (sent as is, so malformed text
    exercises the repair retry), a mapping or model (sent as JSON), or an exception (raised). Usage is
    deterministic: a token per four characters."""

    def __init__(
        self,
        responses: Iterable[Response] = (),
        *,
        by_stage: Mapping[str, Iterable[Response]] | None = None,
        respond: Callable[[ScriptedRequest], Response] | None = None,
        model_name: str = "scripted-llm",
    ) -> None:
        self.model_name = model_name
        self._queue: deque[Response] = deque(responses)
        self._by_stage = {stage: deque(items) for stage, items in (by_stage or {}).items()}
        self._respond = respond
        self._lock = threading.Lock()
        self.requests: list[ScriptedRequest] = []

    def complete(
        self,
        messages: Sequence[ChatMessage],
        output: type[OutputT],
        *,
        stage: str,
        check: Check[OutputT] | None = None,
        temperature: float | None = None,
    ) -> Completion[OutputT]:
        def send(conversation: list[ChatMessage]) -> tuple[str, LLMUsage]:
            request = ScriptedRequest(
                stage=stage, messages=tuple(conversation), output=output.__name__, temperature=temperature
            )
            with self._lock:
                self.requests.append(request)
                reply = self._next(request)
            if isinstance(reply, Exception):
                raise reply
            if isinstance(reply, BaseModel):
                text = reply.model_dump_json()
            elif isinstance(reply, Mapping):
                text = json.dumps(reply)
            else:
                text = reply
            prompt_chars = sum(len(m.content) for m in conversation)
            return text, LLMUsage(prompt_tokens=prompt_chars // 4, completion_tokens=max(1, len(text) // 4))

        return complete_with_repair(send, messages, output, check)

    def _next(self, request: ScriptedRequest) -> Response:
        queue = self._by_stage.get(request.stage)
        if queue:
            return queue.popleft()
        if self._queue:
            return self._queue.popleft()
        if self._respond is not None:
            return self._respond(request)
        return LLMError(f"ScriptedLLM has no reply left for stage {request.stage!r}")

    def stages(self) -> list[str]:
        return [r.stage for r in self.requests]


@dataclass(frozen=True, slots=True)
class ScriptedReplayCall:
    rollback_point: int
    injection: str
    injection_role: InjectionRole
    action: StepAction | None = None


Continuation = Callable[[StructuredTrace, int, str], Sequence[Step | Mapping[str, Any]]]


class ScriptedReplayAdapter:
    """A :class:`~reflect_otel.replay.ReplayAdapter` double: ``continue_with(trace, rollback_point, injection)``
    returns the new steps after the kept prefix (the last one's text or tool answer is the final answer). An action
    is executed by ``tools[name](**arguments)`` (a replacement thought needs no tool), appended as the first new
    step, and ``continue_with`` is called with the trace up to and including it."""

    def __init__(
        self,
        continue_with: Continuation,
        *,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        deterministic: bool = False,
        correction_rules: Sequence[Rule] = (),
    ) -> None:
        self._continue = continue_with
        self._tools = dict(tools or {})
        self.deterministic = deterministic
        """Whether its continuations stand for a greedy agent (see :class:`~reflect_otel.replay.ReplayAdapter`)."""
        self.correction_rules = tuple(correction_rules)
        """The agent's own evidence rules (see :class:`~reflect_otel.replay.HasCorrectionRules`)."""
        self.calls: list[ScriptedReplayCall] = []

    def replay(self, request: ReplayRequest) -> ReplayResult:
        trace, rollback_point, injection, action = (
            request.trace,
            request.rollback_point,
            request.injection,
            request.action,
        )
        check_rollback_point(trace, rollback_point)
        self.calls.append(ScriptedReplayCall(rollback_point, injection, request.injection_role, action))
        executed = [self._execute(action)] if action is not None else []
        kept = list(trace.steps[:rollback_point])
        so_far = trace.model_copy(
            update={"steps": (*kept, *(_as_step(s, index=len(kept) + 1, trace_id="a") for s in executed))}
        )
        new = [*executed, *self._continue(so_far, rollback_point + len(executed), injection)]
        if not new:
            raise ReplayError("the scripted agent produced no steps")
        steps = kept + [_as_step(s, index=len(kept) + i, trace_id=trace.trace_id) for i, s in enumerate(new, start=1)]
        last = steps[-1]
        answer = last.tool_args.get("answer") if last.tool_name == "final_answer" else last.reasoning
        replayed = trace.model_copy(
            update={
                "trace_id": f"{trace.trace_id[:24]}{len(self.calls):08x}",
                "steps": tuple(steps),
                "final_answer": str(answer) if answer is not None else None,
            }
        )
        return ReplayResult(
            trace=replayed,
            rollback_point=rollback_point,
            final_answer=replayed.final_answer,
            prefix_verified=True,
            adapter_info={"adapter": "scripted"},
        )

    def _execute(self, action: StepAction) -> dict[str, Any]:
        if action.tool_name is None:
            return {"reasoning": action.text}
        if action.tool_name not in self._tools:
            raise ReplayError(f"the scripted agent has no tool {action.tool_name!r}")
        result = self._tools[action.tool_name](**action.arguments)
        return {"tool": action.tool_name, "args": dict(action.arguments), "result": str(result)}


Proposal = Callable[[StructuredTrace, int, str, int, float], "ProposedStep | StepAction | Mapping[str, Any]"]
"""``propose_with(trace, rollback_point, injection, sample, temperature)``: the agent's next decision, not
executed: a :class:`ProposedStep`, a :class:`StepAction`, or a mapping (``tool``/``args``, ``text``, ``final``)."""


@dataclass(frozen=True, slots=True)
class ScriptedProposal:
    rollback_point: int
    injection: str
    samples: int
    temperature: float


class ScriptedProposingAdapter(ScriptedReplayAdapter):
    """A :class:`ScriptedReplayAdapter` that can also propose the agent's next step
    (:class:`~reflect_otel.replay.ProposesSteps`) through ``propose_with``."""

    def __init__(
        self,
        continue_with: Continuation,
        propose_with: Proposal,
        *,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        deterministic: bool = False,
    ) -> None:
        super().__init__(continue_with, tools=tools, deterministic=deterministic)
        self._propose = propose_with
        self.proposals: list[ScriptedProposal] = []

    def propose(self, request: ReplayRequest, *, samples: int = 1) -> tuple[ProposedStep, ...]:
        trace, rollback_point, injection = request.trace, request.rollback_point, request.injection
        temperature = request.proposal_temperature
        check_rollback_point(trace, rollback_point)
        self.proposals.append(ScriptedProposal(rollback_point, injection, samples, temperature))
        return tuple(_proposed(self._propose(trace, rollback_point, injection, i, temperature)) for i in range(samples))


def _proposed(value: ProposedStep | StepAction | Mapping[str, Any]) -> ProposedStep:
    if isinstance(value, ProposedStep):
        return value
    if isinstance(value, StepAction):
        return ProposedStep(action=value)
    if value.get("final"):
        return ProposedStep(action=StepAction(text=str(value["final"])), is_final_answer=True)
    if "tool" in value:
        return ProposedStep(action=StepAction(tool_name=str(value["tool"]), arguments=dict(value.get("args", {}))))
    return ProposedStep(action=StepAction(text=str(value.get("text", ""))))


def _as_step(value: Step | Mapping[str, Any], *, index: int, trace_id: str) -> Step:
    if isinstance(value, Step):
        return value.model_copy(update={"index": index})
    digest = hashlib.sha256(f"{trace_id}:{index}:replay".encode()).hexdigest()[:16]
    return make_step(index, span_id=digest, **value)


def make_step(index: int, *, span_id: str | None = None, **fields: Any) -> Step:
    """A step with sensible defaults: ``tool`` / ``args`` / ``result`` are shorthands for the tool fields."""
    if "tool" in fields:
        fields["tool_name"] = fields.pop("tool")
    if "args" in fields:
        fields["tool_args"] = fields.pop("args")
    if "result" in fields:
        fields["tool_result"] = fields.pop("result")
    fields.setdefault("kind", StepKind.TOOL_CALL if fields.get("tool_name") else StepKind.REASONING)
    return Step(index=index, span_id=span_id or f"{index:016x}", **fields)


def make_trace(
    question: str,
    steps: Sequence[Mapping[str, Any]],
    *,
    final_answer: str | None = None,
    trace_id: str = "0" * 31 + "1",
) -> StructuredTrace:
    """A trace from step field mappings; the final answer defaults to the last step's reasoning."""
    built = [make_step(i, **dict(s)) for i, s in enumerate(steps, start=1)]
    answer = final_answer if final_answer is not None else (built[-1].reasoning if built else None)
    return StructuredTrace(trace_id=trace_id, question=question, final_answer=answer, steps=tuple(built))


class ScriptedResampler(ScriptedReplayAdapter):
    """A replay adapter double that can also resample runs (:class:`~reflect_otel.replay.SamplesRuns`):
    ``resample_with(trace, sample, temperature)`` gives each resampled run's steps from the start (the last one's text
    or ``final_answer`` call is its answer), or raises :class:`ReplayError`; ``sample`` counts the runs this double
    has resampled, from 0, over every call. ``resampled`` counts the runs."""

    def __init__(
        self,
        resample_with: Callable[[StructuredTrace, int, float], Sequence[Step | Mapping[str, Any]]],
        continue_with: Continuation | None = None,
        **options: Any,
    ) -> None:
        super().__init__(continue_with or (lambda _t, _p, _i: resample_with(_t, 0, 0.0)), **options)
        self._resample = resample_with
        self.resampled: list[float] = []

    def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
        trace, temperature = request.trace, request.proposal_temperature
        runs = []
        for _ in range(samples):
            sample = len(self.resampled)  # counted over every call (a check asks for one run at a time)
            self.resampled.append(temperature)
            new = list(self._resample(trace, sample, temperature))
            steps = tuple(_as_step(s, index=i, trace_id=trace.trace_id) for i, s in enumerate(new, start=1))
            last = steps[-1] if steps else None
            answer = (
                (last.tool_args.get("answer") if last.tool_name == "final_answer" else last.reasoning) if last else None
            )
            rerun = trace.model_copy(
                update={
                    "trace_id": f"{trace.trace_id[:24]}{len(self.resampled):08x}",
                    "steps": steps,
                    "final_answer": str(answer) if answer is not None else None,
                }
            )
            runs.append(
                ReplayResult(trace=rerun, rollback_point=0, final_answer=rerun.final_answer, prefix_verified=True)
            )
        return tuple(runs)


class TraceSink:
    """A trace sink for collectors and receivers under test: keeps each trace by id, safe to call from their
    worker threads. ``traces`` is a snapshot."""

    def __init__(self) -> None:
        self._traces: dict[str, StructuredTrace] = {}
        self._lock = threading.Lock()

    def __call__(self, trace: StructuredTrace) -> None:
        with self._lock:
            self._traces[trace.trace_id] = trace

    @property
    def traces(self) -> dict[str, StructuredTrace]:
        with self._lock:
            return dict(self._traces)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait for ``condition`` (checked every 20 ms) instead of sleeping a fixed time and hoping; fail naming
    ``what`` was awaited when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s} s for {what}")
        time.sleep(0.02)
