"""The README's Python snippets run as written (issue 42): each ```python block is taken out of README.md and run by
a new interpreter in an empty folder, as a reader would paste it. The endpoint they call is a scripted
OpenAI-compatible server on loopback (``OPENAI_BASE_URL``), standing in for the reader's own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedToolCall, ScriptedTurn

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)


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


def _run(snippet: str, folder: Path, base_url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REFLECT_", "OPENAI_", "OTEL_"))}
    env |= {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sk-scripted", "OPENAI_MODEL": "scripted-model"}
    return subprocess.run(
        [sys.executable, "-c", snippet], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_readme_has_the_snippets_this_file_runs() -> None:
    assert len(SNIPPETS) == 3
    assert (
        "checkpointer=InMemorySaver()" in SNIPPETS[0]
        and "from reflect_otel.pipeline import ReflectPipeline" in SNIPPETS[2]
    )


@pytest.mark.slow  # a new interpreter that imports LangGraph, LangChain and OpenInference
def test_the_decorator_snippet_runs_as_written(tmp_path: Path) -> None:
    (snippet,) = [s for s in SNIPPETS if "reflect_otel.observe" in s]
    with ScriptedOpenAIServer(_turn) as server:
        result = _run(snippet, tmp_path, server.base_url)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stdout.strip() == "Rome"
    with duckdb.connect(str(tmp_path / "reflect.duckdb"), read_only=True) as db:
        assert db.execute("SELECT agent, step_count FROM traces").fetchall() == [("answer", 3)]
        assert db.execute("SELECT verifier, is_correct FROM verdicts").fetchall() == [("oracle", True)]
        assert db.execute("SELECT count(*) FROM attributions").fetchall() == [(0,)]  # a right run is not attributed


def test_the_span_processor_snippet_runs_as_written(tmp_path: Path) -> None:
    (snippet,) = [s for s in SNIPPETS if "ReflectSpanProcessor" in s]
    result = _run(
        snippet + "\nwith provider.get_tracer('t').start_as_current_span('agent'):\n    pass\nprovider.shutdown()\n",
        tmp_path,
        "http://127.0.0.1:9",
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.slow  # attributes three traces (against a server that cannot answer, so each records its errors)
def test_the_pipeline_snippet_runs_as_written(tmp_path: Path) -> None:
    (snippet,) = [s for s in SNIPPETS if "ReflectPipeline(" in s]
    subprocess.run(
        [sys.executable, "-m", "reflect_otel", "import", "--example", "-o", "traces.jsonl"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=120,
    )
    with ScriptedOpenAIServer(_turn) as server:
        result = _run(snippet, tmp_path, server.base_url)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3 and all(line.split()[1] == "unverified" for line in lines), result.stdout
