"""``reflect-otel collect`` stopped by SIGTERM while four clients keep sending: every trace it acknowledged is in
its ``--out`` file and its store, none it refused or never answered is, and it exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import duckdb

from reflect_otel.llm.local import free_port
from reflect_otel.testing import wait_until
from reflect_otel.testing.otlp_load import SteadyLoad


def _wait_listening(port: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/traces", timeout=1)
        except urllib.error.HTTPError:
            return  # it answers (405 to a GET): listening
        except OSError:
            time.sleep(0.1)
    raise AssertionError("collect did not start listening")


def test_sigterm_under_load_writes_exactly_what_was_acknowledged(tmp_path: Path) -> None:
    port = free_port()
    out, store = tmp_path / "out.jsonl", tmp_path / "store.duckdb"
    command = ["collect", "--http", f"127.0.0.1:{port}", "--out", str(out), "--store", str(store), "--grace", "0.5"]
    collect = subprocess.Popen(
        [sys.executable, "-m", "reflect_otel", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    load = SteadyLoad(port)
    try:
        _wait_listening(port, collect)
        load.start()
        wait_until(lambda: len(load.acknowledged) > 50, 60, "50 acknowledged traces")
        collect.send_signal(signal.SIGTERM)  # mid-stream
        _, stderr = collect.communicate(timeout=120)
    finally:
        if collect.poll() is None:
            collect.kill()
        load.stop()
    assert collect.returncode == 0, stderr[-3000:]
    assert len(load.acknowledged) > 50, "the load did not get going"
    written = {json.loads(line)["trace_id"] for line in out.read_text().splitlines()}
    assert written == load.acknowledged  # acknowledged = written: none lost, none extra
    with duckdb.connect(str(store), read_only=True) as db:
        stored = {trace_id for (trace_id,) in db.execute("SELECT trace_id FROM traces").fetchall()}
    assert stored == load.acknowledged
    assert all(status == 503 for status, _ in load.refused), set(load.refused)
