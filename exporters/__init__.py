"""Where attribution records go (spans, DuckDB, Phoenix, metrics). Installed as ``reflect_otel.exporters``."""

from __future__ import annotations

__all__: list[str] = []
