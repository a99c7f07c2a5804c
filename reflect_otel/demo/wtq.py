"""The WikiTableQuestions sample shipped in ``demo/data/wtq`` (CC BY-SA 4.0; see its NOTICE.md)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from reflect_otel.errors import InputError

__all__ = ["DEMO_QUESTIONS", "WTQQuestion", "load_questions", "read_table", "unescape"]

_DATA = Path(str(files("reflect_otel.demo").joinpath("data", "wtq")))
MAX_TABLE_BYTES = 5 * 1024 * 1024

DEMO_QUESTIONS: tuple[str, ...] = ("nt-1",)
"""The question ``reflect-otel demo`` runs by default: a silent failure that a controlled replay proves in minutes on
2 cores (``--questions`` runs others; see the README)."""


@dataclass(frozen=True, slots=True)
class WTQQuestion:
    id: str
    question: str
    table: Path
    answers: tuple[str, ...]

    @property
    def expected(self) -> str:
        """The answers as the oracle verifier takes several: joined with ``|``."""
        return "|".join(self.answers)


def unescape(cell: str) -> str:
    """WTQ's TSV escapes: ``\\n`` newline, ``\\p`` a literal pipe, ``\\\\`` a backslash."""
    out, i = [], 0
    while i < len(cell):
        if cell[i] == "\\" and i + 1 < len(cell):
            out.append({"n": "\n", "p": "|", "\\": "\\"}.get(cell[i + 1], cell[i + 1]))
            i += 2
        else:
            out.append(cell[i])
            i += 1
    return "".join(out)


def _split_answers(target: str) -> tuple[str, ...]:
    # several answers are separated by an unescaped pipe; \p is a literal one
    parts = target.replace("\\p", "\x00").split("|")
    return tuple(unescape(part.replace("\x00", "\\p")) for part in parts)


def _table_path(data: Path, field: str, where: str) -> Path:
    """The shipped sample names a file in ``tables/``; WikiTableQuestions itself names ``csv/204-csv/622.csv``, whose
    ``.tsv`` twin beside it is the cleaner file to parse."""
    if "/" not in field and "\\" not in field:
        return data / "tables" / field
    path = (data / field).with_suffix(".tsv")
    if data.resolve() not in path.resolve().parents:
        raise InputError(f"{where}: table path {field!r} leaves {data}")
    return path


def load_questions(limit: int | None = None, *, data: Path = _DATA) -> list[WTQQuestion]:
    """The questions of ``data/questions.tsv`` (the shipped sample by default; or a WikiTableQuestions folder such
    as ``../shared/data/wtq``), in file order."""
    path = data / "questions.tsv"
    if not path.is_file():
        raise InputError(f"{path}: no such file; point at a folder holding WikiTableQuestions' questions.tsv")
    lines = path.read_text(encoding="utf-8").splitlines()
    questions = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise InputError(f"{path}:{number}: expected 4 tab-separated fields")
        qid, question, table, target = fields
        table_path = _table_path(data, table, f"{path}:{number}")
        questions.append(WTQQuestion(qid, unescape(question), table_path, _split_answers(target)))
    return questions[:limit]


def read_table(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a WTQ ``.tsv`` table, unescaped; ragged rows are padded or cut to the header."""
    if path.stat().st_size > MAX_TABLE_BYTES:
        raise InputError(f"{path}: table over {MAX_TABLE_BYTES} bytes")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if not lines:
        raise InputError(f"{path}: empty table")
    header = [unescape(c).strip() for c in lines[0].split("\t")]
    rows = []
    for line in lines[1:]:
        cells = [unescape(c) for c in line.split("\t")]
        rows.append((cells + [""] * len(header))[: len(header)])
    return header, rows
