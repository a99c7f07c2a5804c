"""Collectors turn spans into ``StructuredTrace`` objects. Installed as ``reflect_otel.collectors``."""

from __future__ import annotations

__all__: list[str] = []
