"""The LLM layer: one contract (:class:`StructuredLLM`), backends beside it, every call recorded.

Backends are found by entry point (group ``reflect_otel.llm``), the built-in ones too; :func:`make_llm` picks the
configured endpoint, or starts the local SmolLM2 server when none is configured.
"""

from __future__ import annotations

from reflect_otel.llm.base import (
    CallLog,
    ChatMessage,
    Completion,
    LLMCall,
    LLMUsage,
    RecordingLLM,
    StructuredLLM,
    complete_with_repair,
)
from reflect_otel.llm.factory import make_llm

__all__ = [
    "CallLog",
    "ChatMessage",
    "Completion",
    "LLMCall",
    "LLMUsage",
    "RecordingLLM",
    "StructuredLLM",
    "complete_with_repair",
    "make_llm",
]
