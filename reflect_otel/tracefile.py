"""Traces on disk: one ``StructuredTrace`` JSON object per line (JSONL), appended as traces arrive."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from pydantic import ValidationError

from reflect_otel.errors import InputError
from reflect_otel.trace import StructuredTrace

__all__ = ["TraceWriter", "read_traces"]

MAX_LINE_BYTES = 64 * 1024 * 1024


class TraceWriter:
    """Appends traces to a JSONL file; thread-safe; each line is flushed whole so a crash loses no written trace."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self.written = 0

    def write(self, trace: StructuredTrace) -> None:
        line = trace.model_dump_json() + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self.written += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_traces(path: str | Path) -> Iterator[StructuredTrace]:
    """Traces from a JSONL file written by ``reflect-otel collect`` or ``import``.

    Raises :class:`InputError` naming the line of the first invalid trace.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file; write one with 'reflect-otel collect' or 'reflect-otel import'")
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise InputError(f"{path}:{number}: line is over {MAX_LINE_BYTES} bytes")
            if not raw.strip():
                continue
            try:
                yield StructuredTrace.model_validate_json(raw)
            except ValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise InputError(f"{path}:{number}: not a StructuredTrace ({where}: {first['msg']})") from None
