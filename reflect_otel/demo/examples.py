"""Small example traces shipped with the package (``data/examples/``; see its NOTICE.md for their origin)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["example_path"]


def example_path(name: str) -> Path:
    """Filesystem path of a bundled example file, e.g. ``langgraph_agent.otlp.json``."""
    return Path(str(files("reflect_otel.demo").joinpath("data", "examples", name)))
