"""Every replay adapter passes the same conformance suite, on real agents: a LangGraph graph, an OpenAI tool loop and
an Anthropic Messages API tool loop (deterministic models whose bug a correction repairs; the Anthropic one behind a
scripted Messages API server on loopback), through the real OpenInference instrumentation."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.trace import format_trace_id

from reflect_otel.errors import ReplayError
from reflect_otel.flagging.consistency import ConsistencyVerifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.replay import ReplayRequest
from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter
from reflect_otel.replay_adapters.openai_loop import IrreversibleToolError, OpenAIToolLoopReplayAdapter
from reflect_otel.testing.conformance import ConformanceCase, allowed_points, run_conformance
from reflect_otel.trace import StepAction, StructuredTrace
from tests import replay_agents
from tests.conftest import Instrumented


def _is_correct(answer: str | None) -> bool:
    return answer == replay_agents.CORRECT


def _record(instrumented: Instrumented, run: Any) -> StructuredTrace:
    before = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()}
    assert run() == replay_agents.WRONG
    (trace_id,) = {format_trace_id(s.context.trace_id) for s in instrumented.exporter.get_finished_spans()} - before
    return instrumented.assembled(trace_id)


def _case(adapter: Any, trace: StructuredTrace, requests: list[str]) -> ConformanceCase:
    """The replay agents' case: the FIX injection and the corrected lookup as the action both repair the run."""
    return ConformanceCase(
        adapter,
        trace,
        replay_agents.FIX,
        _is_correct,
        lambda: requests,
        action=replay_agents.ACTION,
        action_result=replay_agents.ACTION_RESULT,
    )


@pytest.fixture
def langgraph_case(instrumented: Instrumented) -> ConformanceCase:
    requests: list[str] = []
    graph = replay_agents.build_graph(requests)
    trace = _record(instrumented, lambda: replay_agents.run_graph(graph, "user-thread"))
    adapter = LangGraphReplayAdapter(graph, tracer_provider=instrumented.provider)
    return _case(adapter, trace, requests)


@pytest.fixture
def openai_case(instrumented: Instrumented) -> ConformanceCase:
    requests: list[str] = []
    client = replay_agents.openai_client(requests)
    tracer = instrumented.provider.get_tracer("tests.replay_loop")
    trace = _record(instrumented, lambda: replay_agents.run_loop(client, tracer))
    adapter = OpenAIToolLoopReplayAdapter(
        lambda messages, guard: replay_agents.tool_loop(client, tracer, messages, guard),
        tracer_provider=instrumented.provider,
        execute_tool=replay_agents.execute_tool,
    )
    return _case(adapter, trace, requests)


@pytest.fixture
def anthropic_case(instrumented: Instrumented) -> Iterator[ConformanceCase]:
    pytest.importorskip("anthropic")
    import anthropic
    from openinference.instrumentation.anthropic import AnthropicInstrumentor

    from reflect_otel.replay_adapters.anthropic_loop import AnthropicToolLoopReplayAdapter
    from reflect_otel.testing.anthropic_server import ScriptedAnthropicServer

    AnthropicInstrumentor().instrument(tracer_provider=instrumented.provider)
    try:
        with ScriptedAnthropicServer(replay_agents.anthropic_turn) as server:
            client = anthropic.Anthropic(base_url=server.base_url, api_key="k", max_retries=0)
            tracer = instrumented.provider.get_tracer("tests.replay_anthropic")
            trace = _record(instrumented, lambda: replay_agents.run_anthropic_loop(client, tracer))
            adapter = AnthropicToolLoopReplayAdapter(
                lambda system, messages, guard: replay_agents.anthropic_tool_loop(
                    client, tracer, system, messages, guard
                ),
                tracer_provider=instrumented.provider,
                execute_tool=replay_agents.execute_tool,
            )
            case = _case(adapter, trace, [])
            yield dataclasses.replace(case, model_requests=lambda: [json.dumps(body) for body in server.requests])
    finally:
        AnthropicInstrumentor().uninstrument()


def test_recorded_buggy_runs_have_the_expected_shape(
    langgraph_case: ConformanceCase, openai_case: ConformanceCase
) -> None:
    for case in (langgraph_case, openai_case):
        assert [s.tool_name for s in case.trace.steps] == ["lookup_population", "add", "lookup_population", None]
        assert allowed_points(case.trace) == [0, 1, 3]  # 2 splits the parallel add + lookup(Rome) turn


def test_langgraph_adapter_conformance(langgraph_case: ConformanceCase) -> None:
    results = run_conformance(langgraph_case)
    assert "spans" not in {r.adapter_info["forked_from"] for r in results}  # forked from the run's checkpoints
    assert all(r.adapter_info["thread_id"].startswith("reflect-replay-") for r in results)
    graph = langgraph_case.adapter.graph  # type: ignore[attr-defined]
    # the user's thread was never branched: still the checkpoints of the one original run
    steps = [c.metadata["step"] for c in graph.checkpointer.list({"configurable": {"thread_id": "user-thread"}})]
    assert sorted(steps) == list(range(-1, max(steps) + 1))
    # continuation steps carry their LangGraph superstep in the new thread
    assert results[0].continuation[0].tool_args == {"city": "Paris"}


def test_langgraph_adapter_seeds_from_spans_without_checkpoints(langgraph_case: ConformanceCase) -> None:
    trace = langgraph_case.trace.model_copy(
        update={"replay": langgraph_case.trace.replay.model_copy(update={"thread_id": None})}
    )
    case = ConformanceCase(
        langgraph_case.adapter, trace, langgraph_case.fix, _is_correct, langgraph_case.model_requests
    )
    results = run_conformance(case, points=[1, 3])
    assert {r.adapter_info["forked_from"] for r in results} == {"spans"}


def test_openai_loop_adapter_conformance(openai_case: ConformanceCase) -> None:
    results = run_conformance(openai_case)
    assert all(r.adapter_info["adapter"] == "openai_loop" for r in results)


def test_anthropic_loop_adapter_conformance(anthropic_case: ConformanceCase) -> None:
    assert [s.tool_name for s in anthropic_case.trace.steps] == ["lookup_population", "add", "lookup_population", None]
    results = run_conformance(anthropic_case)
    assert all(r.adapter_info["adapter"] == "anthropic_loop" for r in results)


@pytest.mark.parametrize("role", ["user", "system"])
def test_anthropic_injection_goes_where_the_messages_api_allows_it(anthropic_case: ConformanceCase, role: str) -> None:
    before = len(anthropic_case.model_requests())
    result = anthropic_case.adapter.replay(
        ReplayRequest.intervention(anthropic_case.trace, 1, replay_agents.FIX, role=role)
    )  # type: ignore[arg-type]
    assert result.prefix_verified and _is_correct(result.final_answer)
    sent = json.loads(anthropic_case.model_requests()[before])  # the first call of the continuation
    if role == "system":  # appended to the system prompt, never a system message in the conversation
        assert sent["system"].endswith(replay_agents.FIX)
        assert all(m["role"] in ("user", "assistant") for m in sent["messages"])
    else:  # a text block on the last user turn (the tool results), keeping the turns alternating
        last = sent["messages"][-1]
        assert last["role"] == "user" and last["content"][-1] == {"type": "text", "text": replay_agents.FIX}
        assert last["content"][0]["type"] == "tool_result"


@pytest.mark.parametrize("role", ["user", "developer"])
def test_injection_role_is_configurable(openai_case: ConformanceCase, role: str) -> None:
    requests_before = len(openai_case.model_requests())
    result = openai_case.adapter.replay(ReplayRequest.intervention(openai_case.trace, 1, replay_agents.FIX, role=role))  # type: ignore[arg-type]
    assert result.prefix_verified and _is_correct(result.final_answer)
    assert len(openai_case.model_requests()) > requests_before


def test_irreversible_tools_stop_the_replay(
    instrumented: Instrumented, openai_case: ConformanceCase, langgraph_case: ConformanceCase
) -> None:
    client = replay_agents.openai_client()
    tracer = instrumented.provider.get_tracer("tests.replay_loop")
    guarded = OpenAIToolLoopReplayAdapter(
        lambda messages, guard: replay_agents.tool_loop(client, tracer, messages, guard),
        tracer_provider=instrumented.provider,
        irreversible_tools={"add"},
    )
    with pytest.raises(IrreversibleToolError, match="'add', which is marked irreversible"):
        guarded.replay(ReplayRequest.intervention(openai_case.trace, 1, replay_agents.FIX))
    sampling = OpenAIToolLoopReplayAdapter(  # a loop that can be resampled: its resume takes a temperature
        lambda messages, guard, temperature=None: replay_agents.tool_loop(client, tracer, messages, guard),
        tracer_provider=instrumented.provider,
        irreversible_tools={"add"},
    )
    with pytest.raises(IrreversibleToolError):  # a consistency check's resample stops as a replay does
        sampling.resample(ReplayRequest.resampling(openai_case.trace, 0.7), samples=1)
    graph = langgraph_case.adapter.graph  # type: ignore[attr-defined]
    lg = LangGraphReplayAdapter(graph, tracer_provider=instrumented.provider, irreversible_tools={"add"})
    with pytest.raises(IrreversibleToolError):
        lg.replay(ReplayRequest.intervention(langgraph_case.trace, 1, replay_agents.FIX))
    with pytest.raises(IrreversibleToolError):  # a consistency check's resample stops as a replay does
        lg.resample(ReplayRequest.resampling(langgraph_case.trace, 0.7), samples=1)
    unchecked = ConsistencyVerifier(lg, samples=2).verify(langgraph_case.trace, expected=None)
    assert unchecked.is_correct is None and "marked irreversible" in unchecked.reasoning
    allowed = LangGraphReplayAdapter(
        graph, tracer_provider=instrumented.provider, irreversible_tools={"add"}, allow_irreversible=True
    )
    assert _is_correct(
        allowed.replay(ReplayRequest.intervention(langgraph_case.trace, 1, replay_agents.FIX)).final_answer
    )


def test_without_the_fix_the_answer_stays_wrong(langgraph_case: ConformanceCase) -> None:
    result = langgraph_case.adapter.replay(ReplayRequest.intervention(langgraph_case.trace, 1, "be careful"))
    assert result.final_answer == replay_agents.WRONG


def test_openai_adapter_needs_recorded_requests(openai_case: ConformanceCase) -> None:
    stripped = openai_case.trace.model_copy(
        update={"steps": tuple(s.model_copy(update={"model_input": None}) for s in openai_case.trace.steps)}
    )
    with pytest.raises(ReplayError, match="no model request is recorded"):
        openai_case.adapter.replay(ReplayRequest.intervention(stripped, 1, "x"))


def _openai_turn(body: dict[str, Any]) -> Any:
    """The replay agents' model behind the scripted OpenAI server."""
    from reflect_otel.testing.openai_server import ScriptedToolCall, ScriptedTurn

    messages = body["messages"]
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
    instructions = [m["content"] for m in messages if m["role"] in ("system", "user", "developer")]
    results = [(names.get(m["tool_call_id"], ""), m["content"]) for m in messages if m["role"] == "tool"]
    text, calls = replay_agents.decide(instructions, results)
    turn = sum(1 for m in messages if m["role"] == "assistant")
    return ScriptedTurn(text, [ScriptedToolCall(n, a, f"call_{turn}_{k}") for k, (n, a) in enumerate(calls)])


def test_an_openai_proposal_sends_only_chat_completion_fields_of_the_recorded_request(
    instrumented: Instrumented,
) -> None:
    """The recorded request is trace content: a span that carries client options (headers, query parameters, a
    timeout, a body merged in) or account fields must not get them sent to the user's endpoint by a proposal."""
    import openai

    from reflect_otel.testing.openai_server import ScriptedOpenAIServer

    with ScriptedOpenAIServer(_openai_turn) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        tracer = instrumented.provider.get_tracer("tests.replay_loop")
        trace = _record(instrumented, lambda: replay_agents.run_loop(client, tracer))
        crafted = {
            "extra_headers": {"X-Crafted": "1", "Authorization": "Bearer stolen"},
            "extra_query": {"crafted": "1"},
            "extra_body": {"crafted_field": True},
            "timeout": 0.000001,
            "store": True,
            "user": "someone-else",
        }

        def with_crafted(text: str | None) -> str | None:
            return json.dumps(json.loads(text) | crafted) if text else text

        steps = tuple(s.model_copy(update={"model_input": with_crafted(s.model_input)}) for s in trace.steps)
        adapter = OpenAIToolLoopReplayAdapter(
            lambda messages, guard: replay_agents.tool_loop(client, tracer, messages, guard),
            tracer_provider=instrumented.provider,
            execute_tool=replay_agents.execute_tool,
            client=client,
        )
        sent = len(server.requests)
        (proposal,) = adapter.propose(
            ReplayRequest(
                trace=trace.model_copy(update={"steps": steps}), rollback_point=1, injection=replay_agents.FIX
            ),
            samples=1,
        )
    assert proposal.action == replay_agents.ACTION  # the model was asked, with the recorded model and tools
    (body,) = server.requests[sent:]
    (received,) = server.received[sent:]
    assert body["model"] == "correctable" and body["tools"] == replay_agents.TOOLS
    assert not {"crafted_field", "store", "user"} & set(body)
    assert "?" not in received.path and "x-crafted" not in received.headers
    assert received.headers["authorization"] == "Bearer k"  # the client's own key, not the span's
    assert (
        proposal.note == "6 recorded request field(s) not sent: extra_body, extra_headers, extra_query, store, "
        "timeout, user"
    )


class _Server:
    """A real HTTP server on loopback whose answer to each POST is ``respond(body) -> (status, bytes)``."""

    def __init__(self, respond: Any) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                status, body = respond(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/replay"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_http_adapter_conformance_against_a_real_server(openai_case: ConformanceCase) -> None:
    from reflect_otel.replay_adapters.http import HTTPReplayAdapter, replay_handler

    server = _Server(lambda body: replay_handler(openai_case.adapter, body))
    try:
        adapter = HTTPReplayAdapter(server.url, timeout_s=30)
        results = run_conformance(dataclasses.replace(openai_case, adapter=adapter))
        assert {r.adapter_info["adapter"] for r in results} == {"openai_loop"}  # the agent side's adapter info
        assert all(r.adapter_info["url"] == server.url for r in results)
    finally:
        server.close()


def test_http_adapter_failures_are_replay_errors(openai_case: ConformanceCase) -> None:
    import json

    from reflect_otel.replay_adapters.http import HTTPReplayAdapter

    trace = openai_case.trace
    tampered = trace.model_copy(
        update={"steps": (trace.steps[0].model_copy(update={"reasoning": "changed"}), *trace.steps[1:])}
    )
    answers = {
        "error": (422, json.dumps({"error": "agent exploded"}).encode()),
        "garbage": (200, b"<html>"),
        "prefix": (200, json.dumps({"trace": tampered.model_dump(mode="json"), "prefix_verified": True}).encode()),
        "neither": (200, b"{}"),
    }
    expected = {
        "error": "answered 422: agent exploded",
        "garbage": "not JSON",
        "prefix": "did not keep steps 1..1",
        "neither": "neither 'trace' nor 'otlp'",
    }
    for name, answer in answers.items():
        server = _Server(lambda body, answer=answer: answer)
        try:
            with pytest.raises(ReplayError, match=expected[name]):
                HTTPReplayAdapter(server.url, timeout_s=10).replay(ReplayRequest.intervention(trace, 1, "x"))
        finally:
            server.close()
    with pytest.raises(ReplayError, match="unreachable"):
        HTTPReplayAdapter("http://127.0.0.1:9/replay", timeout_s=2).replay(ReplayRequest.intervention(trace, 1, "x"))


def test_http_adapter_refuses_a_response_over_its_limit_without_reading_it_whole(
    openai_case: ConformanceCase,
) -> None:
    """An endless body (no length declared) is cut at the limit; a declared length over it is refused unread."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from reflect_otel.replay_adapters.http import HTTPReplayAdapter

    written: list[int] = []
    done = threading.Event()

    class Flood(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            if self.path == "/declared":
                self.send_header("Content-Length", str(10**9))
            self.end_headers()
            sent, chunk = 0, b"x" * 65536
            try:
                while sent < 256 * 1024 * 1024:  # 256 MiB, if nobody stops reading
                    self.wfile.write(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # the client hung up: what it wanted to prove
            finally:
                written.append(sent)
                done.set()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Flood)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for path in ("/endless", "/declared"):
            done.clear()
            adapter = HTTPReplayAdapter(base + path, timeout_s=30, max_response_bytes=1024 * 1024)
            with pytest.raises(ReplayError, match="more than 1048576 bytes; refused"):
                adapter.replay(ReplayRequest.intervention(openai_case.trace, 1, "x"))
            assert done.wait(30)
            assert written[-1] < 64 * 1024 * 1024, written  # socket buffers hold some; far from the 256 MiB
    finally:
        server.shutdown()
        server.server_close()


def test_http_adapter_assembles_an_otlp_continuation(openai_case: ConformanceCase) -> None:
    import json

    from reflect_otel.replay_adapters.http import HTTPReplayAdapter

    def span(span_id: str, parent: str | None, kind: str, start: int, **attrs: str) -> dict[str, Any]:
        attributes = [{"key": "openinference.span.kind", "value": {"stringValue": kind}}]
        attributes += [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]
        out: dict[str, Any] = {
            "traceId": "ab" * 16,
            "spanId": span_id,
            "name": kind,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 5),
            "attributes": attributes,
        }
        if parent:
            out["parentSpanId"] = parent
        return out

    calls = "llm.output_messages.0.message.tool_calls.0.tool_call."
    spans = [
        span("1" * 16, None, "CHAIN", 1),
        span(
            "2" * 16,
            "1" * 16,
            "LLM",
            2,
            **{
                "llm.output_messages.0.message.content": "look up Paris",
                calls + "id": "c1",
                calls + "function.name": "lookup_population",
                calls + "function.arguments": '{"city": "Paris"}',
            },
        ),
        span(
            "3" * 16,
            "1" * 16,
            "TOOL",
            3,
            **{"tool.name": "lookup_population", "tool_call.id": "c1", "output.value": "Paris: 2100000"},
        ),
        span("4" * 16, "1" * 16, "LLM", 4, **{"llm.output_messages.0.message.content": replay_agents.CORRECT}),
    ]
    answer = {"otlp": {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}, "prefix_verified": True}
    server = _Server(lambda body: (200, json.dumps(answer).encode()))
    try:
        result = HTTPReplayAdapter(server.url).replay(
            ReplayRequest.intervention(openai_case.trace, 1, replay_agents.FIX)
        )
    finally:
        server.close()
    assert result.trace.steps[:1] == openai_case.trace.steps[:1]
    assert [(s.index, s.tool_name, s.tool_result) for s in result.continuation] == [
        (2, "lookup_population", "Paris: 2100000"),
        (3, None, None),
    ]
    assert result.final_answer == replay_agents.CORRECT and result.prefix_verified


def _cot_case(llm: Any) -> ConformanceCase:
    from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter
    from reflect_otel.testing import make_trace

    trace = make_trace(
        "What is 2 + 3 * 4?",
        [
            {"reasoning": "First add 2 and 3 to get 5."},
            {"reasoning": "Then 5 * 4 = 20."},
            {"reasoning": "So the answer is 20", "is_final_answer": True},
        ],
    )
    return ConformanceCase(
        ReasoningReplayAdapter(llm),
        trace,
        "CORRECTION: multiply before adding: 3 * 4 = 12, then 2 + 12 = 14.",
        lambda answer: answer is not None and answer.strip().endswith("14"),
        lambda: [r.text for r in llm.requests] if hasattr(llm, "requests") else [],
        action=StepAction(text="Multiply before adding: 3 * 4 = 12."),
    )


def test_reasoning_adapter_conformance_with_scripted_model() -> None:
    from reflect_otel.testing import ScriptedLLM, ScriptedRequest

    def respond(request: ScriptedRequest) -> dict[str, Any]:
        fixed = "multiply before adding" in request.text.lower()
        return {
            "steps": ["3 * 4 = 12.", "2 + 12 = 14."] if fixed else ["2 + 3 = 5.", "5 * 4 = 20."],
            "answer": "14" if fixed else "20",
        }

    case = _cot_case(ScriptedLLM(respond=respond))
    results = run_conformance(case)
    assert [r.continuation[-1].reasoning for r in results] == ["So the answer is 14"] * 6  # 3 guidance, 3 actions
    assert [r.continuation[0].reasoning for r in results[3:]] == ["Multiply before adding: 3 * 4 = 12."] * 3
    kept = case.model_requests()[-1]
    assert "First add 2 and 3 to get 5.\nThen 5 * 4 = 20." in kept  # the prefix went to the model verbatim


def test_a_reasoning_replay_says_its_answer_once() -> None:
    from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter
    from reflect_otel.testing import ScriptedLLM, make_trace

    llm = ScriptedLLM(respond=lambda _r: {"steps": ["3 * 4 = 12."], "answer": "So the answer is 14"})
    trace = make_trace("What is 2 + 3 * 4?", [{"reasoning": "2 + 3 = 5."}, {"reasoning": "So the answer is 20"}])
    result = ReasoningReplayAdapter(llm).replay(ReplayRequest.intervention(trace, 1))
    assert result.final_answer == "So the answer is 14"


@pytest.mark.local_llm
def test_reasoning_adapter_with_the_local_backend(default_llm: StructuredLLM) -> None:
    from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter

    case = _cot_case(default_llm)
    adapter = case.adapter
    assert isinstance(adapter, ReasoningReplayAdapter)
    # the arithmetic may come out wrong on a 1.5B model: check the contract, not the answer
    for point in (0, 1, 2):
        result = adapter.replay(ReplayRequest.intervention(case.trace, point, case.fix))
        assert result.trace.steps[:point] == case.trace.steps[:point]
        assert result.prefix_verified and len(result.continuation) >= 1
        assert result.continuation[-1].is_final_answer and result.final_answer


def test_langgraph_durability_exit_falls_back_to_spans(instrumented: Instrumented) -> None:
    """With durability="exit" only the final checkpoint is written: nothing to fork, so the adapter seeds the new
    thread from the recorded spans."""
    from langchain_core.messages import HumanMessage

    requests: list[str] = []
    graph = replay_agents.build_graph(requests)

    def run() -> str:
        state = graph.invoke(
            {"messages": [HumanMessage(replay_agents.QUESTION)]},
            {"configurable": {"thread_id": "exit-thread"}},
            durability="exit",
        )
        return str(state["messages"][-1].content)

    trace = _record(instrumented, run)
    adapter = LangGraphReplayAdapter(graph, tracer_provider=instrumented.provider)
    results = run_conformance(
        ConformanceCase(adapter, trace, replay_agents.FIX, _is_correct, lambda: requests), points=[1, 3]
    )
    assert {r.adapter_info["forked_from"] for r in results} == {"spans"}


def test_langgraph_replay_that_hits_the_recursion_limit_is_an_unfinished_run(langgraph_case: ConformanceCase) -> None:
    graph = langgraph_case.adapter.graph  # type: ignore[attr-defined]
    from reflect_otel.replay_adapters.langgraph import LangGraphReplayAdapter

    adapter = LangGraphReplayAdapter(graph, tracer_provider=langgraph_case.adapter._provider, recursion_limit=2)  # type: ignore[attr-defined]
    result = adapter.replay(ReplayRequest.intervention(langgraph_case.trace, 1, replay_agents.FIX))
    assert result.final_answer is None and result.adapter_info["stopped"] == "recursion limit"
    assert result.trace.steps[:1] == langgraph_case.trace.steps[:1] and len(result.continuation) >= 1


def test_http_protocol_v1_is_still_served_and_only_v2_takes_an_action(openai_case: ConformanceCase) -> None:
    import json

    from reflect_otel.replay_adapters.http import PROTOCOL, PROTOCOL_V2, replay_handler

    v1 = {
        "protocol": PROTOCOL,
        "trace": openai_case.trace.model_dump(mode="json"),
        "rollback_point": 1,
        "injection": replay_agents.FIX,
    }
    status, body = replay_handler(openai_case.adapter, json.dumps(v1).encode())
    assert status == 200 and json.loads(body)["final_answer"] == replay_agents.CORRECT
    action = replay_agents.ACTION.model_dump(mode="json")
    status, body = replay_handler(openai_case.adapter, json.dumps({**v1, "action": action}).encode())
    assert status == 400 and f"an action needs {PROTOCOL_V2}" in json.loads(body)["error"]
    v2 = {**v1, "protocol": PROTOCOL_V2, "injection": "", "action": action}
    status, body = replay_handler(openai_case.adapter, json.dumps(v2).encode())
    answer = json.loads(body)
    assert status == 200 and answer["final_answer"] == replay_agents.CORRECT
    assert answer["trace"]["steps"][1]["tool_args"] == {"city": "Paris"}  # the action, executed as step 2


def test_an_action_needs_the_loops_tool_executor(instrumented: Instrumented, openai_case: ConformanceCase) -> None:
    client = replay_agents.openai_client()
    tracer = instrumented.provider.get_tracer("tests.replay_loop")
    without = OpenAIToolLoopReplayAdapter(
        lambda messages, guard: replay_agents.tool_loop(client, tracer, messages, guard),
        tracer_provider=instrumented.provider,
    )
    with pytest.raises(ReplayError, match="pass execute_tool="):
        without.replay(ReplayRequest.intervention(openai_case.trace, 0, action=replay_agents.ACTION))
    guarded = OpenAIToolLoopReplayAdapter(
        lambda messages, guard: replay_agents.tool_loop(client, tracer, messages, guard),
        tracer_provider=instrumented.provider,
        execute_tool=replay_agents.execute_tool,
        irreversible_tools={"lookup_population"},
    )
    with pytest.raises(IrreversibleToolError):  # an action is refused like any continuation's call
        guarded.replay(ReplayRequest.intervention(openai_case.trace, 0, action=replay_agents.ACTION))


def test_proposals_and_resamples_of_a_chain_of_thought_over_http_protocol_v3() -> None:
    """The agent's side serves what its adapter can (a chain of thought proposes its next thought and resamples its
    run, sampled); the collector's side asks only when the endpoint says it may, and reads the answers bounded."""
    from reflect_otel.replay import ProposesSteps, SamplesRuns, proposer, resampler
    from reflect_otel.replay_adapters.http import HTTPReplayAdapter, replay_handler
    from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter
    from reflect_otel.testing import ScriptedLLM, ScriptedRequest, make_trace

    def respond(request: ScriptedRequest) -> dict[str, Any]:
        sampled = bool(request.temperature)
        return {"steps": ["3 * 4 = 12." if sampled else "2 + 3 = 5."], "answer": "14" if sampled else "20"}

    llm = ScriptedLLM(respond=respond)
    agent = ReasoningReplayAdapter(llm)
    trace = make_trace("What is 2 + 3 * 4?", [{"reasoning": "2 + 3 = 5."}, {"reasoning": "So the answer is 20"}])
    server = _Server(lambda body: replay_handler(agent, body))
    try:
        plain = HTTPReplayAdapter(server.url, timeout_s=30)
        assert proposer(plain) is None and resampler(plain) is None  # the endpoint did not say it serves them
        full = HTTPReplayAdapter(server.url, timeout_s=30, proposes=True, resamples=True, deterministic=True)
        assert isinstance(proposer(full), ProposesSteps) and isinstance(resampler(full), SamplesRuns)
        (proposal,) = full.propose(
            ReplayRequest(trace=trace, rollback_point=1, injection="multiply first", temperature=0.7), samples=1
        )
        assert proposal.action.text == "3 * 4 = 12." and not proposal.is_final_answer
        runs = full.resample(ReplayRequest.resampling(trace, 0.7), samples=2)
        assert [r.final_answer for r in runs] == ["So the answer is 14"] * 2
        assert all(r.rollback_point == 0 and r.trace.trace_id != trace.trace_id for r in runs)
        assert len({r.trace.trace_id for r in runs}) == 2  # two runs, not one twice
        assert [r.temperature for r in llm.requests] == [0.7, 0.7, 0.7]
    finally:
        server.close()


def test_an_agents_own_correction_rules_run_at_its_http_endpoint(caplog: pytest.LogCaptureFixture) -> None:
    """The agent's side serves the corrections of the rules its adapter carries (the table rule, given the table as
    context); the collector's side asks only when the endpoint says ``corrections = true``, and an answer that is not
    a rule's correction of one of the run's calls is logged naming the endpoint and skipped, nothing raised."""
    from reflect_otel.attribution import corrections
    from reflect_otel.demo import table_rules
    from reflect_otel.record import Correction, InterventionKind
    from reflect_otel.replay import agent_rules
    from reflect_otel.replay_adapters.http import MAX_CORRECTIONS, HTTPReplayAdapter, replay_handler
    from reflect_otel.testing import ScriptedReplayAdapter
    from tests.test_corrections import AWARDS, award_trace

    trace = award_trace("Award", "nominated")  # 'Nominated' is a value of Result, in the table the agent was given

    def found_with(respond: Any, *, corrects: bool = True) -> list[Correction]:
        server = _Server(respond)
        try:
            adapter = HTTPReplayAdapter(server.url, timeout_s=30, corrects=corrects)
            return corrections.evidence_corrections(trace, context=AWARDS, agent_rules=agent_rules(adapter))
        finally:
            server.close()

    agent = ScriptedReplayAdapter(lambda trace, point, injection: [], correction_rules=table_rules.RULES)
    assert found_with(lambda body: replay_handler(agent, body), corrects=False) == []  # not asked: no rule
    (found,) = found_with(lambda body: replay_handler(agent, body))
    assert (found.source, found.step_index, found.kind) == ("evidence:other_field", 1, InterventionKind.ACTION)
    assert found.replacement == StepAction(
        tool_name="filter_rows", arguments={"table": "t0", "column": "Result", "op": "=", "value": "Nominated"}
    )
    call = found.model_dump(mode="json")
    answers = {
        "brings no correction rules": lambda body: replay_handler(ScriptedReplayAdapter(lambda *a: []), body),
        "not an evidence rule's correction": lambda body: (
            200,
            json.dumps({"corrections": [{**call, "step_index": 2}]}).encode(),  # the final answer, not a call
        ),
        "source 'llm'": lambda body: (200, json.dumps({"corrections": [{**call, "source": "llm"}]}).encode()),
        f"at most {MAX_CORRECTIONS}": lambda body: (
            200,
            json.dumps({"corrections": [call] * (MAX_CORRECTIONS + 1)}).encode(),
        ),
    }
    for said, respond in answers.items():
        caplog.clear()
        assert found_with(respond) == []
        assert "rules served at http://127.0.0.1:" in caplog.text and said in caplog.text, caplog.text
    # what the endpoint says was tried or refused is not taken: the collector tries each correction itself
    tried = {**call, "flipped": True, "replays": 3, "refused": "x", "original": None}
    (clean,) = found_with(lambda body: (200, json.dumps({"corrections": [tried]}).encode()))
    assert (clean.flipped, clean.replays, clean.refused, clean.original) == (False, 0, None, found.original)


def test_a_pure_tools_call_is_previewed_without_running_the_agent(
    instrumented: Instrumented, langgraph_case: ConformanceCase, openai_case: ConformanceCase
) -> None:
    """An adapter whose agent declares its tools pure runs a replacement's call alone at the prefix (no model call),
    so a replacement whose result is the original step's is refused before a replay is spent on it."""
    lyon = StepAction(tool_name="lookup_population", arguments={"city": "Lyon"})
    # the tool loop runs the call through its executor; an undeclared tool is not previewed
    loop = openai_case.adapter
    assert loop.preview(openai_case.trace, rollback_point=0, action=lyon) is None
    loop.pure_tools = frozenset({"lookup_population", "add"})
    asked = len(openai_case.model_requests())
    assert loop.preview(openai_case.trace, rollback_point=0, action=lyon) == "Lyon: 516000"
    assert loop.preview(openai_case.trace, rollback_point=0, action=replay_agents.ACTION) == "Paris: 2100000"
    assert len(openai_case.model_requests()) == asked  # no model request
    # the LangGraph adapter runs it from the graph's own tools node, after restore_state brings the prefix back
    restored: list[int] = []
    graph = LangGraphReplayAdapter(
        langgraph_case.adapter.graph,
        tracer_provider=instrumented.provider,
        pure_tools=("lookup_population", "add"),
        restore_state=lambda trace, point: restored.append(point),
    )
    assert graph.preview(langgraph_case.trace, rollback_point=1, action=replay_agents.ACTION) == "Paris: 2100000"
    assert restored == [1]
    undeclared = LangGraphReplayAdapter(langgraph_case.adapter.graph, tracer_provider=instrumented.provider)
    assert undeclared.preview(langgraph_case.trace, rollback_point=1, action=replay_agents.ACTION) is None
