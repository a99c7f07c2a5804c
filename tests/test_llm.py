"""The OpenAI-compatible backend with the real ``openai`` client over an ``httpx.MockTransport``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from reflect_otel.config import LLMConfig, ReflectConfig, SchemaMode
from reflect_otel.errors import ConfigError, LLMError
from reflect_otel.llm import ChatMessage, make_llm
from reflect_otel.llm.base import LLMOutputError
from reflect_otel.llm.openai_compat import OpenAICompatibleLLM, reset_negotiation
from reflect_otel.prompts import LocalizationOutput


@pytest.fixture(autouse=True)
def _fresh_negotiation() -> None:
    reset_negotiation()  # what an endpoint accepted is remembered per process; each test starts anew


GOOD = {"error_step": 2, "confidence": 0.7, "reasoning": "r", "what_should_have_been_done": "w"}
MESSAGES = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="which step?")]


def backend(handler: Any, **config: Any) -> tuple[OpenAICompatibleLLM, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        return handler(body, len(seen))

    client = openai.OpenAI(
        api_key="k",
        base_url="http://llm.test/v1",
        max_retries=config.setdefault("max_retries", 2),
        http_client=httpx.Client(transport=httpx.MockTransport(record)),
    )
    cfg = LLMConfig(**({"model": "m", "base_url": "http://llm.test/v1", "api_key": "k"} | config))
    return OpenAICompatibleLLM(cfg, client=client), seen


def reply(content: str, prompt: int = 11, completion: int = 7) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        },
    )


def test_asks_for_the_json_schema_and_parses() -> None:
    llm, seen = backend(lambda body, n: reply(json.dumps(GOOD)))
    out = llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    assert out.value.error_step == 2 and out.usage.prompt_tokens == 11 and out.attempts == 1
    fmt = seen[0]["response_format"]
    assert (
        fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["properties"]["error_step"]["type"] == "integer"
    )
    assert "JSON schema" in seen[0]["messages"][-1]["content"]


def test_falls_back_to_json_mode_when_schemas_are_refused() -> None:
    def handler(body: dict[str, Any], n: int) -> httpx.Response:
        if body["response_format"]["type"] == "json_schema":
            return httpx.Response(400, json={"error": {"message": "response_format json_schema unsupported"}})
        return reply("```json\n" + json.dumps(GOOD) + "\n```")

    llm, seen = backend(handler)
    assert llm.complete(MESSAGES, LocalizationOutput, stage="localize").value.error_step == 2
    assert [b["response_format"]["type"] for b in seen] == ["json_schema", "json_object"]
    assert "schema" in seen[-1]["response_format"]  # the next step down: JSON mode with the schema (llama.cpp)
    llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    assert seen[-1]["response_format"]["type"] == "json_object" and len(seen) == 3  # remembered


def test_steps_down_the_whole_ladder_on_500s_that_name_the_format_without_retrying_them(caplog: Any) -> None:
    """A plain llama.cpp Python server answers 500 to json_schema; some servers refuse a schema in JSON mode."""

    def handler(body: dict[str, Any], n: int) -> httpx.Response:
        fmt = body["response_format"]
        if fmt["type"] == "json_schema":
            return httpx.Response(500, json={"detail": "response_format.type: Input should be 'text' or 'json_object'"})
        if "schema" in fmt:
            return httpx.Response(400, json={"error": {"message": "json_object does not take a schema"}})
        return reply(json.dumps(GOOD))

    llm, seen = backend(handler, max_retries=3)
    with caplog.at_level("WARNING", logger="reflect_otel.llm.openai"):
        assert llm.complete(MESSAGES, LocalizationOutput, stage="localize").value.error_step == 2
        assert [("schema" in b["response_format"], b["response_format"]["type"]) for b in seen] == [
            (False, "json_schema"),
            (True, "json_object"),
            (False, "json_object"),
        ]  # no retries of a refusal
        again, seen_again = backend(handler)  # another client of the same endpoint starts where the first ended
        again.complete(MESSAGES, LocalizationOutput, stage="localize")
        assert [b["response_format"] for b in seen_again] == [{"type": "json_object"}]
    assert sum("structured output as json_object" in r.message for r in caplog.records) == 1


def test_an_unrelated_server_error_is_retried_not_taken_for_a_refusal() -> None:
    def handler(body: dict[str, Any], n: int) -> httpx.Response:
        return httpx.Response(503, json={"detail": "overloaded"}) if n == 1 else reply(json.dumps(GOOD))

    llm, seen = backend(handler, model="m-retry")
    assert llm.complete(MESSAGES, LocalizationOutput, stage="localize").value.error_step == 2
    assert [b["response_format"]["type"] for b in seen] == ["json_schema", "json_schema"]


def test_llama_cpp_schema_mode() -> None:
    llm, seen = backend(lambda body, n: reply(json.dumps(GOOD)), schema_mode=SchemaMode.JSON_OBJECT_SCHEMA)
    llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    assert seen[0]["response_format"]["type"] == "json_object" and "schema" in seen[0]["response_format"]


def test_invalid_output_is_repaired_once_then_fails() -> None:
    llm, seen = backend(lambda body, n: reply('{"error_step": "two"}'))
    with pytest.raises(LLMOutputError, match="after one repair attempt") as caught:
        llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    assert len(seen) == 2 and caught.value.usage.prompt_tokens == 22
    assert "That reply was not valid" in seen[1]["messages"][-1]["content"]


def test_server_errors_are_retried_then_raise_a_clear_error() -> None:
    llm, seen = backend(lambda body, n: httpx.Response(503, json={"error": {"message": "overloaded"}}), max_retries=2)
    with pytest.raises(LLMError, match=r"failed after 2 retries.*REFLECT_LLM_BASE_URL"):
        llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    assert len(seen) == 3  # the first try and two retries


def test_rate_limit_then_success() -> None:
    llm, seen = backend(
        lambda body, n: httpx.Response(429, headers={"retry-after": "0"}) if n == 1 else reply(json.dumps(GOOD))
    )
    assert llm.complete(MESSAGES, LocalizationOutput, stage="localize").value.error_step == 2 and len(seen) == 2


def test_config_precedence_and_errors() -> None:
    env = {"OPENAI_API_KEY": "from-openai", "REFLECT_LLM_API_KEY": "from-reflect", "REFLECT_LLM_MODEL": "m1"}
    config = LLMConfig.from_env(env, model="explicit")
    assert config.api_key == "from-reflect" and config.model == "explicit" and config.is_configured
    assert not LLMConfig.from_env({}).is_configured
    with pytest.raises(ConfigError, match="timeout_s"):
        LLMConfig.from_env({"REFLECT_LLM_TIMEOUT_S": "-1"})
    with pytest.raises(ConfigError, match="REFLECT_ROUNDS"):
        ReflectConfig.from_env({"REFLECT_ROUNDS": "0"})
    with pytest.raises(ConfigError, match="REFLECT_LLM_MODEL"):
        OpenAICompatibleLLM(LLMConfig(base_url="http://x/v1"))
    with pytest.raises(ConfigError, match="unknown LLM backend 'nope'"):
        make_llm(LLMConfig(), backend="nope")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/v1\n----\nException occurred during processing",  # a log captured with the URL
        "http://127.0.0.1:8000/v1 http://127.0.0.1:8001/v1",
        "127.0.0.1:8000/v1",  # no scheme
        "ftp://host/v1",
        "http://host:port/v1",
    ],
)
def test_an_endpoint_that_is_not_one_url_is_refused_naming_the_variable(url: str) -> None:
    """Refused when the configuration is read, not by the HTTP client in the middle of a run (where it was an
    'internal error'); a URL pasted with its newline is taken."""
    with pytest.raises(ConfigError, match=r"setting 'base_url'.*REFLECT_LLM_BASE_URL or OPENAI_BASE_URL"):
        LLMConfig.from_env({"REFLECT_LLM_BASE_URL": url})
    assert LLMConfig.from_env({"REFLECT_LLM_BASE_URL": " http://127.0.0.1:8000/v1\n"}).base_url == (
        "http://127.0.0.1:8000/v1"
    )


def test_own_model_calls_are_not_traced_into_the_application(instrumented: Any) -> None:
    """With the OpenAI instrumentation on, the auditor's calls must not appear as application spans."""
    before = len(instrumented.exporter.get_finished_spans())
    llm, seen = backend(lambda body, n: reply(json.dumps(GOOD)))
    llm.complete(MESSAGES, LocalizationOutput, stage="localize")
    assert len(seen) == 1 and len(instrumented.exporter.get_finished_spans()) == before
