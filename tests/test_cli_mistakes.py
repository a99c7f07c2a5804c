"""What a new user meets when they get something wrong (issue 42): a mistake never destroys a file, every error is
one line that names the fix, and every surface says what ran. Each command runs in process, on real files and a
real DuckDB store."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reflect_otel.attribution.service import AttributionService
from reflect_otel.cli import main
from reflect_otel.reading.tracefile import TraceWriter, read_traces
from reflect_otel.record import AttributionRecord, AttributionStatus
from reflect_otel.testing.examples import five_step_trace
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, StructuredTrace

EXAMPLES = Path(str(files("reflect_otel.demo"))) / "data" / "examples"


def _traces(path: Path, answers: dict[str, tuple[str, str | None]]) -> list[StructuredTrace]:
    """A traces file of the five-step trace, once per ``trace_id: (final answer, expected answer)``."""
    traces = []
    with TraceWriter(path) as writer:
        for trace_id, (answer, expected) in answers.items():
            trace = five_step_trace().model_copy(update={"trace_id": trace_id, "final_answer": answer})
            writer.write(trace, {EXPECTED_ANSWER_FIELD: expected} if expected is not None else None)
            traces.append(trace)
    return traces


def _records(path: Path) -> list[AttributionRecord]:
    return [AttributionRecord.model_validate_json(line) for line in path.read_text().splitlines()]


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _trail_file(path: Path) -> None:
    """A small TRAIL trace file, as the dataset ships them: one pretty-printed JSON document."""
    span = {
        "span_id": "a" * 16,
        "parent_span_id": None,
        "timestamp": "2025-01-01T00:00:00Z",
        "span_name": "llm",
        "span_attributes": {"openinference.span.kind": "LLM", "llm.output_messages.0.message.content": "hi"},
        "child_spans": [],
    }
    path.write_text(json.dumps({"trace_id": "e" * 32, "spans": [span]}, indent=2))


# -- 1. nothing lost by a mistake ---------------------------------------------------------------------------------
def test_a_failed_import_leaves_the_output_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keep = tmp_path / "keep.jsonl"
    assert main(["import", "--example", "-o", str(keep)]) == 0
    before = keep.read_bytes()
    assert main(["import", str(tmp_path / "nosuch.json"), "-o", str(keep)]) == 2
    assert "nosuch.json: no such file or folder" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{oops")
    assert main(["import", str(tmp_path / "bad.json"), "-o", str(keep)]) == 2
    assert "keep.jsonl was left as it was" in capsys.readouterr().err
    assert keep.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "keep.jsonl"]  # no temporary file left


def test_an_interrupted_attribute_leaves_the_records_as_they_were(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {f"{n:032x}": ("The answer is 41", "42") for n in (1, 2, 3)})
    out = tmp_path / "records.jsonl"
    assert main(["attribute", str(traces), "--method", "first-step", "-o", str(out), "--no-store"]) == 0
    before = out.read_bytes()
    assert len(_records(out)) == 3
    real = AttributionService.process
    calls = {"n": 0}

    def interrupted(self: AttributionService, trace: StructuredTrace, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # Ctrl-C during the second trace
        return real(self, trace, **kwargs)

    monkeypatch.setattr(AttributionService, "process", interrupted)
    assert main(["attribute", str(traces), "--method", "last-step", "-o", str(out), "--no-store"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and f"the 1 record(s) that finished are in {tmp_path / 'records.partial.jsonl'}" in err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl", "records.partial.jsonl", "traces.jsonl"]
    assert [r.method for r in _records(tmp_path / "records.partial.jsonl")] == ["last-step"]  # what finished


def test_a_store_that_is_not_a_store_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {"1" * 32: ("The answer is 41", "42")})
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(traces.read_bytes())
    folder = tmp_path / "folder"
    folder.mkdir()
    noise = tmp_path / "noise.bin"
    noise.write_bytes(bytes(range(256)) * 4)
    before = _listing(tmp_path)
    for store, says in [
        (copy, "is a JSON or JSONL file (traces or records?), not a store"),
        (folder, f"is a folder; name a DuckDB file in it, e.g. --store {folder / 'reflect.duckdb'}"),
        (noise, "is a file that is not a DuckDB database, not a store"),
        ("sqlite:///x.db", "a store is a DuckDB file or a postgresql:// URL; sqlite:// is neither"),
    ]:
        out = tmp_path / "records.jsonl"
        args = ["attribute", str(traces), "--method", "first-step", "-o", str(out), "--store", str(store)]
        assert main(args) == 2, store
        err = capsys.readouterr().err
        assert says in err and "another" not in err, err
        assert _listing(tmp_path) == before  # no record, no store, no temporary file
        for command in (["stats"], ["sql", "SELECT 1"], ["report", "1", "-o", str(tmp_path / "r.html")]):
            assert main([*command, "--store", str(store)]) == 2
            err = capsys.readouterr().err
            assert "another" not in err and "Traceback" not in err and (says in err or "not a store" in err), err
    assert _listing(tmp_path) == before


def test_a_store_variable_is_named_when_it_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REFLECT_STORE", str(tmp_path))
    assert main(["stats"]) == 2
    assert f"REFLECT_STORE={tmp_path}: is a folder" in capsys.readouterr().err


def test_collect_appends_after_a_torn_line_and_refuses_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "traces.jsonl"
    first = five_step_trace()
    out.write_text(first.model_dump_json() + "\n" + '{"trace_id": "torn by a cr')  # a crash mid-line
    with TraceWriter(out) as writer:
        writer.write(first.model_copy(update={"trace_id": "2" * 32}))
    lines = out.read_text().splitlines()
    assert lines[0] == first.model_dump_json() and lines[1] == '{"trace_id": "torn by a cr'  # kept as it was
    assert json.loads(lines[2])["trace_id"] == "2" * 32
    assert main(["collect", "--out", str(tmp_path), "--no-store", "--duration", "0"]) == 2
    assert f"--out {tmp_path}: is a folder; name a file in it" in capsys.readouterr().err


# -- 2. every error names the fix, no tracebacks -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "says"),
    [
        (
            lambda p: p.write_bytes((EXAMPLES / "bbm" / "multistep_arithmetic.jsonl").read_bytes()),
            "a BIG-Bench-Mistake file",
        ),
        (lambda p: p.write_bytes((EXAMPLES / "langgraph_agent.otlp.json").read_bytes()), "an OTLP/JSON export"),
        (_trail_file, "a TRAIL trace file"),
    ],
    ids=["bbm", "otlp", "trail"],
)
def test_a_file_of_another_format_names_the_command_that_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, says: str
) -> None:
    path = tmp_path / "raw.json"
    make(path)
    for command in (["show", str(path)], ["attribute", str(path), "-o", str(tmp_path / "r.jsonl"), "--no-store"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err  # one line, not one per line of the file
        assert says in err and f"run 'reflect-otel import {path} -o traces.jsonl' first" in err
    assert not (tmp_path / "r.jsonl").exists()


def test_wrong_files_say_what_they_are(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {"1" * 32: ("The answer is 41", "42")})
    records = tmp_path / "records.jsonl"
    assert main(["attribute", str(traces), "--method", "first-step", "-o", str(records), "--no-store"]) == 0
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n \n")
    capsys.readouterr()
    for argv, says in [
        (["show", str(tmp_path)], f"{tmp_path}: is a folder; name a JSONL file of traces in it"),
        (["show", str(empty)], "the file is empty; write one with 'reflect-otel collect' or 'reflect-otel import'"),
        (["show", str(blank)], "no traces in it"),
        (["show", str(records)], f"show them with 'reflect-otel show TRACES.jsonl --records {records}'"),
        (["show", str(traces), "--records", str(tmp_path)], f"--records {tmp_path}: is a folder"),
        (["show", str(traces), "--records", str(traces)], "this is a file of traces, not records"),
        (["attribute", str(traces), "-o", str(tmp_path), "--no-store"], f"-o {tmp_path}: is a folder"),
        (["import", "--example", "-o", str(tmp_path)], f"-o {tmp_path}: is a folder"),
        (["import", "--example", "-o", str(traces / "x.jsonl")], f"{traces} is a file, not a folder"),
        (["report", "x", "-o", str(tmp_path)], f"-o {tmp_path}: is a folder"),
        (["attribute", str(traces), "-o", str(tmp_path / "o.jsonl"), "--expected-file", str(tmp_path)], "is a folder"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)


def test_a_misspelt_variable_is_named_with_the_real_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REFLECT_ROUDNS", "1")
    assert main(["show", str(tmp_path / "t.jsonl")]) == 2
    assert "REFLECT_ROUDNS is not a reflect-otel variable: did you mean REFLECT_ROUNDS?" in capsys.readouterr().err
    monkeypatch.delenv("REFLECT_ROUDNS")
    monkeypatch.setenv("REFLECT_SOMETHING_OF_ANOTHER_TOOL", "1")  # close to nothing: another tool's, left alone
    assert main(["show", str(tmp_path / "t.jsonl")]) == 2
    assert "no such JSONL file of traces" in capsys.readouterr().err


def test_a_bug_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {"1" * 32: ("The answer is 41", "42")})

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(AttributionService, "process", broken)
    assert (
        main(["attribute", str(traces), "-o", str(tmp_path / "r.jsonl"), "--method", "first-step", "--no-store"]) == 70
    )
    err = capsys.readouterr().err
    assert "internal error (ZeroDivisionError: a bug); this is a bug in reflect-otel" in err and "Traceback" not in err
    assert not (tmp_path / "r.jsonl").exists()


# -- 3. surfaces say what ran ---------------------------------------------------------------------------------------
def test_verifier_is_honoured_and_right_runs_are_not_attributed_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'12 apples' against the target 12: wrong to the oracle (an exact answer), right to the BIG-Bench-Mistake
    verifier (a number in the target's form). A run judged right is recorded as skipped, with its verdict."""
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {"a" * 32: ("The answer is 12 apples", "12"), "b" * 32: ("The answer is 41", "42")})
    out = tmp_path / "records.jsonl"
    by_verifier = {}
    for verifier in ("oracle", "bbm"):
        argv = ["attribute", str(traces), "--method", "first-step", "--verifier", verifier, "-o", str(out)]
        assert main([*argv, "--no-store"]) == 0
        by_verifier[verifier] = {r.trace_id[0]: r for r in _records(out)}
        assert f"judged by the {verifier} verifier" in capsys.readouterr().err
    oracle, bbm = by_verifier["oracle"], by_verifier["bbm"]
    assert oracle["a"].step_index == 1 and oracle["a"].original_verdict is not None
    assert oracle["a"].original_verdict.is_correct is False
    assert bbm["a"].status is AttributionStatus.SKIPPED and bbm["a"].step_index is None
    assert bbm["a"].original_verdict is not None and bbm["a"].original_verdict.verifier == "bbm"
    assert bbm["b"].step_index == 1  # the wrong run is attributed either way
    argv = ["attribute", str(traces), "--method", "first-step", "--verifier", "bbm", "-o", str(out), "--no-store"]
    assert main([*argv, "--include-correct"]) == 0
    assert "1 right run(s) not attributed" not in capsys.readouterr().err
    assert {r.trace_id[0]: r.step_index for r in _records(out)} == {"a": 1, "b": 1}
    assert main(["attribute", "--pending", "--verifier", "bbm"]) == 2
    assert "drop --verifier" in capsys.readouterr().err


def test_attribute_pending_judges_runs_without_an_answer_with_the_chosen_flagging_verifier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs 'collect --attribute --verifier combined' left pending are taken by 'attribute --pending
    --flag-verifier combined' with the same verifier (it was always the plain proxy)."""
    from reflect_otel.flagging.combined import CombinedVerifier
    from reflect_otel.flagging.proxy_verifier import PlanAnchoredVerifier

    built: list[AttributionService] = []
    real = AttributionService.__init__

    def keep(self: AttributionService, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(AttributionService, "__init__", keep)
    store = str(tmp_path / "pending.duckdb")
    assert main(["attribute", "--pending", "--store", store, "--flag-verifier", "combined"]) == 0
    # no --replay-config: nothing can be re-run, and the user is told before the batch, not left to wonder
    warned = capsys.readouterr().err
    assert "warning: --flag-verifier consistency/combined needs an agent to re-run" in warned
    assert "no run will be checked for consistency" in warned
    assert main(["attribute", "--pending", "--store", store]) == 0
    assert "consistency" not in capsys.readouterr().err
    assert [type(service.proxy) for service in built] == [CombinedVerifier, PlanAnchoredVerifier]
    with pytest.raises(SystemExit) as refused:
        main(["attribute", "--pending", "--store", store, "--flag-verifier", "judge"])
    assert refused.value.code == 2 and "invalid choice: 'judge'" in capsys.readouterr().err


def test_store_views_and_stats_say_what_was_judged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled examples: three failed BIG-Bench-Mistake chains (with their answers; the evidence checks find
    nothing in them), a failed run of the table agent (its root span carries its expected answer; the evidence
    checks find its empty filter, step 1) and a LangGraph run without an expected answer."""
    traces = tmp_path / "traces.jsonl"
    assert main(["import", "--example", "-o", str(traces)]) == 0
    store = tmp_path / "s.duckdb"
    for method in ("evidence", "first-step"):
        argv = ["attribute", str(traces), "--method", method, "-o", str(tmp_path / f"{method}.jsonl")]
        assert main([*argv, "--store", str(store)]) == 0
    err = capsys.readouterr().err
    assert "1 run(s) could not be judged (no expected answer" in err
    with duckdb.connect(str(store), read_only=True) as db:
        stats = db.execute("SELECT agent, traces, judged, failed, failure_rate FROM failure_stats ORDER BY agent")
        assert stats.fetchall() == [
            ("agent", 1, 0, 0, None),
            ("chain_of_thought", 3, 3, 3, 1.0),
            ("table_qa", 1, 1, 1, 1.0),
        ]
        types = dict(db.execute("SELECT error_type, attributions FROM error_types").fetchall())
        evidence = db.execute("SELECT step_index FROM attributions WHERE method = 'evidence' AND step_index > 0")
        assert evidence.fetchall() == [(1,)]  # the table agent's empty filter, found with no model
    # no step is a category of its own, not "unknown": the evidence checks find nothing in four of the five (the
    # LangGraph run's "plus 1000," was once read as a dropped '1000,'), first-step names a step it cannot classify
    assert types.get("no_step") == 4 and sum(types.values()) == 10, types
    assert main(["stats", "--store", str(store)]) == 0
    assert "1 of 5 trace(s) were never judged right or wrong" in capsys.readouterr().out


def test_the_shipped_table_example_is_a_recording_of_the_real_agent(instrumented: Any, tmp_path: Path) -> None:
    """The example is what ``tests.table_example`` records: the table agent's real graph, tools and instrumentation
    (its model scripted), rebuilt into the same steps; and its failing step is found with no model."""
    from tests.table_example import record

    fresh = tmp_path / "fresh.otlp.json"
    fresh.write_text(json.dumps(record(instrumented.provider, instrumented.exporter.get_finished_spans)))
    steps = {}
    for name, path in (("shipped", EXAMPLES / "table_agent_nt1.otlp.json"), ("fresh", fresh)):
        out = tmp_path / f"{name}.jsonl"
        assert main(["import", str(path), "-o", str(out)]) == 0
        (trace,) = read_traces(out)
        steps[name] = [(s.kind, s.tool_name, s.tool_args, s.tool_result, s.reasoning) for s in trace.steps]
        assert trace.metadata["expected_answer"] == "Bangkok, Thailand" and trace.agent == "table_qa"
    assert steps["shipped"] == steps["fresh"]
    assert "values of Position in t0 include: '2nd', '1st'" in str(steps["shipped"][0][3])


def test_show_and_report_of_a_baseline_say_what_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bundled BIG-Bench-Mistake chain (its label: step 2; its target: -7) attributed by two baselines: the
    evidence checks, which find nothing in it, and last-step. Neither is an auditor, and neither page hides what
    the run was judged against or what the benchmark labelled."""
    examples = tmp_path / "examples.jsonl"
    assert main(["import", "--example", "-o", str(examples)]) == 0
    traces = tmp_path / "traces.jsonl"
    traces.write_text(examples.read_text().splitlines()[0] + "\n")
    (trace,) = read_traces(traces)
    assert [label.step_index for label in trace.labels] == [2]
    store = tmp_path / "s.duckdb"
    for method in ("evidence", "last-step"):
        records = tmp_path / f"{method}.jsonl"
        argv = ["attribute", str(traces), "--method", method, "-o", str(records), "--store", str(store)]
        assert main(argv) == 0
        assert main(["show", str(traces), "--records", str(records)]) == 0
        shown = capsys.readouterr().out
        assert "auditor" not in shown
        assert "expected answer: -7" in shown
        assert "judged wrong by the bbm verifier (answer read: '0')" in shown
        assert "label: step 2 reasoning_mistake" in shown
        report = tmp_path / f"{method}.html"
        assert main(["report", trace.trace_id[:12], "-o", str(report), "--store", str(store), "--method", method]) == 0
        page = report.read_text()
        assert "auditor" not in page and "Error type:</b> unknown" not in page
        assert "judged wrong by the bbm verifier" in page and "The benchmark's labels" in page
        assert "the benchmark labels step(s) 2" in page and "labelled by the benchmark" in page
        if method == "evidence":  # no step: said so, and no empty "Decisive step" line
            assert "no step named" in shown and "labels: the benchmark labels step(s) 2; no step was named" in shown
            assert "Decisive step:</b> none named" in page and "Error type" not in page
        else:
            assert "step 4, error type not classified" in shown
            assert "the last-step baseline (no model call) names step 4" in page
            assert "step 4 is not one of them" in page


def test_files_that_are_not_traces_are_named_before_any_line_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file of attribution records (whose errors list a TRAIL annotation file also has), a Who&When log and a
    TRAIL annotation file, each given where traces are expected: one line saying what it is and what reads it. The
    datasets' formats are named by the app (the core's reader knows none)."""
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {"a" * 32: ("The answer is 41", "42")})
    records = tmp_path / "records.jsonl"
    assert main(["attribute", str(traces), "--method", "first-step", "-o", str(records), "--no-store"]) == 0
    assert "errors" in json.loads(records.read_text().splitlines()[0])
    log = tmp_path / "0.json"
    log.write_text(json.dumps({"history": [{"role": "a", "content": "x"}], "mistake_step": "0"}, indent=2))
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"trace_id": "t", "errors": [{"category": "Tool Selection Errors"}]}))
    capsys.readouterr()
    for path, says in [
        (records, "this is a file of attribution records (from 'reflect-otel attribute')"),
        (log, "this is a Who&When log, not a file of traces"),
        (labels, "this is a TRAIL annotation file"),
    ]:
        for command in (["show", str(path)], ["attribute", str(path), "-o", str(tmp_path / "r.jsonl"), "--no-store"]):
            assert main(command) == 2, command
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and says in err, err


def test_the_python_readers_name_a_datasets_file_when_given_its_namers(tmp_path: Path) -> None:
    """``read_trace_rows`` (the example in docs/usage.md) refuses a BIG-Bench-Mistake file either way; given the datasets'
    namers it says what the file is and which command reads it, as the command line does."""
    from reflect_otel.datasets.files import DATASET_FORMAT_NAMERS
    from reflect_otel.errors import InputError
    from reflect_otel.reading.tracefile import read_trace_rows

    path = tmp_path / "rows.jsonl"
    path.write_bytes((EXAMPLES / "bbm" / "multistep_arithmetic.jsonl").read_bytes())
    with pytest.raises(InputError) as named:
        list(read_trace_rows(path, namers=DATASET_FORMAT_NAMERS))
    assert "this is a BIG-Bench-Mistake file" in str(named.value) and "reflect-otel import" in str(named.value)
    with pytest.raises(InputError) as unnamed:
        list(read_trace_rows(path))
    assert "BIG-Bench-Mistake" not in str(unnamed.value) and "not a StructuredTrace" in str(unnamed.value)


def test_import_example_is_what_the_readme_says_to_try_first(tmp_path: Path) -> None:
    out = tmp_path / "traces.jsonl"
    assert main(["import", "--example", "-o", str(out)]) == 0
    assert len(list(read_traces(out))) == 5


def test_a_traces_file_is_not_mistaken_for_another_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A first line longer than the head read to tell formats apart, and a first line torn by a crash: still a
    file of traces, read line by line."""
    long = five_step_trace().model_copy(update={"trace_id": "1" * 32, "question": "x" * 200_000})
    path = tmp_path / "traces.jsonl"
    path.write_text(long.model_dump_json() + "\n")
    assert main(["show", str(path)]) == 0
    assert f"trace {'1' * 32}" in capsys.readouterr().out
    path.write_text('{"trace_id": "torn\n' + five_step_trace().model_dump_json() + "\n")
    assert main(["show", str(path)]) == 1
    captured = capsys.readouterr()
    assert f"trace {five_step_trace().trace_id}" in captured.out and f"{path}:1: not valid JSON" in captured.err


# -- 4. a failed command keeps its outputs, the cause is on the screen ----------------------------------------------
def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_attribute_against_a_closed_endpoint_stops_names_it_once_and_keeps_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {f"{n:032x}": ("The answer is 41", "42") for n in range(1, 6)})
    out = tmp_path / "out.jsonl"
    assert main(["attribute", str(traces), "--method", "first-step", "-o", str(out), "--no-store"]) == 0
    before = out.read_bytes()
    port = _closed_port()
    monkeypatch.setenv("REFLECT_LLM_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("REFLECT_LLM_MODEL", "m")
    monkeypatch.setenv("REFLECT_LLM_TIMEOUT_S", "1")
    capsys.readouterr()
    assert main(["attribute", str(traces), "--method", "reflect", "-o", str(out), "--no-store"]) == 1
    err = capsys.readouterr().err
    assert out.read_bytes() == before  # the help's promise: a failed command leaves -o as it was
    (stop,) = [line for line in err.splitlines() if "error:" in line]
    assert f"stopped after 3 of 5 trace(s): LLM endpoint http://127.0.0.1:{port}/v1 (model m) failed 3 times" in stop
    assert (
        "Connection error" in stop and f"the 3 record(s) that finished are in {tmp_path / 'out.partial.jsonl'}" in stop
    )
    assert err.count(f"127.0.0.1:{port}") == 1  # the URL and the cause once, not once per trace
    assert len(_records(tmp_path / "out.partial.jsonl")) == 3


def test_attribute_on_a_cut_traces_file_keeps_the_output_and_the_finished_records_aside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {f"{n:032x}": ("The answer is 41", "42") for n in range(1, 5)})
    out = tmp_path / "out.jsonl"
    assert main(["attribute", str(traces), "--method", "first-step", "-o", str(out), "--no-store"]) == 0
    before = out.read_bytes()
    traces.write_bytes(traces.read_bytes()[:-40])  # a copy cut short: the last line is torn
    capsys.readouterr()
    assert main(["attribute", str(traces), "--method", "last-step", "-o", str(out), "--no-store"]) == 1
    err = capsys.readouterr().err
    assert out.read_bytes() == before and len(_records(out)) == 4
    assert "1 line(s) of" in err and f"{out} was left as it was" in err
    assert [r.method for r in _records(tmp_path / "out.partial.jsonl")] == ["last-step"] * 3
    # the torn line is said when it is met, and the last line names the failure and what was kept
    lines = err.splitlines()
    said = next(i for i, line in enumerate(lines) if line.startswith(f"skipped: {traces}:4: not valid JSON"))
    last = lines[-1]
    assert said < len(lines) - 1 and last.startswith(
        f"reflect-otel attribute: error: 1 line(s) of {traces} were not traces and were skipped (see above); "
    )
    assert "3 of 3 trace(s)" in err and f"records in {out}" not in err


def test_without_a_model_attribute_and_collect_say_both_ways_to_get_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("reflect_otel.llm.models.importlib.util.find_spec", lambda name: None)  # the light install
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {"1" * 32: ("The answer is 41", "42")})
    assert main(["attribute", str(traces), "--method", "reflect", "-o", str(tmp_path / "r.jsonl"), "--no-store"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "REFLECT_LLM_BASE_URL" in err and "pip install 'reflect-otel[local]'" in err
    assert not (tmp_path / "r.jsonl").exists()
    store = str(tmp_path / "s.duckdb")
    argv = ["collect", "--attribute", "-o", str(tmp_path / "c.jsonl"), "--store", store, "--http", "127.0.0.1:0"]
    assert main([*argv, "--method", "reflect", "--duration", "0"]) == 2  # asked for what needs a model: refused
    err = capsys.readouterr().err
    assert "--method reflect needs a model" in err and "REFLECT_LLM_BASE_URL" in err
    assert not (tmp_path / "c.jsonl").exists()
    assert main([*argv, "--duration", "0"]) == 0  # nothing asked: evidence-only, said before it listens
    err = capsys.readouterr().err
    assert "attributed by the evidence checks only (--method evidence --verifier evidence)" in err
    assert err.index("evidence checks only") < err.index("listening")


def test_a_damaged_store_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {f"{n:032x}": ("The answer is 41", "42") for n in range(1, 5)})
    store = tmp_path / "s.duckdb"
    argv = ["attribute", str(traces), "--method", "first-step", "-o", str(tmp_path / "r.jsonl")]
    assert main([*argv, "--store", str(store)]) == 0
    with store.open("r+b") as file:
        file.truncate(store.stat().st_size // 2)  # a copy that stopped half way
    capsys.readouterr()
    assert main(["stats", "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the store {store} is damaged" in err and "internal error" not in err


@pytest.mark.parametrize(
    "folder",
    sorted(p for p in (Path(__file__).parents[1] / "benchmarks/results").iterdir() if p.is_dir()),
    ids=lambda p: p.name,
)
def test_eval_compare_reads_every_folder_the_repository_ships(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    assert main(["eval-compare", str(folder)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("|") or f"{folder.name}:" in out
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before  # nothing written into it


# -- 5. one vocabulary on the command line --------------------------------------------------------------------------
def test_a_mistyped_choice_command_or_option_is_one_line_with_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, says in [
        (
            ["attribute", "t.jsonl", "--method", "evidance", "-o", "r.jsonl"],
            "invalid choice: 'evidance' (did you mean 'evidence'?)",
        ),
        (["attribte"], "invalid choice: 'attribte' (did you mean 'attribute'?)"),
        (["show", "t.jsonl", "--recrods", "r.jsonl"], "--recrods: did you mean --records?"),
    ]:
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.count("\n") == 1 and says in err and "usage:" not in err, err


def test_every_command_takes_v_after_it_and_its_help_ends_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    from reflect_otel.cli import EXAMPLES, build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert set(EXAMPLES) <= set(commands)
    for name, command in commands.items():
        if name not in EXAMPLES:
            continue  # a third party's
        help_text = command.format_help()
        assert "\nexamples:\n  reflect-otel " + name in help_text, name
        assert "-v, --verbose" in help_text
    assert parser.parse_args(["stats", "-v"]).verbose is True
    assert parser.parse_args(["-v", "stats"]).verbose is True and parser.parse_args(["stats"]).verbose is False
    assert parser.parse_args(["eval", "--benchmark", "bbm", "--data", "d", "-o", "runs/x"]).out == Path("runs/x")
    assert parser.parse_args(["eval", "--benchmark", "bbm", "--data", "d", "--out", "runs/x"]).out == Path("runs/x")
    assert parser.parse_args(["demo-agent", "--questions", "nt-1,nt-3"]).questions == "nt-1,nt-3"
    assert parser.parse_args(["demo-agent", "--question", "nt-1"]).question == ["nt-1"]  # the old spelling


def test_report_says_which_record_it_shows_and_refuses_a_method_with_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {"ab" + "1" * 30: ("The answer is 41", "42")})
    store = tmp_path / "s.duckdb"
    for method in ("first-step", "last-step"):
        argv = ["attribute", str(traces), "--method", method, "-o", str(tmp_path / f"{method}.jsonl")]
        assert main([*argv, "--store", str(store)]) == 0
    page = tmp_path / "r.html"
    capsys.readouterr()
    assert main(["report", "ab11", "-o", str(page), "--store", str(store)]) == 0
    err = capsys.readouterr().err
    assert "the last-step record of trace ab" in err and "it also has records of first-step (--method picks one)" in err
    before = page.read_bytes()
    assert main(["report", "ab11", "-o", str(page), "--store", str(store), "--method", "reflect"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no record of --method reflect; its records are of last-step, first-step" in err
    assert page.read_bytes() == before


def test_show_takes_a_prefix_of_the_trace_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {"ab" + "1" * 30: ("41", "42"), "cd" + "2" * 30: ("41", "42")})
    assert main(["show", str(traces), "--trace-id", "ab1"]) == 0
    out = capsys.readouterr().out
    assert f"trace {'ab' + '1' * 30}" in out and "cd22" not in out
    assert main(["show", str(traces), "--trace-id", "ef"]) == 2
    assert "no trace id starts with 'ef'" in capsys.readouterr().err


def test_a_store_named_like_another_format_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = tmp_path / "traces.jsonl"
    _traces(traces, {"1" * 32: ("The answer is 41", "42")})
    before = _listing(tmp_path)
    argv = ["attribute", str(traces), "--method", "first-step", "-o", str(tmp_path / "r.jsonl")]
    assert main([*argv, "--store", str(tmp_path / "new.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a new store is a DuckDB file, and .jsonl names another format" in err
    assert f"--store {tmp_path / 'new.duckdb'}" in err and _listing(tmp_path) == before


def test_a_trace_line_over_the_limit_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from reflect_otel.reading.tracefile import MAX_LINE_BYTES

    huge = five_step_trace().model_copy(update={"question": "x" * (MAX_LINE_BYTES + 10)})
    path = tmp_path / "traces.jsonl"
    path.write_text(huge.model_dump_json() + "\n")
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its first line is over 67108864 bytes (64 MiB)" in err
    assert "several lines" not in err


def test_a_failed_import_says_nothing_was_imported_only_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.json").write_text("{oops")
    assert main(["import", str(tmp_path / "bad.json"), "-o", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "imported 0" not in err and "no trace in" in err and "t.jsonl was not written" in err
    assert not (tmp_path / "t.jsonl").exists()


def test_an_endpoint_that_never_answers_is_waited_for_out_loud_and_within_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import time

    traces = tmp_path / "traces.jsonl"
    _traces(traces, {f"{n:032x}": ("The answer is 41", "42") for n in range(1, 5)})
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        monkeypatch.setenv("REFLECT_LLM_BASE_URL", f"http://127.0.0.1:{silent.getsockname()[1]}/v1")
        monkeypatch.setenv("REFLECT_LLM_MODEL", "m")
        monkeypatch.setenv("REFLECT_LLM_TIMEOUT_S", "1.5")
        started = time.monotonic()
        argv = ["attribute", str(traces), "--method", "aao", "-o", str(tmp_path / "r.jsonl"), "--no-store"]
        assert main(argv) == 1
    assert time.monotonic() - started < 15  # three requests of 1.5 s each, retries included, then it stops
    err = capsys.readouterr().err
    assert "stopped after 3 of 4 trace(s)" in err and "timed out" in err
    assert not (tmp_path / "r.jsonl").exists()


def test_eval_stops_at_an_endpoint_taken_for_down_and_keeps_what_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    (data / "bbm").mkdir(parents=True)
    (data / "bbm" / "multistep_arithmetic.jsonl").write_bytes(
        (EXAMPLES / "bbm" / "multistep_arithmetic.jsonl").read_bytes()
    )
    monkeypatch.setenv("REFLECT_LLM_BASE_URL", f"http://127.0.0.1:{_closed_port()}/v1")
    monkeypatch.setenv("REFLECT_LLM_MODEL", "m")
    monkeypatch.setenv("REFLECT_LLM_TIMEOUT_S", "1")
    run = tmp_path / "run"
    assert main(["eval", "--benchmark", "bbm", "--method", "aao", "--data", str(data), "-o", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("reflect-otel eval: error: stopped: LLM endpoint http://127.0.0.1:"), err[-1]
    assert f"what finished is in {run}, and a rerun resumes there" in err[-1]
    assert len((run / "results.jsonl").read_text().splitlines()) == 3


def test_the_help_says_why_the_two_verifier_flags_differ_and_says_each_sentence_whole() -> None:
    from reflect_otel.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices
    attribute, collect = commands["attribute"].format_help(), commands["collect"].format_help()
    assert "'collect --verifier'" in " ".join(attribute.split()) and "not 'attribute" in " ".join(collect.split())
    assert "written as incomplete" in " ".join(collect.split())  # --ttl: what happens after those seconds
    assert "are attributed. These" in " ".join(attribute.split())  # --verifier's last sentence, whole
