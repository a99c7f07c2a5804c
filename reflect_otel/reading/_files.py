"""Files the tool reads and writes, handled so that a mistake or an interruption never loses what a file held.

Every file a command writes whole (records, traces from ``import``, an HTML report, a chart) is written to a
temporary file beside it and renamed over it only when complete (:func:`replaced_on_success`): until then the
old file is untouched, and a failure or Ctrl-C removes the temporary file. A file of lines written one by one
(records, traces) keeps what finished when the command fails: the lines go to a side file,
``NAME.partial.jsonl`` (:func:`lines_replaced_on_success`). A file that grows (the collector's JSONL) is only
ever appended to. Paths are checked before any work (:func:`check_output_file`,
:func:`check_input_file`), with a message that names the fix.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from reflect_otel.errors import InputError

__all__ = [
    "LinesOut",
    "check_input_file",
    "check_output_file",
    "lines_replaced_on_success",
    "partial_path",
    "replaced_on_success",
    "write_text_atomically",
]


def _named(flag: str, path: Path) -> str:
    return f"{flag} {path}" if flag else str(path)


def check_output_file(path: Path, *, flag: str = "", example: str = "out.jsonl") -> Path:
    """``path`` when a file can be written there; else :class:`InputError` naming the fix: ``path`` is a folder,
    a folder on the way is a file, the nearest existing folder may not be written in, or the file is read-only.
    Folders that do not exist yet are fine (the writers create them)."""
    named = _named(flag, path)
    if path.is_dir():
        raise InputError(f"{named}: is a folder; name a file in it, e.g. {_named(flag, path / example)}")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{named}: {parent} is a file, not a folder; choose another place for the output")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{named}: cannot write in {parent} (permission denied); choose another folder")
    if path.exists() and not path.is_file():
        raise InputError(f"{named}: is not a regular file; choose another path")
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{named}: the file is read-only; make it writable or choose another path")
    return path


def check_input_file(path: Path, *, flag: str = "", what: str = "file", hint: str = "") -> Path:
    """``path`` when it is a readable regular file; else :class:`InputError` saying what it is instead (missing,
    a folder, not readable) and, with ``hint``, how to get the right file."""
    named = _named(flag, path)
    tail = f"; {hint}" if hint else ""
    if path.is_dir():
        raise InputError(f"{named}: is a folder; name a {what} in it")
    if not path.exists():
        raise InputError(f"{named}: no such {what}{tail}")
    if not path.is_file():
        raise InputError(f"{named}: is not a regular file (a device or a pipe?); name a {what}")
    if not os.access(path, os.R_OK):
        raise InputError(f"{named}: cannot read it (permission denied); make it readable or copy it")
    return path


_umask_lock = threading.Lock()


def _new_file_mode() -> int:
    """The mode a file created with ``open()`` gets here (0666 less the umask); ``mkstemp`` makes 0600."""
    with _umask_lock:  # umask can only be read by setting it
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def replaced_on_success(path: Path, *, flag: str = "") -> Iterator[TextIO]:
    """A text file to write ``path``'s new content into: a temporary file beside it (same folder, so the rename is
    atomic), renamed over ``path`` when the block ends without an exception (after an fsync), removed otherwise,
    so that ``path`` keeps whatever it held. Folders on the way are created. The new file keeps the old one's
    permissions (a new one gets the usual ``0666 & ~umask``)."""
    check_output_file(path, flag=flag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise InputError(f"{_named(flag, path)}: cannot create a file there ({error.strerror})") from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else _new_file_mode()
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_text_atomically(path: Path, text: str, *, flag: str = "") -> None:
    """Write ``text`` to ``path`` through :func:`replaced_on_success`."""
    with replaced_on_success(path, flag=flag) as file:
        file.write(text)


def partial_path(path: Path) -> Path:
    """Where the lines a failed command finished go: ``records.jsonl`` -> ``records.partial.jsonl``."""
    return path.with_name(f"{path.stem}.partial{path.suffix}" if path.suffix else f"{path.name}.partial")


class LinesOut:
    """The lines a command writes into its output (see :func:`lines_replaced_on_success`): through
    ``write_line``, or into ``file`` by a writer of its own, which then sets ``lines``. ``fail(reason)`` marks the
    command failed though it ran to its end; ``aside`` is where the lines went then (None when nothing was
    written, or the command succeeded)."""

    def __init__(self, file: TextIO, path: Path) -> None:
        self.file = file
        self.path = path
        self.lines = 0
        self.failure: str | None = None
        self.aside: Path | None = None

    def write_line(self, text: str) -> None:
        self.file.write(text if text.endswith("\n") else text + "\n")
        self.lines += 1

    def fail(self, reason: str) -> None:
        self.failure = reason

    def kept(self, what: str = "line(s)") -> str:
        """What became of the output after a failure, for the user: the file left as it was (or not written), and
        where the ``what`` that finished are."""
        left = f"{self.path} was left as it was" if self.path.exists() else f"{self.path} was not written"
        if self.aside is None:
            return left
        return f"{left}; the {self.lines} {what} that finished are in {self.aside}"


@contextlib.contextmanager
def lines_replaced_on_success(path: Path, *, flag: str = "") -> Iterator[LinesOut]:
    """:func:`replaced_on_success` for a file of lines: ``path`` is replaced only when the block ends without an
    exception and without ``fail()``; otherwise it keeps what it held, and the lines written (if any) go to
    :func:`partial_path` (replacing an older one), named by ``LinesOut.aside``; with none, no file is left."""
    check_output_file(path, flag=flag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise InputError(f"{_named(flag, path)}: cannot create a file there ({error.strerror})") from None
    out: LinesOut | None = None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            out = LinesOut(file, path)
            try:
                yield out
            finally:
                file.flush()
                os.fsync(file.fileno())
        target = path if out.failure is None else partial_path(path)
    except BaseException:
        if out is not None and out.lines:
            _rename(temporary, partial_path(path))
            out.aside = partial_path(path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        raise
    if target == path or out.lines:
        _rename(temporary, target)
        out.aside = None if target == path else target
    else:
        os.unlink(temporary)


def _rename(temporary: str, target: Path) -> None:
    """The temporary file renamed over ``target``, with the old file's permissions (a new one: ``0666 & ~umask``)."""
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else _new_file_mode()
    os.chmod(temporary, mode)
    os.replace(temporary, target)
