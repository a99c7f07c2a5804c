"""Replay adapters that re-run an agent from a preserved prefix. Installed as ``reflect_otel.replay_adapters``."""

from __future__ import annotations

__all__: list[str] = []
