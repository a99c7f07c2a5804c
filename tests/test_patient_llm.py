"""A busy endpoint (429, 503, a stall) is waited out, not failed: the real ``openai`` client over an
``httpx.MockTransport``, the endpoint's ``Retry-After`` honoured, a wrong key still failing at once, and a released
job stopping the wait and passing through a method's error boundary, which records every ``Exception``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from reflect_otel.attribution.methods import method_spec
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import LLMConfig
from reflect_otel.errors import EndpointBusyError, LLMError
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.llm import ChatMessage
from reflect_otel.llm.openai_compat import OpenAICompatibleLLM, reset_negotiation
from reflect_otel.llm.patient import JobReleased, PatientLLM
from reflect_otel.prompts import LocalizationOutput
from reflect_otel.testing import make_trace

MESSAGES = [ChatMessage(role="user", content="which step?")]
GOOD = {"error_step": 1, "confidence": 0.7, "reasoning": "r", "what_should_have_been_done": "w"}


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    reset_negotiation()
    yield
    reset_negotiation()


def _answer(content: str) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        },
    )  # fmt: skip


def _endpoint(replies: list[httpx.Response]) -> tuple[OpenAICompatibleLLM, list[int]]:
    """The backend with no retries of its own, answering ``replies`` in turn (the last one for ever after)."""
    seen: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        return replies[min(len(seen), len(replies)) - 1]

    client = openai.OpenAI(
        api_key="k", base_url="http://llm.test/v1", max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handle)),
    )  # fmt: skip
    config = LLMConfig(model="m", base_url="http://llm.test/v1", api_key="k", max_retries=0)
    return OpenAICompatibleLLM(config, client=client), seen


class _Gate:
    """Records the pauses asked for, sleeping a moment each (an endpoint's cool-off is real time)."""

    def __init__(self, release_after: int | None = None) -> None:
        self.pauses: list[float] = []
        self.requests = 0
        self.release_after = release_after

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        self.requests += 1
        yield

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if self.release_after is not None and len(self.pauses) >= self.release_after:
            raise JobReleased("another worker took the job")
        import time

        time.sleep(min(seconds, 0.05))


def test_a_throttled_endpoint_is_waited_out_honouring_its_retry_after() -> None:
    busy = [httpx.Response(429, headers={"retry-after": "0.3"})] * 4 + [httpx.Response(503)]
    llm, seen = _endpoint([*busy, _answer(json.dumps(GOOD))])
    gate = _Gate()
    completion = PatientLLM(llm, gate=gate).complete(MESSAGES, LocalizationOutput, stage="localize")
    assert completion.value.error_step == 1 and completion.usage.prompt_tokens == 11  # the answered try only
    assert len(seen) == 6 and gate.requests >= 6  # tries refused at once while the endpoint is taken for down too
    assert all(p >= 0.3 for p in gate.pauses[:3])  # the endpoint's Retry-After, at least


def test_a_busy_failure_says_so_with_the_pause_asked_and_a_wrong_key_is_not_waited_for() -> None:
    llm, _ = _endpoint([httpx.Response(429, headers={"retry-after": "7"})])
    with pytest.raises(EndpointBusyError) as busy:
        llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    assert busy.value.retry_after_s == 7.0
    reset_negotiation()
    wrong_key, seen = _endpoint([httpx.Response(401, json={"error": {"message": "bad key"}})])
    gate = _Gate()
    with pytest.raises(LLMError) as failed:
        PatientLLM(wrong_key, gate=gate).complete(MESSAGES, LocalizationOutput, stage="localize")
    assert not isinstance(failed.value, EndpointBusyError) and gate.pauses == [] and len(seen) == 1


def test_a_released_job_ends_the_wait_and_passes_through_the_methods_error_boundary(tmp_path: Any) -> None:
    llm, seen = _endpoint([httpx.Response(503)])
    gate = _Gate(release_after=2)
    store = DuckDBStore(tmp_path / "store.duckdb")
    service = AttributionService(PatientLLM(llm, gate=gate), method_spec("aao"), verifier=OracleVerifier(), store=store)
    trace = make_trace("capital?", [{"tool": "lookup", "args": {}, "result": "Lyon"}], final_answer="Lyon")
    with pytest.raises(JobReleased):  # the method records every Exception as the run's outcome; not this
        service.process(trace, expected="Paris")
    assert len(seen) == 2 and store.flush(10)
    assert store._read("SELECT count(*) FROM attributions", []) == [(0,)]  # nothing written for a released job
    store.close()
