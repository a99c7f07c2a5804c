"""The ``reflect-otel`` command as a user runs it: real processes, real files, real exporters."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflect_otel.cli import main
from reflect_otel.reading.tracefile import read_traces
from tests import agents

CLI = [sys.executable, "-m", "reflect_otel"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("collect", "import", "show"):
        assert command in out


def test_import_example_then_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "traces.jsonl"
    assert main(["import", "--example", "-o", str(out)]) == 0
    assert "imported 5 trace(s), 18 step(s)" in capsys.readouterr().err
    traces = list(read_traces(out))
    (trace,) = [t for t in traces if t.metadata.get("dataset") != "bbm" and t.agent != "table_qa"]
    assert set(trace.metadata) == {"raw_input", "raw_output"}  # the LangGraph root's JSON state, text extracted
    bbm = [t for t in traces if t.metadata.get("dataset") == "bbm"]
    assert [t.metadata for t in bbm] == [{"dataset": "bbm", "task": "multistep_arithmetic"}] * 3
    assert [s.tool_name for s in trace.steps] == ["lookup_population", "add", "lookup_population", None]
    assert trace.final_answer == agents.ANSWER
    assert trace.replay.thread_id == "example-thread"
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "4. final_answer" in shown and "lookup_population({'city': 'Paris'})" in shown


def test_import_trail_folder_reports_mapping(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "trail.jsonl"
    result = subprocess.run(
        [*CLI, "import", str(shared_data / "trail"), "-o", str(out)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    traces = list(read_traces(out))
    assert len(traces) == len(list((shared_data / "trail").glob("*/traces/*.json")))
    line = next(line for line in result.stderr.splitlines() if line.startswith("annotations:"))
    mapped, total = (int(x) for x in line.split()[1:4:2])
    assert mapped / total >= 0.99


def test_import_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    assert main(["import", str(bad), "-o", str(tmp_path / "o.jsonl")]) == 2  # no trace read: nothing written
    err = capsys.readouterr().err
    assert "bad.json: not valid JSON" in err and "o.jsonl was not written" in err
    assert not (tmp_path / "o.jsonl").exists()
    assert main(["import", str(tmp_path / "missing.json"), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["import", "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "--example" in capsys.readouterr().err
    (tmp_path / "broken.jsonl").write_text('{"trace_id": 5}\n')
    assert main(["show", str(tmp_path / "broken.jsonl")]) == 1
    assert (
        "reflect-otel show: skipped: " in (err := capsys.readouterr().err)
        and "broken.jsonl:1: not a StructuredTrace" in err
    )


def test_collect_receives_from_real_exporters_and_flushes_on_sigterm(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GRPCExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    http_port, grpc_port = _free_port(), _free_port()
    out = tmp_path / "collected.jsonl"
    process = subprocess.Popen(
        [
            *CLI,
            "collect",
            "--http",
            f"127.0.0.1:{http_port}",
            "--grpc",
            f"127.0.0.1:{grpc_port}",
            "-o",
            str(out),
            "--store",
            str(tmp_path / "collected.duckdb"),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stderr is not None
        assert "listening for OTLP/HTTP" in process.stderr.readline()
        for exporter in (
            HTTPExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces"),
            GRPCExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True),
        ):
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            tracer = provider.get_tracer("cli-test")
            agents.run_openai_agent(agents.scripted_openai_client(), tracer)  # spans of our loop code only
            provider.shutdown()
        # a trace whose root never ends must still be written when the collector stops
        provider = TracerProvider()
        provider.add_span_processor(
            SimpleSpanProcessor(HTTPExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces"))
        )
        tracer = provider.get_tracer("cli-test")
        from opentelemetry.trace import set_span_in_context

        open_root = tracer.start_span("never-ends")
        with tracer.start_as_current_span(
            "tool",
            context=set_span_in_context(open_root),
            attributes={"openinference.span.kind": "TOOL", "tool.name": "t"},
        ):
            pass
        provider.force_flush()
        deadline = time.monotonic() + 10
        while (not out.exists() or len(out.read_text().splitlines()) < 2) and time.monotonic() < deadline:
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        summary = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
    traces = list(read_traces(out))
    assert len(traces) == 3, summary
    complete = [t for t in traces if t.question == agents.QUESTION]
    assert len(complete) == 2
    assert all([s.tool_name for s in t.steps] == ["lookup_population", "add", "lookup_population"] for t in complete)
    assert all(t.final_answer == agents.ANSWER for t in complete)
    (partial,) = [t for t in traces if t not in complete]
    assert "root_never_ended" in {w.code.value for w in partial.warnings}
    assert "traces written 3" in summary
    import duckdb

    with duckdb.connect(str(tmp_path / "collected.duckdb"), read_only=True) as db:
        assert db.execute("SELECT count(*) FROM traces").fetchone() == (3,)
        assert db.execute("SELECT count(*) FROM steps").fetchone() == (sum(len(t.steps) for t in traces),)


def test_collect_refuses_bad_endpoints(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert (
        main(["collect", "--http", "0.0.0.0:0", "-o", str(tmp_path / "x.jsonl"), "--duration", "0", "--no-store"]) == 2
    )
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["collect", "--http", "127.0.0.1:notaport", "-o", str(tmp_path / "x.jsonl"), "--no-store"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_the_settings_page_lists_every_variable_and_a_bad_value_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    from reflect_otel.settings import variables_markdown

    page = (Path(__file__).parents[1] / "docs" / "settings.md").read_text(encoding="utf-8")
    assert variables_markdown() in page, "docs/settings.md's table is stale: reflect-otel settings --markdown"
    for variable, value, named in [
        ("REFLECT_LOCAL_CONTEXT", "lots", "REFLECT_LOCAL_CONTEXT='lots'"),
        ("REFLECT_ROUNDS", "0", "REFLECT_ROUNDS"),
        ("REFLECT_LLM_TIMEOUT_S", "-1", "REFLECT_LLM_TIMEOUT_S"),
    ]:
        monkeypatch.setenv(variable, value)
        assert main(["show", "/nonexistent.jsonl"]) == 2  # refused before the command looks at its input
        error = capsys.readouterr().err
        assert named in error and "nonexistent" not in error, error
        monkeypatch.delenv(variable)
