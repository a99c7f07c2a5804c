"""``reflect-otel demo-agent``: the demo's LangGraph table agent deployed as a remote agent is:
in its own process, instrumented with OpenInference, sending its spans over OTLP/HTTP (to ``reflect-otel collect
--attribute``, or to an OTel Collector in front of it), and serving the HTTP replay protocol
(see reflect_otel/replay_adapters/http.py) so that the collector can re-run it from any step.

It answers each ``--question`` once, under a root AGENT span that carries the question's expected answer as
``reflect.expected_answer`` (how a canary or a test tells the collector what is right; ``--no-expected`` leaves it
out, so the collector must judge the run as a user's, with its ``--verifier``), then serves replays, resamples and
its table rule's corrections until stopped (Ctrl-C, SIGTERM or ``--duration``). The model is ``REFLECT_LLM_*``
(else the local llama.cpp server). Prints ``replay endpoint URL`` once listening, then ``answered ID: ANSWER`` for
each question, flushed.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import TracerProvider

from reflect_otel.attribution.corrections import Rule
from reflect_otel.config import LLMConfig
from reflect_otel.errors import ConfigError, ReplayError
from reflect_otel.llm.factory import make_llm
from reflect_otel.reading.semconv import OpenInferenceSpanKindValues, ReflectAttributes, SpanAttributes
from reflect_otel.record import Correction
from reflect_otel.replay import ReplayAdapter, ReplayRequest, ReplayResult, agent_rules, replay_with, resampler
from reflect_otel.trace import Step, StructuredTrace

if TYPE_CHECKING:
    from reflect_otel.demo.table_agent import TableQAAgent
    from reflect_otel.demo.wtq import WTQQuestion

__all__ = ["add_demo_agent_command"]

MAX_REQUEST_BYTES = 32 << 20


class _ByThread:
    """One replay endpoint for several agents: the request's trace names its LangGraph thread, which names the
    agent (each question ran on a thread of its own). It carries the agents' own correction rules (the table rule)
    and serves them (``corrections = true`` in the collector's ``--replay-config``), given the table that agent was
    given when the collector sends no context: the collector never saw it."""

    def __init__(self, adapters: Mapping[str, ReplayAdapter], contexts: Mapping[str, str]) -> None:
        self.adapters = adapters
        self.contexts = contexts
        self.correction_rules: tuple[Rule, ...] = (self._agent_rules,)

    def _agent_rules(self, trace: StructuredTrace, step: Step, context: str) -> list[Correction]:
        own = context or self.contexts.get(trace.replay.thread_id or "", "")
        return [c for rule in agent_rules(self._for(trace)) for c in rule(trace, step, own)]

    def replay(self, request: ReplayRequest) -> ReplayResult:
        return replay_with(self._for(request.trace), request)

    def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
        source = resampler(self._for(request.trace))
        if source is None:
            raise ReplayError("this agent's replay adapter cannot resample runs")
        return source.resample(request, samples=samples)

    def _for(self, trace: StructuredTrace) -> ReplayAdapter:
        adapter = self.adapters.get(trace.replay.thread_id or "")
        if adapter is None:
            raise ReplayError(f"no agent here ran thread {trace.replay.thread_id!r}")
        return adapter


def _server(adapter: ReplayAdapter, port: int) -> ThreadingHTTPServer:
    from reflect_otel.replay_adapters.http import replay_handler

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path.rstrip("/") != "/replay" or not 0 < length <= MAX_REQUEST_BYTES:
                self.send_error(404 if self.path.rstrip("/") != "/replay" else 413)
                return
            status, body = replay_handler(adapter, self.rfile.read(length))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def add_demo_agent_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo-agent",
        help="serve the demo agent as a remote agent: OTLP out, HTTP replay endpoint in",
        description=(__doc__ or "").split("\n\n", 1)[0].replace("``", "'"),
    )
    parser.add_argument(
        "--questions", help="comma-separated bundled question ids, as 'demo --questions' (default: the demo's set)"
    )
    parser.add_argument("--question", action="append", help=argparse.SUPPRESS)  # the older spelling, repeatable
    parser.add_argument(
        "--otlp-endpoint", default="http://127.0.0.1:4318/v1/traces", help="where the spans go (OTLP/HTTP)"
    )
    parser.add_argument("--service", default="table-agent", help="the resource's service.name (default table-agent)")
    parser.add_argument("--replay-port", type=int, default=0, help="replay endpoint port on 127.0.0.1 (0: any free)")
    parser.add_argument("--max-steps", type=int, default=8, help="the agent's step limit")
    parser.add_argument(
        "--no-expected",
        action="store_true",
        help="leave out the expected answer: the collector judges the run with its --verifier, as a user's run",
    )
    parser.add_argument("--duration", type=float, help="stop serving after this many seconds (default: until stopped)")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from reflect_otel.demo.table_agent import TableQAAgent  # langgraph: loaded only when serving

    questions = _wanted_questions(args)
    provider = _provider(args)
    llm = make_llm(LLMConfig.from_env())
    agents = {f"remote-{q.id}": TableQAAgent(q, llm, max_steps=args.max_steps) for q in questions}
    server = _server(_adapter(agents, provider), args.replay_port)
    threading.Thread(target=server.serve_forever, name="replay-endpoint", daemon=True).start()
    print(f"replay endpoint http://127.0.0.1:{server.server_address[1]}/replay", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        _answer_each(agents, provider, with_expected=not args.no_expected)
        stop.wait(args.duration)
    finally:
        server.shutdown()
        provider.shutdown()
    return 0


def _wanted_questions(args: argparse.Namespace) -> list[WTQQuestion]:
    """The bundled questions named by --questions/--question (the demo's by default); an unknown one is refused."""
    from reflect_otel.demo.wtq import DEMO_QUESTIONS, load_questions

    given = [q.strip() for q in (args.questions or "").split(",") if q.strip()] + list(args.question or [])
    wanted = given or list(DEMO_QUESTIONS)
    questions = {q.id: q for q in load_questions()}
    unknown = [q for q in wanted if q not in questions]
    if unknown:
        raise ConfigError(
            f"--questions: no bundled question {', '.join(unknown)}; bundled: {', '.join(sorted(questions))}"
        )
    return [questions[q] for q in wanted]


def _provider(args: argparse.Namespace) -> TracerProvider:
    """The agent's tracer provider, instrumented for LangChain, sending its spans to --otlp-endpoint."""
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": args.service}),
        span_limits=SpanLimits(max_span_attributes=10_000, max_attribute_length=None),
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=args.otlp_endpoint)))
    LangChainInstrumentor().instrument(tracer_provider=provider)
    return provider


def _adapter(agents: Mapping[str, TableQAAgent], provider: TracerProvider) -> _ByThread:
    """One LangGraph replay adapter per run's thread, each with the table agent's own rule and tools."""
    from reflect_otel.cli._demo_runs import table_adapter

    return _ByThread(
        {thread: table_adapter(agent, provider) for thread, agent in agents.items()},
        {thread: agent.table_context for thread, agent in agents.items()},
    )


def _answer_each(agents: Mapping[str, TableQAAgent], provider: TracerProvider, *, with_expected: bool) -> None:
    """Each agent answers its question under an AGENT span (its expected answer on it unless left out)."""
    tracer = provider.get_tracer("reflect_otel.demo.remote_agent")
    for thread, agent in agents.items():
        question = agent.question
        attributes = {
            SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
            SpanAttributes.INPUT_VALUE: question.question,
        }
        if with_expected:
            attributes[ReflectAttributes.EXPECTED_ANSWER] = question.expected
        with tracer.start_as_current_span("table_qa", attributes=attributes) as span:
            answer = agent.answer(thread_id=thread)
            span.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
        provider.force_flush()
        print(f"answered {question.id}: {answer}", flush=True)
