"""An LLM endpoint that is down, silent or missing is said once, on the screen, with its URL: the real ``openai``
client against a closed port, a server that accepts and never answers, and one that answers 401; and the light
install's missing model names both ways to get one."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reflect_otel.config import LLMConfig
from reflect_otel.errors import EndpointDownError, LLMError, NoModelError
from reflect_otel.llm import ChatMessage
from reflect_otel.llm.factory import GET_A_MODEL, make_llm, model_missing
from reflect_otel.llm.openai_compat import STOP_AFTER, OpenAICompatibleLLM, endpoint_down, reset_negotiation
from reflect_otel.prompts import LocalizationOutput

MESSAGES = [ChatMessage(role="user", content="which step?")]


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    reset_negotiation()
    yield
    reset_negotiation()  # an endpoint taken for down here must not be down for the next test


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(5)
    for connection in held:
        connection.close()
    server.close()


def _llm(port: int, **config: object) -> OpenAICompatibleLLM:
    return OpenAICompatibleLLM(LLMConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key="k", **config))


def test_a_refused_endpoint_is_taken_for_down_after_a_few_calls_and_then_fails_at_once() -> None:
    port = _closed_port()
    llm = _llm(port, max_retries=1)
    for _ in range(STOP_AFTER):
        assert endpoint_down() is None
        with pytest.raises(LLMError, match=f"127.0.0.1:{port}.*failed after 1 retries: Connection error"):
            llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    down = endpoint_down()
    assert isinstance(down, EndpointDownError)
    assert f"LLM endpoint http://127.0.0.1:{port}/v1 (model m) failed {STOP_AFTER} times in a row" in str(down)
    assert "REFLECT_LLM_BASE_URL" in str(down)
    started = time.monotonic()
    with pytest.raises(EndpointDownError):  # no more waiting on it
        llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    assert time.monotonic() - started < 0.5


def test_an_endpoint_that_keeps_timing_out_is_taken_for_down_and_says_to_give_it_longer(silent_port: int) -> None:
    llm = _llm(silent_port, timeout_s=0.3, max_retries=0)
    for _ in range(STOP_AFTER):
        with pytest.raises(LLMError, match="timed out"):
            llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    down = endpoint_down()
    assert isinstance(down, EndpointDownError)
    assert f"failed {STOP_AFTER} times in a row the same way (Request timed out)" in str(down)
    assert "give it longer (REFLECT_LLM_TIMEOUT_S, e.g. 600)" in str(down) and "REFLECT_LLM_MODEL" not in str(down)


def test_the_timeout_bounds_the_wait_retries_included_and_a_slow_request_says_what_it_waits_for(
    silent_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    llm = _llm(silent_port, timeout_s=1.5, max_retries=3)
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="reflect_otel.llm.openai"),
        pytest.raises(LLMError, match="timed out") as failed,
    ):
        llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    assert "No answer within 1.5 s, retries included" in str(failed.value)  # a timeout names its own fix
    assert "give it longer (REFLECT_LLM_TIMEOUT_S, e.g. 600)" in str(failed.value)
    assert ".." not in str(failed.value)
    waited = time.monotonic() - started
    assert waited < 3.0, waited  # three retries of 1.5 s each would be 6 s and more
    (notice,) = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert f"waiting for LLM endpoint http://127.0.0.1:{silent_port}/v1 (model m) for localize" in notice
    assert "REFLECT_LLM_TIMEOUT_S" in notice


def test_failures_of_different_kinds_do_not_add_up_and_an_answer_resets_the_count() -> None:
    replies = iter([401, 503, 401, 200, 401, 401])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            status = next(replies)
            body = (
                b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":'
                b'{"role":"assistant","content":"{\\"error_step\\":1,\\"confidence\\":0.5,\\"reasoning\\":\\"r\\",'
                b'\\"what_should_have_been_done\\":\\"w\\"}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,'
                b'"completion_tokens":1,"total_tokens":2}}'
                if status == 200
                else b'{"error":{"message":"no"}}'
            )
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        llm = _llm(server.server_address[1], max_retries=0, schema_mode="json_object")
        for _ in range(3):  # 401, 503, 401: never the same way twice in a row
            with pytest.raises(LLMError):
                llm.complete(MESSAGES, LocalizationOutput, stage="localize")
        assert llm.complete(MESSAGES, LocalizationOutput, stage="localize").value.error_step == 1
        for _ in range(2):
            with pytest.raises(LLMError):
                llm.complete(MESSAGES, LocalizationOutput, stage="localize")
        assert endpoint_down() is None  # two 401s since the answer: not yet
    finally:
        server.shutdown()


def test_without_an_endpoint_or_the_local_model_the_error_names_both_ways_to_get_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a)
    )  # the light install
    missing = model_missing(LLMConfig())
    assert missing is not None and GET_A_MODEL in missing
    assert "REFLECT_LLM_BASE_URL" in missing and "pip install 'reflect-otel[local]'" in missing
    with pytest.raises(NoModelError, match="REFLECT_LLM_BASE_URL"):
        make_llm(LLMConfig())
    assert model_missing(LLMConfig(base_url="http://127.0.0.1:1/v1", model="m")) is None  # an endpoint: a model
