"""Collectors turn spans into :class:`~reflect_otel.StructuredTrace` objects. Installed as ``reflect_otel.collectors``."""

from __future__ import annotations

__all__: list[str] = []
