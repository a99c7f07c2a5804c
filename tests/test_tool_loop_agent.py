"""A user's own OpenAI tool loop (``benchmarks/tool_loop_agent.py``: seven tools of its own, JSON results) with the
real ``openai`` client and OpenInference's instrumentation against a scripted OpenAI-compatible server: its
``OpenAIToolLoopReplayAdapter``, built as a user builds it (nothing said of determinism), counts as deterministic
when its client is the embedded server's and replays greedily; a replay budget too small for one controlled test is
refused before any model call, naming the budget it needs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.tool_loop_agent import QUESTIONS, Loop, execute_tool
from reflect_otel.attribution.methods import method_spec
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import ReflectConfig
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.record import AttributionMode, AttributionStatus
from reflect_otel.replay import BudgetedReplay, ReplayRequest, is_deterministic
from reflect_otel.testing import ScriptedLLM
from reflect_otel.testing.openai_server import ScriptedOpenAIServer, ScriptedToolCall, ScriptedTurn
from reflect_otel.trace import StructuredTrace
from tests.conftest import Instrumented


def bookshop_model(body: dict[str, Any]) -> ScriptedTurn:
    """The model on 'Who wrote The Glass Orchard?': it searches, reads the book, then gives the author's id as the
    answer without looking the author up (the wrong answer)."""
    results = [json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"]
    turn = len(results)
    if not results:
        return ScriptedTurn(
            "", [ScriptedToolCall("search_books", {"text": "glass orchard", "max_results": 3}, f"call_{turn}")]
        )
    if "books" in results[-1]:
        book = results[-1]["books"][0]["id"]
        return ScriptedTurn("", [ScriptedToolCall("get_book", {"book_id": book}, f"call_{turn}")])
    if "author_id" in results[-1]:
        answer = {"answer": results[-1]["author_id"]}
        return ScriptedTurn("", [ScriptedToolCall("final_answer", answer, f"call_{turn}")])
    return ScriptedTurn(
        "", [ScriptedToolCall("final_answer", {"answer": results[-1].get("name", "?")}, f"call_{turn}")]
    )


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(bookshop_model) as running:
        yield running


def client_of(server: ScriptedOpenAIServer) -> Any:
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)


def recorded(instrumented: Instrumented, loop: Loop) -> tuple[str, StructuredTrace]:
    from reflect_otel.reading.capture import recorded_run

    with recorded_run(instrumented.provider, "bookshop_agent") as run:
        answer = loop.ask(QUESTIONS[0][0])
    assert run.trace is not None
    return answer, run.trace.model_copy(update={"final_answer": answer})


def test_the_users_loop_calls_its_own_tools_and_its_adapter_replays_it(
    instrumented: Instrumented, server: ScriptedOpenAIServer
) -> None:
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    loop = Loop(client_of(server), "scripted-model")
    answer, trace = recorded(instrumented, loop)
    assert answer == "a1" and loop.native_calls == 3 and loop.written_calls == 0
    assert [s.tool_name for s in trace.steps[:2]] == ["search_books", "get_book"]
    assert json.loads(trace.steps[1].tool_result or "")["title"] == "The Glass Orchard"
    assert {t.name for t in trace.tools} >= {"search_books", "get_author", "final_answer"}  # seven tools, and more
    assert json.loads(execute_tool("calculate", {"expression": "__import__('os')"})) == {
        "error": "only numbers, + - * / and parentheses"
    }
    adapter = OpenAIToolLoopReplayAdapter(
        Loop(client_of(server), "scripted-model").resume,
        tracer_provider=instrumented.provider,
        execute_tool=execute_tool,
        client=client_of(server),
    )
    # an endpoint that is not the embedded server: sampled, one replay per arm not enough
    assert not adapter.deterministic and not is_deterministic(adapter, trace) and not adapter.greedy
    replayed = adapter.replay(ReplayRequest.intervention(trace, 2))
    assert replayed.prefix_verified and replayed.final_answer == "a1"
    assert server.requests[-1]["temperature"] == 0  # resumed as the loop runs it


def test_on_the_embedded_server_the_adapter_is_greedy_and_counts_as_deterministic(
    instrumented: Instrumented, server: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reflect_otel.llm import local
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    monkeypatch.setattr(local, "_serving", {server.base_url.rstrip("/")})  # the scripted server stands in for it
    loop = Loop(client_of(server), "scripted-model")
    _, trace = recorded(instrumented, loop)

    def resume_as_written(messages: list[dict[str, Any]], guard: Any) -> str:  # no temperature keyword
        return Loop(client_of(server), "scripted-model").resume(messages, guard, temperature=0.7)

    plain = OpenAIToolLoopReplayAdapter(
        resume_as_written, tracer_provider=instrumented.provider, execute_tool=execute_tool, client=client_of(server)
    )
    # its run asked at temperature 0 and a replay resends the loop's requests: greedy on this server
    assert is_deterministic(plain, trace) and is_deterministic(BudgetedReplay(plain, 12), trace)
    sampled = trace.model_copy(
        update={"steps": tuple(s.model_copy(update={"model_input": _at(s.model_input, 0.7)}) for s in trace.steps)}
    )
    assert not is_deterministic(plain, sampled)  # a run sampled at 0.7 replays sampled
    # a resume that takes a temperature: the adapter makes every replay greedy itself, whatever the run asked
    greedy = OpenAIToolLoopReplayAdapter(
        lambda messages, guard, temperature=0.7: Loop(client_of(server), "scripted-model").resume(
            messages, guard, temperature=temperature
        ),
        tracer_provider=instrumented.provider,
        execute_tool=execute_tool,
        client=client_of(server),
    )
    assert greedy.greedy and greedy.deterministic and is_deterministic(greedy, sampled)
    greedy.replay(ReplayRequest.intervention(sampled, 1))
    assert server.requests[-1]["temperature"] == 0
    told = OpenAIToolLoopReplayAdapter(
        resume_as_written, tracer_provider=instrumented.provider, client=client_of(server), deterministic=False
    )
    assert not is_deterministic(told, trace)  # what the caller says wins


def _at(model_input: str | None, temperature: float) -> str | None:
    if not model_input:
        return model_input
    body = json.loads(model_input)
    return json.dumps({**body, "temperature": temperature}) if isinstance(body, dict) else model_input


def test_a_budget_too_small_for_one_test_is_refused_before_any_model_call(
    instrumented: Instrumented, server: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reflect_otel.llm import local
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    loop = Loop(client_of(server), "scripted-model")
    _, trace = recorded(instrumented, loop)
    asked = len(server.requests)
    adapter = OpenAIToolLoopReplayAdapter(
        loop.resume, tracer_provider=instrumented.provider, execute_tool=execute_tool, client=client_of(server)
    )
    auditor = ScriptedLLM()  # any call would fail: none may be made
    for max_replays, need, sampled in ((5, 9, True), (2, 3, False)):
        if not sampled:
            monkeypatch.setattr(local, "_serving", {server.base_url.rstrip("/")})
        service = AttributionService(
            auditor, method_spec("reflect"), verifier=OracleVerifier(), config=ReflectConfig(), max_replays=max_replays
        )
        record = service.process(trace, expected="Ines Varga", replay=adapter).record
        assert record is not None and record.status is AttributionStatus.SKIPPED and record.mode is AttributionMode.NONE
        assert f"({max_replays} replays) cannot pay for one controlled test, which needs {need}" in record.reason
        assert f"to {need} or more" in record.reason
        assert not record.llm_calls and not record.replays
    assert auditor.requests == [] and len(server.requests) == asked
