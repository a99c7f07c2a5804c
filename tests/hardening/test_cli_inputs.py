"""Bad files and queries at the command line: one line naming the file and line for each bad input, the good
inputs beside it kept, exit 1; and ``sql`` confined to the store (no file read or written, no setting undone)."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest

from reflect_otel.cli import main
from reflect_otel.datasets.trail import read_trail_file
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.testing.examples import five_step_trace, verified_attribution


def _traces_file(path: Path) -> list[str]:
    """Two good traces around lines a crash, a bad exporter or a fuzzer would leave."""
    good = [five_step_trace().model_copy(update={"trace_id": f"{n:032x}"}) for n in (1, 2)]
    bad = [
        '{"trace_id": "x"',  # torn by a crash
        "[" * 100_000,  # nested past any parser's stack
        json.dumps(good[0].model_dump(mode="json") | {"trace_id": f"{3:032x}", "start_time_ns": 1e400}),  # Infinity
        json.dumps(["not", "an", "object"]),
    ]
    with_surrogate = good[1].model_dump_json().replace('"question":"', '"question":"\\ud800', 1)
    path.write_text("\n".join([good[0].model_dump_json(), *bad, with_surrogate]) + "\n")
    return [t.trace_id for t in good]


def test_show_keeps_the_good_traces_and_names_each_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "traces.jsonl"
    good = _traces_file(path)
    assert main(["show", str(path)]) == 1
    captured = capsys.readouterr()
    for trace_id in good:
        assert f"trace {trace_id}" in captured.out
    assert "question: ?What is 6 times 7" in captured.out  # the lone surrogate, replaced: printable
    skipped = [line for line in captured.err.splitlines() if "skipped:" in line]
    assert [line.split(f"{path}:")[1].split(":")[0] for line in skipped] == ["2", "3", "4", "5"]
    assert "nested too deeply" in skipped[1] and "finite number" in skipped[2]


def test_attribute_keeps_the_good_traces_and_expected_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "traces.jsonl"
    good = _traces_file(path)
    expected = tmp_path / "expected.jsonl"
    expected.write_text(
        json.dumps({"trace_id": good[0], "expected_answer": "42"})
        + "\n{broken\n"
        + "[" * 50_000
        + "\n"
        + json.dumps({"trace_id": good[1]})
        + "\n"
    )
    out = tmp_path / "records.jsonl"
    code = main(
        [
            "attribute",
            str(path),
            "--method",
            "first-step",
            "--expected-file",
            str(expected),
            "-o",
            str(out),
            "--no-store",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "4 line(s)" in err
    assert f"{expected}:2: not valid JSON" in err and f"{expected}:4: needs trace_id and expected_answer" in err
    # a run that skipped lines failed: -o is not written, the good traces' records are kept beside it
    assert not out.exists() and f"are in {tmp_path / 'records.partial.jsonl'}" in err
    records = [json.loads(line) for line in (tmp_path / "records.partial.jsonl").read_text().splitlines()]
    assert [r["trace_id"] for r in records] == good


def test_show_of_a_file_with_no_good_line_still_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("{\n")
    assert main(["show", str(path)]) == 1
    assert "bad.jsonl:1: not valid JSON" in capsys.readouterr().err


def test_sql_reads_only_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.duckdb"
    trace, record = verified_attribution()
    with DuckDBStore(path) as store:
        store.write_trace(trace)
        store.write_record(record)
    secret = tmp_path / "secret.txt"
    secret.write_text("OPENAI_API_KEY=sk-test")
    for query in (
        f"COPY traces TO '{tmp_path / 'out.csv'}'",
        f"EXPORT DATABASE '{tmp_path / 'dump'}'",
        f"SELECT * FROM read_text('{secret}')",
        f"SELECT * FROM read_csv('{secret}')",
        f"SELECT * FROM glob('{tmp_path}/*')",
        f"ATTACH '{tmp_path / 'other.duckdb'}'",
        "SET enable_external_access = true",
        "INSTALL httpfs",
    ):
        assert main(["sql", query, "--store", str(path)]) == 2, query
        assert "query failed" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb", "secret.txt"]
    assert main(["sql", "SELECT count(*) AS n FROM traces", "--store", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 1}]


def test_import_keeps_the_good_files_and_lines_beside_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A good OTLP file, a JSONL file with one bad line among good ones, and a file whose numbers Python's JSON
    reads as Infinity: every good trace is written, each problem is one line naming its file (and line), exit 1."""
    examples = Path(str(files("reflect_otel.demo"))) / "data" / "examples"
    example = examples / "langgraph_agent.otlp.json"
    good = tmp_path / "good.json"
    good.write_text(example.read_text())
    rows = (examples / "bbm" / "multistep_arithmetic.jsonl").read_text().splitlines()[:2]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(f"{rows[0]}\n{{oops\n{rows[1]}\n")
    infinite = tmp_path / "infinite.json"
    infinite.write_text(example.read_text().replace('"startTimeUnixNano": "', '"startTimeUnixNano": Infinity, "x": "'))
    out = tmp_path / "o.jsonl"
    assert main(["import", str(good), str(mixed), str(infinite), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "mixed.jsonl:2: not valid JSON" in err
    assert not out.exists() and f"are in {tmp_path / 'o.partial.jsonl'}" in err  # a failed import writes no -o
    # the OTLP trace and the two good BIG-Bench-Mistake rows, kept beside it
    assert len((tmp_path / "o.partial.jsonl").read_text().splitlines()) == 3


def test_parent_ids_that_form_a_cycle_end_the_import(tmp_path: Path) -> None:
    """Three LLM spans whose parent ids run in a circle beside a root, and an annotation on the root (no step): the
    import ends (searching the circle for the root used to loop forever) and the label is kept, unmapped."""
    traces, annotations = tmp_path / "traces", tmp_path / "annotations"
    traces.mkdir()
    annotations.mkdir()
    ids = [c * 16 for c in "abcd"]

    def node(i: int) -> dict[str, object]:
        attributes = {"openinference.span.kind": "LLM", "llm.output_messages.0.message.content": f"thought {i}"}
        return {
            "span_id": ids[i],
            "parent_span_id": "None" if i == 0 else ids[i % 3 + 1],  # b -> c -> d -> b
            "timestamp": f"2025-01-01T00:00:0{i}Z",
            "span_name": "llm" if i else "chain",
            "span_attributes": attributes if i else {"openinference.span.kind": "CHAIN"},
            "child_spans": [],
        }

    path = traces / ("e" * 32 + ".json")
    path.write_text(json.dumps({"trace_id": "e" * 32, "spans": [node(i) for i in range(4)]}))
    (annotations / path.name).write_text(json.dumps({"errors": [{"category": "Goal deviation", "location": ids[0]}]}))
    imported = read_trail_file(path, max_bytes=100_000)
    assert len(imported.trace.steps) == 3 and imported.labels_total == 1 and imported.labels_mapped == 0
