"""The LLM layer: one contract (:class:`StructuredLLM`), one module per backend (``openai_compat``, ``local``),
and wrappers beside them (``recording``: every call logged, and an agent's calls for an attribution; ``budget``:
token caps).

Backends are chosen by name (entry-point group ``reflect_otel.llm``); :func:`make_llm` picks the configured
endpoint, or starts the local llama.cpp server when none is configured.
"""

from __future__ import annotations

from reflect_otel.llm.base import ChatMessage, Completion, LLMUsage, StructuredLLM, complete_with_repair
from reflect_otel.llm.budget import BudgetedLLM, TokenBudget
from reflect_otel.llm.factory import make_llm
from reflect_otel.llm.recording import AgentCallRecorder, CallLog, RecordingLLM, recording_agent_calls

__all__ = [
    "AgentCallRecorder",
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
    "recording_agent_calls",
]
