"""The base of every wrapper around a model (recording, budgets, patience, lazy start)."""

from __future__ import annotations

from reflect_otel.llm.base import Completion, LLMBase, LLMRequest, OutputT, StructuredLLM

__all__ = ["WrapperLLM"]


class WrapperLLM(LLMBase):
    """A model around ``inner``: it serves ``inner``'s model and passes each call on to it. A wrapper overrides
    :meth:`answer` for what it adds around the call. ``model_name`` is read from ``inner`` when asked: wrapping a
    lazily made model does not make it (a run judged with no model call never starts one)."""

    def __init__(self, inner: StructuredLLM) -> None:
        self._inner = inner

    @property
    def inner(self) -> StructuredLLM:
        return self._inner

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    def answer(self, request: LLMRequest[OutputT]) -> Completion[OutputT]:
        return request.to(self.inner)
