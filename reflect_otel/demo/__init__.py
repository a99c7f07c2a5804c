"""Demo agents shipped with the package: a table-QA agent on LangGraph over WikiTableQuestions tables, and a
chain-of-thought agent for BIG-Bench-Mistake style tasks. Both run with any OpenAI-compatible model."""

from __future__ import annotations

__all__: list[str] = []
