"""JSON files written by hand or by other tools: tolerate a trailing comma, nothing more."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from reflect_otel.errors import InputError

_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def load_json_file(path: Path, *, max_bytes: int) -> Any:
    """Parse ``path``; on a syntax error retry once with trailing commas removed. Raises :class:`InputError`."""
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"{path}: {size} bytes is over the {max_bytes}-byte limit; raise --max-file-bytes to read it")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        try:
            return json.loads(_TRAILING_COMMA.sub(r"\1", text))
        except json.JSONDecodeError:
            raise InputError(f"{path}: not valid JSON ({first.msg} at line {first.lineno})") from None
