"""The LLM layer: one contract (:class:`StructuredLLM`), one module per backend (``openai_compat``, ``local``),
and wrappers beside them (``recording``: every call logged; ``budget``: token caps).

Backends are chosen by name (entry-point group ``reflect_otel.llm``); :func:`make_llm` picks the configured
endpoint, or starts the local llama.cpp server when none is configured.
"""

from __future__ import annotations

from reflect_otel.llm.base import ChatMessage, Completion, LLMUsage, StructuredLLM, complete_with_repair
from reflect_otel.llm.budget import BudgetedLLM, TokenBudget
from reflect_otel.llm.factory import make_llm
from reflect_otel.llm.recording import CallLog, RecordingLLM

__all__ = [
    "BudgetedLLM",
    "CallLog",
    "ChatMessage",
    "Completion",
    "LLMUsage",
    "RecordingLLM",
    "StructuredLLM",
    "TokenBudget",
    "complete_with_repair",
    "make_llm",
]
