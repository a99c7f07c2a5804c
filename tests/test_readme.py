"""The README (and the reference in docs/usage.md) as a reader meets it: each snippet that needs no model is run as
written, in document order, in one empty folder, by a new interpreter or a shell, as a reader would paste it; the
snippets that need a model run against a scripted OpenAI-compatible server on loopback (``OPENAI_BASE_URL``),
standing in for the reader's own; and the README reads in five minutes (its first screen holds the two commands,
what they cost and what the demo prints)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedToolCall, ScriptedTurn

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
USAGE = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", README, flags=re.DOTALL | re.MULTILINE)
SNIPPETS = [code for kind, code in BLOCKS if kind == "python"]
USAGE_SNIPPETS = re.findall(r"^```python\n(.*?)^```", USAGE, flags=re.DOTALL | re.MULTILINE)

NEEDS_A_MODEL_OR_AN_INSTALL = ("pip install", "reflect-otel demo", "python -m pytest", "REFLECT_LLM_BASE_URL=")
"""A shell snippet with one of these is not run here: it installs, needs a model, or is the test command itself
(``.ci/run`` runs the install and the tests as the README writes them)."""

LIGHT = """
import importlib.util
_real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name == "llama_cpp" else _real(name, *a, **k)
"""
"""Run before a snippet said to need no model: the local model's server is hidden, as in the light install."""


def _needs_a_model(kind: str, code: str) -> bool:
    if kind == "python":
        return "ChatOpenAI" in code  # the LangGraph agent: its own model is an endpoint
    return any(marker in code for marker in NEEDS_A_MODEL_OR_AN_INSTALL)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REFLECT_", "OPENAI_", "OTEL_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # reflect-otel, as installed
    return env | extra


def _turn(body: dict[str, Any]) -> ScriptedTurn:
    """The agent's model: look both cities up, then answer. Any other request (an attribution's stages) gets a
    reply that is not the JSON asked for."""
    messages = body.get("messages", [])
    if not body.get("tools"):
        return ScriptedTurn(text="(the scripted server answers only the agent)")
    if not any(m.get("role") == "tool" for m in messages):
        calls = [ScriptedToolCall("population", {"city": c}, f"call_{c.lower()}") for c in ("Paris", "Rome")]
        return ScriptedTurn(tool_calls=calls)
    return ScriptedTurn(text="Rome")


def _run_python(snippet: str, folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", snippet], cwd=folder, env=_env(**env), capture_output=True, text=True, timeout=300
    )


def test_the_first_screen_holds_the_two_commands_their_cost_and_the_demo_and_the_whole_is_short() -> None:
    lines = README.splitlines()
    assert len(lines) < 200, len(lines)
    first = "\n".join(lines[:60])
    setup = "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install -e '.[dev,local]' && reflect-otel demo"
    assert setup in first and "\npython -m pytest\n" in first
    assert "1.1 GB" in first and "5 to 8 minutes" in first and "2 min 18 s" in first  # the build, download, demo
    assert "```text\n" in first and "verified (controlled replay)" in first  # what the demo prints
    assert "## What a verified step means" in README
    assert not re.search(r"\bissues? \d", README, flags=re.IGNORECASE)


def test_the_ci_installs_and_tests_as_the_readme_says() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install --quiet -e '.[dev,local]'" in ci
    assert "\npython -m pytest\n" in ci


def test_the_snippets_this_file_runs_are_the_readmes() -> None:
    skipped = [code for kind, code in BLOCKS if kind in ("bash", "python") and _needs_a_model(kind, code)]
    assert len(skipped) == 5, skipped  # the two commands, the light install, REFLECT on an endpoint, LangGraph
    assert len(SNIPPETS) == 2 and "checkpointer=InMemorySaver()" in SNIPPETS[1]
    assert (
        len(USAGE_SNIPPETS) == 2
        and "from reflect_otel.attribution.pipeline import ReflectPipeline" in USAGE_SNIPPETS[1]
    )


@pytest.mark.slow  # a dozen commands and a new interpreter
def test_every_snippet_that_needs_no_model_runs_as_written_in_order(tmp_path: Path) -> None:
    ran = []
    for kind, code in BLOCKS:
        if _needs_a_model(kind, code) or kind not in ("bash", "python"):
            continue
        if kind == "python":
            result = _run_python(LIGHT + code, tmp_path)
        else:
            result = subprocess.run(
                ["bash", "-e", "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
            )
        assert result.returncode == 0 and "Traceback" not in result.stderr, (code, result.stderr[-3000:])
        ran.append((kind, code, result))
    assert [kind for kind, _, _ in ran] == ["bash", "python", "bash"]
    # the tour's claims: the evidence checks name step 1 of the table agent's run, a page was written
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    named = {r["trace_id"][:4]: r["step_index"] for r in records}
    assert named["6d90"] == 1 and len(records) == 5
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert ">>  1. tool_call" in ran[0][2].stdout
    # the decorator with no model: its run stored and judged against expect(), said once on stderr
    assert "REFLECT_LLM_BASE_URL" in ran[1][2].stderr and ran[1][2].stderr.count("reflect-otel: no model") == 1
    assert "answer" in ran[2][2].stdout and "oracle" in ran[2][2].stdout


@pytest.mark.slow  # a new interpreter that imports LangGraph, LangChain and OpenInference
def test_the_langgraph_snippet_runs_as_written(tmp_path: Path) -> None:
    (snippet,) = [s for s in SNIPPETS if "ChatOpenAI" in s]
    with ScriptedOpenAIServer(_turn) as server:
        result = _run_python(
            snippet,
            tmp_path,
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-scripted",
            OPENAI_MODEL="scripted-model",
        )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stdout.strip() == "Rome"
    with duckdb.connect(str(tmp_path / "reflect.duckdb"), read_only=True) as db:
        assert db.execute("SELECT agent, step_count FROM traces").fetchall() == [("answer", 3)]
        assert db.execute("SELECT verifier, is_correct FROM verdicts").fetchall() == [("oracle", True)]
        assert db.execute("SELECT count(*) FROM attributions").fetchall() == [(0,)]  # a right run is not attributed


def test_the_span_processor_snippet_runs_as_written(tmp_path: Path) -> None:
    (snippet,) = [s for s in USAGE_SNIPPETS if "ReflectSpanProcessor" in s]
    result = _run_python(
        snippet + "\nwith provider.get_tracer('t').start_as_current_span('agent'):\n    pass\nprovider.shutdown()\n",
        tmp_path,
        OPENAI_BASE_URL="http://127.0.0.1:9",
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.slow  # attributes three traces (against a server that cannot answer, so each records its errors)
def test_the_pipeline_snippet_runs_as_written(tmp_path: Path) -> None:
    (snippet,) = [s for s in USAGE_SNIPPETS if "ReflectPipeline(" in s]
    subprocess.run(
        [sys.executable, "-m", "reflect_otel", "import", "--example", "-o", "traces.jsonl"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=120,
    )
    with ScriptedOpenAIServer(_turn) as server:
        result = _run_python(
            snippet,
            tmp_path,
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-scripted",
            OPENAI_MODEL="scripted-model",
        )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3 and all(line.split()[1] == "unverified" for line in lines), result.stdout
