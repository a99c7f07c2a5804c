"""The light install (``pip install -e .``: no endpoint, no local model) is a product: the decorator records every
run and judges what needs no model, with one warning that names both ways to get a model and no traceback.

Each script runs in a new interpreter in an empty folder, as a user's would, with the local model's server hidden
(``importlib.util.find_spec('llama_cpp')`` answers None, as it does where the ``local`` extra is not installed) and
no ``REFLECT_*``/``OPENAI_*`` variable set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb

LIGHT = """
import importlib.util
_real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name == "llama_cpp" else _real(name, *a, **k)
"""

DECORATED = """
import reflect_otel

@reflect_otel.observe
def answer(question: str) -> str:
    return "Paris"

with reflect_otel.expect("Rome"):
    print(answer("Which city has more people, Paris or Rome?"))
print(answer("Which city has more people, Paris or Rome?"))
reflect_otel.shutdown()
"""


def _run(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REFLECT_", "OPENAI_", "OTEL_"))}
    return subprocess.run(
        [sys.executable, "-c", LIGHT + script], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_decorator_records_and_judges_every_run_without_a_model(tmp_path: Path) -> None:
    result = _run(DECORATED, tmp_path)
    assert result.returncode == 0 and result.stdout.split() == ["Paris", "Paris"]
    assert "Traceback" not in result.stderr, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1, result.stderr  # one warning per process, not one per run
    (warning,) = warnings
    assert "REFLECT_LLM_BASE_URL" in warning and "pip install 'reflect-otel[local]'" in warning
    with duckdb.connect(str(tmp_path / "reflect.duckdb"), read_only=True) as db:
        assert db.execute("SELECT count(*) FROM traces").fetchone() == (2,)
        verdicts = db.execute("SELECT verifier, is_correct FROM verdicts ORDER BY verifier DESC").fetchall()
        assert verdicts == [("oracle", False), ("evidence", None)]  # against expect(); the evidence checks
        methods = db.execute("SELECT method FROM attributions").fetchall()
        assert methods == [("evidence",)]  # the wrong run, attributed by what needs no model


def test_a_model_that_cannot_be_made_costs_one_line_not_a_traceback_per_run(tmp_path: Path) -> None:
    """configure() with the local backend named outright: the run is still stored, and the cause said once."""
    script = "import os\nos.environ['REFLECT_LLM_BACKEND'] = 'local'\n" + DECORATED.replace(
        "import reflect_otel\n",
        "import reflect_otel\nfrom reflect_otel.llm.factory import LazyLLM, make_llm\n"
        "reflect_otel.configure(llm=LazyLLM(make_llm))\n",
    )
    result = _run(script, tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "could not process trace" in lines[0] and "REFLECT_LLM_BASE_URL" in lines[0], lines
    with duckdb.connect(str(tmp_path / "reflect.duckdb"), read_only=True) as db:
        assert db.execute("SELECT count(*) FROM traces").fetchone() == (2,)
