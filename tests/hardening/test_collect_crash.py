"""After a crash (kill -9) the store may lag ``collect``'s ``--out`` file, the source of truth: ``collect
--reingest`` brings it up to the file, skipping the line a crash tore, and re-writing a trace changes nothing."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from reflect_otel.cli import main
from reflect_otel.testing.examples import five_step_trace


def test_collect_reingest_brings_the_store_up_to_the_file_and_skips_a_torn_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.jsonl"
    traces = [five_step_trace().model_copy(update={"trace_id": f"{i + 1:032x}"}) for i in range(3)]
    lines = [t.model_dump_json() for t in traces]
    out.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:40] + "\n" + lines[2] + "\n")  # as after kill -9
    store = tmp_path / "store.duckdb"
    assert main(["collect", "--reingest", str(out), "--store", str(store)]) == 1  # a line was skipped
    err = capsys.readouterr().err
    assert f"{out}:3: not valid JSON" in err and "3 trace(s)" in err and "1 line(s) skipped" in err
    assert main(["collect", "--reingest", str(out), "--store", str(store)]) == 1  # again: nothing doubles
    with duckdb.connect(str(store), read_only=True) as db:
        assert db.execute("SELECT count(*) FROM traces").fetchone() == (3,)
        assert db.execute("SELECT count(*) FROM steps").fetchone() == (15,)
    assert main(["collect", "--store", str(store)]) == 2  # listening needs --out
    assert "needs --out" in capsys.readouterr().err
    imported = tmp_path / "imported.jsonl"  # an import output: its lines carry expected answers
    assert main(["import", "--example", "-o", str(imported)]) == 0
    assert main(["collect", "--reingest", str(imported), "--store", str(store)]) == 0
    assert "5 trace(s)" in capsys.readouterr().err
