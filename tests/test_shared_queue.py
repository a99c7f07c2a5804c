"""Attribution as shared work on PostgreSQL, with real processes: a collector queues, any number of workers take the
jobs, each is done once, and a worker killed mid-job (kill -9) leaves its job to another."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.llm.local import free_port
from reflect_otel.testing import wait_until
from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedTurn
from reflect_otel.testing.otlp_bodies import wrong_run_body

pytest.importorskip("procrastinate")
CLI = [sys.executable, "-m", "reflect_otel"]
AAO = {
    "error_step": 1,
    "responsible_agent": None,
    "reason": "the lookup",
    "error_type": "tool_error",
    "confidence": 0.5,
}


@pytest.fixture
def database(postgres_server: Any, request: pytest.FixtureRequest) -> str:
    from reflect_otel.exporters.postgres_store import connect_postgres

    name = f"shared_{request.node.name[-40:].lower().replace('[', '_').replace(']', '')}"
    with connect_postgres(postgres_server.url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    return str(postgres_server.url.rsplit("/", 1)[0] + f"/{name}")


def _model(delay_s: float) -> ScriptedOpenAIServer:
    def turn(body: dict[str, Any]) -> ScriptedTurn:
        time.sleep(delay_s)
        return ScriptedTurn(text=json.dumps(AAO))

    return ScriptedOpenAIServer(turn)


def _env(model: ScriptedOpenAIServer) -> dict[str, str]:
    return os.environ | {
        "PYTHONUNBUFFERED": "1",
        "REFLECT_LLM_BASE_URL": model.base_url,
        "REFLECT_LLM_API_KEY": "t",
        "REFLECT_LLM_MODEL": "scripted",
    }


def _post(port: int, body: bytes) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces", body, {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def _jobs(url: str) -> dict[str, tuple[str, int]]:
    from reflect_otel.exporters.postgres_store import connect_postgres

    with connect_postgres(url, autocommit=True) as db:
        rows = db.execute("SELECT trace_id, status, attempts FROM attribution_jobs").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _count(url: str, sql: str) -> int:
    from reflect_otel.exporters.postgres_store import connect_postgres

    with connect_postgres(url, autocommit=True) as db:
        row = db.execute(sql).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _collector(url: str, env: dict[str, str], tmp_path: Path, processes: list[Any]) -> int:
    port = free_port()
    collector = subprocess.Popen(
        [*CLI, "collect", "--http", f"127.0.0.1:{port}", "-o", str(tmp_path / "runs.jsonl"), "--store", url,
         "--attribute", "--grace", "0.2"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    processes.append(collector)
    assert collector.stderr is not None and "listening for OTLP/HTTP" in collector.stderr.readline()
    return port


def _worker(
    url: str, env: dict[str, str], processes: list[Any], *extra: str, stalled_after_s: int = 3
) -> subprocess.Popen[str]:
    worker = subprocess.Popen(
        [*CLI, "worker", "--store", url, "--method", "aao", "--stalled-after", str(stalled_after_s), *extra],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    processes.append(worker)
    return worker


def test_two_workers_share_the_collectors_runs_and_do_each_once(
    database: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    with _model(0.05) as model:
        env = _env(model)
        port = _collector(database, env, tmp_path, processes)
        # No worker dies here: a long stall limit, so a worker starved of CPU (a loaded CI machine) keeps its job.
        workers = [_worker(database, env, processes, stalled_after_s=60) for _ in range(2)]
        for number in range(12):
            _post(port, wrong_run_body(number))
        wait_until(lambda: len(_jobs(database)) == 12 and all(s == "done" for s, _ in _jobs(database).values()),
                   120, "12 jobs done")  # fmt: skip
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        logs = [w.communicate(timeout=60)[1] for w in workers]
    assert {attempts for _, attempts in _jobs(database).values()} == {1}  # each run attributed once
    assert _count(database, "SELECT count(*) FROM attributions WHERE method = 'aao'") == 12
    judged = [int(log.rsplit("worker: ", 1)[1].split()[0]) for log in logs]
    assert sum(judged) == 12 and all(n > 0 for n in judged), logs  # both took work


def test_a_worker_killed_mid_job_leaves_it_to_another(
    database: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    with _model(4.0) as model:  # each model call takes 4 s: time to kill the worker inside the job
        env = _env(model)
        port = _collector(database, env, tmp_path, processes)
        first = _worker(database, env, processes)
        _post(port, wrong_run_body(0))
        wait_until(lambda: _jobs(database).get(f"{1:032x}", ("", 0))[0] == "running", 60, "the job running")
        first.kill()  # kill -9: no goodbye, no heartbeat
        first.wait(timeout=30)
        second = _worker(database, env, processes)
        wait_until(lambda: _jobs(database).get(f"{1:032x}", ("", 0))[0] == "done", 120, "the job done by another")
        second.send_signal(signal.SIGTERM)
        _, log = second.communicate(timeout=60)
    assert _jobs(database)[f"{1:032x}"] == ("done", 2)  # the attempt cut short, then the one that finished
    assert _count(database, "SELECT count(*) FROM attributions") == 1
    assert "1 run(s) judged" in log
