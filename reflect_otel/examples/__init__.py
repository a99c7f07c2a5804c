"""Small example data shipped with the package (made by our own test agents; no third-party content)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["example_path"]


def example_path(name: str) -> Path:
    """Filesystem path of a bundled example file."""
    return Path(str(files(__name__).joinpath(name)))
