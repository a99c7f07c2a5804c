"""Every file argument of every command, given every kind of wrong file (issue 42): missing, empty, a folder, random
bytes, files of the other formats the tool knows (a raw TRAIL, BIG-Bench-Mistake or OTLP/JSON file, a records
file, a store), a file it may not read, a path under a file. Whatever the outcome: no traceback, no bug exit, no
temporary file left behind, and no file changed unless the command succeeded in writing it (an exit-2 error
changes nothing at all). Run in process; the whole grid takes a few seconds."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

import pytest

from reflect_otel.cli import main
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.reading._files import partial_path
from reflect_otel.testing.examples import verified_attribution

EXAMPLES = Path(str(files("reflect_otel.demo"))) / "data" / "examples"
TRACE, RECORD = verified_attribution()


def _trail(path: Path) -> None:
    span = {
        "span_id": "a" * 16,
        "parent_span_id": None,
        "timestamp": "2025-01-01T00:00:00Z",
        "span_name": "llm",
        "span_attributes": {"openinference.span.kind": "LLM", "llm.output_messages.0.message.content": "hi"},
        "child_spans": [],
    }
    import json

    path.write_text(json.dumps({"trace_id": "e" * 32, "spans": [span]}, indent=2))


def _store(path: Path) -> None:
    with DuckDBStore(path) as store:
        store.write_trace(TRACE)
        store.write_record(RECORD)


def _no_permission(path: Path) -> None:
    path.write_text(TRACE.model_dump_json() + "\n")
    path.chmod(0)  # (as root this reads anyway; the grid's other invariants still hold)


KINDS: dict[str, Callable[[Path], object] | None] = {
    "missing": None,
    "empty": lambda p: p.write_bytes(b""),
    "folder": lambda p: (p.mkdir(), (p / "inner.jsonl").write_text(TRACE.model_dump_json() + "\n")),
    "random": lambda p: p.write_bytes(random.Random(42).randbytes(4096)),
    "trail": _trail,
    "bbm": lambda p: shutil.copy(EXAMPLES / "bbm" / "multistep_arithmetic.jsonl", p),
    "otlp": lambda p: shutil.copy(EXAMPLES / "langgraph_agent.otlp.json", p),
    "records": lambda p: p.write_text(RECORD.model_dump_json() + "\n"),
    "store": _store,
    "traces": lambda p: p.write_text(TRACE.model_dump_json() + "\n"),
    "no_permission": _no_permission,
    "under_a_file": None,  # X is <a regular file>/arg
}

X = "{X}"
SLOTS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    # name: (argv with X where the fuzzed argument goes, the files this command may write when it succeeds)
    "show": (["show", X], ()),
    "show --records": (["show", "traces.jsonl", "--records", X], ()),
    "attribute traces": (
        ["attribute", X, "-o", "out.jsonl", "--method", "first-step", "--store", "s.duckdb"],
        ("out.jsonl", "s.duckdb"),
    ),
    "attribute -o": (["attribute", "traces.jsonl", "-o", X, "--method", "first-step", "--no-store"], (X,)),
    "attribute --store": (
        ["attribute", "traces.jsonl", "-o", "out.jsonl", "--method", "first-step", "--store", X],
        ("out.jsonl", X),
    ),
    "attribute --expected-file": (
        ["attribute", "traces.jsonl", "-o", "out.jsonl", "--method", "first-step", "--no-store", "--expected-file", X],
        ("out.jsonl",),
    ),
    "attribute --replay-config": (
        ["attribute", "traces.jsonl", "-o", "out.jsonl", "--method", "first-step", "--no-store", "--replay-config", X],
        ("out.jsonl",),
    ),
    "import": (["import", X, "-o", "out.jsonl"], ("out.jsonl",)),
    "import -o": (["import", "--example", "-o", X], (X,)),
    "collect --reingest": (["collect", "--reingest", X, "--store", "s.duckdb"], ("s.duckdb",)),
    "collect --reingest --store": (["collect", "--reingest", "traces.jsonl", "--store", X], (X,)),
    "collect --out": (["collect", "--out", X, "--http", "127.0.0.1:0", "--duration", "0", "--no-store"], (X,)),
    "collect --store": (
        ["collect", "--out", "out.jsonl", "--store", X, "--http", "127.0.0.1:0", "--duration", "0"],
        ("out.jsonl", X),
    ),
    "stats --store": (["stats", "--store", X], ()),
    "sql --store": (["sql", "SELECT count(*) FROM traces", "--store", X], ()),
    "report --store": (["report", TRACE.trace_id[:8], "-o", "r.html", "--store", X], ("r.html",)),
    "report -o": (["report", TRACE.trace_id[:8], "-o", X, "--store", "good.duckdb"], (X,)),
    "eval-compare": (["eval-compare", X], ()),
}


@pytest.fixture(scope="module")
def good_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store") / "good.duckdb"
    _store(path)
    return path


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder``: a file's bytes (None when it cannot be read), a folder as None."""
    found: dict[str, bytes | None] = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        try:
            found[name] = path.read_bytes() if path.is_file() else None
        except PermissionError:
            found[name] = None
    return found


@pytest.mark.parametrize(
    "slot",
    [
        pytest.param(s, marks=pytest.mark.slow) if s.startswith("collect --") and "reingest" not in s else s
        for s in SLOTS
    ],
    # (collect --out and --store start a receiver per case)
)
def test_no_traceback_and_no_lost_file(
    slot: str, tmp_path: Path, good_store: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REFLECT_STORE", raising=False)
    argv, writes = SLOTS[slot]
    for kind, make in KINDS.items():
        case = tmp_path / kind
        case.mkdir()
        monkeypatch.chdir(case)
        (case / "traces.jsonl").write_text(TRACE.model_dump_json() + '\n{"expected_answer": 1}\n')
        shutil.copy(good_store, case / "good.duckdb")
        if kind == "under_a_file":
            (case / "a_file").write_text("not a folder\n")
            argument = "a_file/arg"
        else:
            argument = "arg.json" if kind in ("trail", "otlp") else "arg.jsonl"
            if make is not None:
                make(case / argument)
        before = _snapshot(case)
        full = [argument if a == X else a for a in argv]
        try:
            code = main(full)
        except SystemExit as exit:  # argparse's own usage errors
            code = int(exit.code or 0)
        captured = capsys.readouterr()
        said = captured.out + captured.err
        where = f"{slot} / {kind}: {' '.join(full)} -> exit {code}\n{captured.err[-2000:]}"
        assert "Traceback" not in said, where
        assert code in (0, 1, 2), where
        after = _snapshot(case)
        assert not [name for name in after if name.endswith(".tmp")], where
        if code == 2:
            assert after == before, where  # an error changes nothing
            assert captured.err.strip().splitlines()[-1].startswith(f"reflect-otel {argv[0]}: error: ") or (
                "usage:" in captured.err
            ), where
        else:
            allowed = {argument if w == X else w for w in writes}
            allowed |= {str(partial_path(Path(w))) for w in allowed}  # what finished, when a command failed (exit 1)
            changed = {
                n for n in set(before) | set(after) if before.get(n) != after.get(n) or (n in before) != (n in after)
            }
            assert {n.split(os.sep)[0] for n in changed} <= allowed, where
            stores = {"s.duckdb", argument if slot.endswith("--store") else "s.duckdb"}
            for name in changed & stores:  # a store said to be written is a store
                assert (case / name).read_bytes()[8:12] == b"DUCK", where
        for path in case.rglob("*"):
            path.chmod(0o700)
