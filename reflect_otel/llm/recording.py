"""A wrapper that records every call of a backend, failed ones included, under the stage that made it."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from reflect_otel.errors import LLMError
from reflect_otel.llm.base import ChatMessage, Check, Completion, LLMOutputError, LLMUsage, OutputT, StructuredLLM
from reflect_otel.record import LLMCall

__all__ = ["CallLog", "RecordingLLM"]


class CallLog:
    """Thread-safe list of :class:`LLMCall` s for one attribution run."""

    def __init__(self) -> None:
        self._calls: list[LLMCall] = []
        self._lock = threading.Lock()

    def add(self, call: LLMCall) -> None:
        with self._lock:
            self._calls.append(call)

    @property
    def calls(self) -> tuple[LLMCall, ...]:
        with self._lock:
            return tuple(self._calls)


class RecordingLLM:
    """Wraps a backend so every call, failed ones included, lands in a :class:`CallLog` under its stage."""

    def __init__(self, inner: StructuredLLM, log: CallLog, *, stage: str | None = None) -> None:
        self.inner = inner
        self.log = log
        self.model_name = inner.model_name
        self.stage = stage
        """When set, every call is logged under this stage, whatever stage the caller named (an agent's calls)."""

    def complete(
        self,
        messages: Sequence[ChatMessage],
        output: type[OutputT],
        *,
        stage: str,
        check: Check[OutputT] | None = None,
        temperature: float | None = None,
    ) -> Completion[OutputT]:
        start = time.perf_counter()
        logged = self.stage or stage
        try:
            completion = self.inner.complete(messages, output, stage=stage, check=check, temperature=temperature)
        except LLMOutputError as error:
            self.log.add(self._call(logged, error.usage, time.perf_counter() - start, error.attempts, str(error)))
            raise
        except LLMError as error:
            self.log.add(self._call(logged, LLMUsage(), time.perf_counter() - start, 1, str(error)))
            raise
        self.log.add(self._call(logged, completion.usage, time.perf_counter() - start, completion.attempts, None))
        return completion

    def _call(self, stage: str, usage: LLMUsage, seconds: float, attempts: int, error: str | None) -> LLMCall:
        return LLMCall(
            stage=stage,
            model=self.model_name,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_prompt_tokens=usage.cached_prompt_tokens,
            seconds=round(seconds, 6),
            attempts=attempts,
            ok=error is None,
            error=error,
        )
