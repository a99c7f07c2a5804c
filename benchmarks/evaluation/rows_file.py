"""The results file of a resumable evaluation, appended a row (one JSON line) at a time, each flushed.

A run holds its results file open for hours. A git checkout, stash or an editor that saves by rename replaces the
file under it: the run's rows would go on into the unlinked old file, which nobody can read once the run ends.
Before each row, :class:`RowsFile` checks that the path still names the file it appends to; if not, it saves
everything it wrote (the old file's whole content, and the row) beside it as ``<name>.orphaned-<UTC time>`` and
stops the run with an error naming that file and the fix. Nothing written is lost.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from reflect_otel.errors import InputError


class RowsFile:
    """``with RowsFile(path) as rows: rows.append(row)``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a+", encoding="utf-8")  # readable too: the content is saved if the path is replaced
        status = os.fstat(self._file.fileno())
        self._identity = (status.st_dev, status.st_ino)

    def append(self, row: dict[str, Any]) -> None:
        line = json.dumps(row) + "\n"
        if not self._still_at_path():
            orphaned = self._save_orphaned(line)
            raise InputError(
                f"{self.path} was replaced or removed while this run appended to it (a git checkout or stash, an "
                f"editor?). Everything this run's file held, and the row being written, is in {orphaned}: if the "
                f"file now at {self.path} is a prefix of it, move it into place (mv {orphaned} {self.path}) and "
                "resume; the run resumes from the rows in the file."
            )
        self._file.write(line)
        self._file.flush()

    def _still_at_path(self) -> bool:
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (status.st_dev, status.st_ino) == self._identity

    def _save_orphaned(self, line: str) -> Path:
        self._file.flush()
        self._file.seek(0)
        content = self._file.read()
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        orphaned = self.path.with_name(f"{self.path.name}.orphaned-{stamp}")
        orphaned.write_text(content + line, encoding="utf-8")
        return orphaned

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RowsFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
