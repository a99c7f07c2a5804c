"""Token budgets: a cap per hour shared by every attribution, and a cap per attribution."""

from __future__ import annotations

import threading
import time
from collections import deque

from reflect_otel.errors import LLMError
from reflect_otel.llm.base import Completion, LLMOutputError, LLMRequest, LLMUsage, OutputT, StructuredLLM
from reflect_otel.llm.wrapper import WrapperLLM

__all__ = ["BudgetedLLM", "TokenBudget"]


class TokenBudget:
    """Tokens spent in the last hour, and a cap per trace; thread-safe."""

    def __init__(self, per_trace: int, per_hour: int) -> None:
        self.per_trace = per_trace
        self.per_hour = per_hour
        self._spent: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def spent_last_hour(self) -> int:
        cutoff = time.monotonic() - 3600
        with self._lock:
            while self._spent and self._spent[0][0] < cutoff:
                self._spent.popleft()
            return sum(tokens for _, tokens in self._spent)

    @property
    def hour_is_spent(self) -> bool:
        return self.spent_last_hour() >= self.per_hour

    def spend(self, tokens: int) -> None:
        with self._lock:
            self._spent.append((time.monotonic(), tokens))


class BudgetedLLM(WrapperLLM):
    """Refuses further calls once one attribution has used ``budget.per_trace`` tokens (raising :class:`LLMError`,
    which the method records as a stage error); every token spent also counts against the hourly budget."""

    def __init__(self, inner: StructuredLLM, budget: TokenBudget) -> None:
        super().__init__(inner)
        self.limit = budget.per_trace
        self.budget = budget
        self.used = 0

    def answer(self, request: LLMRequest[OutputT]) -> Completion[OutputT]:
        if self.used >= self.limit:
            raise LLMError(f"the token budget for one trace ({self.limit}) is spent; raise max_tokens_per_trace")
        try:
            completion = request.to(self.inner)
        except LLMOutputError as error:  # the replies were paid for even though none could be used
            self._spend(error.usage)
            raise
        self._spend(completion.usage)
        return completion

    def _spend(self, usage: LLMUsage) -> None:
        tokens = usage.prompt_tokens + usage.completion_tokens
        self.used += tokens
        self.budget.spend(tokens)
