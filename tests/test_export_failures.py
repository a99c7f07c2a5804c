"""A failing exporter reaches the record's errors and ``reflect.export.failures``, and the run goes on: an OTLP
endpoint that refuses (a closed loopback port, the real OTLP exporter) and a store whose disk is full (a real
DuckDB file under a file-size limit of one byte: its write-ahead log cannot grow, as on a full disk)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from reflect_otel.attribution.methods import method_spec
from reflect_otel.attribution.service import EXPORT_STAGE, AttributionService
from reflect_otel.exporters.attribution_spans import AttributionSpanExporter
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.exporters.metrics import AttributionMetrics
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.reading.semconv import ReflectMetrics
from reflect_otel.record import AttributionRecord
from reflect_otel.store import CompositeRecordExporter, ExportResult
from reflect_otel.testing import ScriptedLLM, make_trace
from reflect_otel.trace import StructuredTrace


def _run(answer: str, trace_id: str) -> StructuredTrace:
    trace = make_trace(
        "in what year were there the most births?",
        [{"tool": "count", "args": {"by": "year"}, "result": "2004: 9, 2008: 10"}],
        final_answer=answer,
    )
    return trace.model_copy(update={"trace_id": trace_id})


def _failures(reader: InMemoryMetricReader) -> dict[str, int]:
    """``reflect.export.failures`` by exporter."""
    counted: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == ReflectMetrics.EXPORT_FAILURES:
                    for point in metric.data.data_points:
                        counted[str(point.attributes["exporter"])] = int(point.value)  # type: ignore[index]
    return counted


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_otlp_endpoint_that_refuses_is_in_the_records_errors_and_counted(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}/v1/traces"
    refused = OTLPSpanExporter(endpoint=endpoint, timeout=1)
    reader = InMemoryMetricReader()
    store = DuckDBStore(tmp_path / "s.duckdb")
    service = AttributionService(
        ScriptedLLM(),
        method_spec("last-step"),
        verifier=OracleVerifier(),
        store=store,
        exporters={"otlp": AttributionSpanExporter(refused)},
        metrics=AttributionMetrics(readers=[reader]),
    )
    try:
        first = service.process(_run("2004", "a" * 32), expected="2008")
        second = service.process(_run("2004", "b" * 32), expected="2008")  # the run goes on
    finally:
        service.shutdown()
    for outcome in (first, second):
        assert outcome.record is not None and outcome.record.step_index is not None
        (error,) = outcome.record.errors
        assert error.stage == EXPORT_STAGE and error.message.startswith("otlp: the span exporter (OTLPSpanExporter)")
        assert f"to {endpoint}: " in error.message  # then the cause, as the OTLP exporter logged it
        assert [f.exporter for f in outcome.export_failures] == ["otlp"]
    assert _failures(reader) == {"otlp": 2}
    with DuckDBStore(tmp_path / "s.duckdb") as reopened:  # the stored record names the exporter that failed
        ((text,),) = reopened._read("SELECT record_json FROM attributions WHERE trace_id = ?", ["a" * 32])
        assert AttributionRecord.model_validate_json(text).errors == first.record.errors  # type: ignore[union-attr]


def test_a_composite_tries_every_exporter_and_says_which_failed() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    refused = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{_closed_port()}/v1/traces", timeout=1)
    fanout = CompositeRecordExporter(
        {"down": AttributionSpanExporter(refused), "memory": AttributionSpanExporter(memory)}
    )
    from reflect_otel.testing.examples import verified_attribution

    _, record = verified_attribution()
    (failure,) = fanout.export_each([record])
    assert failure.exporter == "down" and "failed to send 1 span(s)" in failure.message
    assert len(memory.get_finished_spans()) == 1  # the one after the failing exporter still got the record
    assert fanout.export([record]) is ExportResult.FAILURE and fanout.failure.startswith("down: ")
    fanout.shutdown()


_FULL_DISK = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from reflect_otel.attribution.methods import method_spec
    from reflect_otel.attribution.service import AttributionService
    from reflect_otel.exporters.duckdb_store import DuckDBStore
    from reflect_otel.exporters.metrics import AttributionMetrics
    from reflect_otel.flagging.verifiers import OracleVerifier
    from reflect_otel.testing import ScriptedLLM
    from tests.test_export_failures import _failures, _run

    store = DuckDBStore(Path(sys.argv[1]))  # opened and migrated while there is room
    reader = InMemoryMetricReader()
    service = AttributionService(
        ScriptedLLM(), method_spec("last-step"), verifier=OracleVerifier(), store=store,
        metrics=AttributionMetrics(readers=[reader]),
    )
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
    outcomes = [service.process(_run("2004", c * 32), expected="2008") for c in "ab"]
    print(json.dumps({
        "errors": [[e.model_dump() for e in o.record.errors] for o in outcomes],
        "steps": [o.record.step_index for o in outcomes],
        "failures": _failures(reader),
    }))
    """
)


def test_a_store_whose_disk_is_full_is_in_the_records_errors_and_counted(tmp_path: Path) -> None:
    # the file-size limit is the process's: the run is a process of its own, its output a pipe (no file to limit)
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path / "full.duckdb")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(step is not None for step in seen["steps"])  # both runs attributed
    for errors in seen["errors"]:
        (error,) = errors
        assert error["stage"] == EXPORT_STAGE and error["message"].startswith("store: ")
        assert "File too large" in error["message"], error["message"]
    assert seen["failures"] == {"store": 2}
