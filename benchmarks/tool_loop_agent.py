"""A user's own OpenAI tool loop on the embedded model, as a new user writes one: the plain ``openai`` client, seven
tools of its own with JSON results (a small bookshop: search, a book, an author, reviews, stock, a currency rate, a
calculator, and ``final_answer``), ``tool_choice="auto"`` at temperature 0, nothing from the demo. It answers
``--runs`` questions, says of each run whether the model called its tools natively (every call returned as
``tool_calls``, none written as text where a call belongs, at least one made) and whether it answered right, then
attributes up to ``--attribute`` of the wrong runs as ``reflect-otel attribute --method reflect`` does (the same
service: method ``reflect``, the oracle verifier, the settings from ``REFLECT_*``, so the default replay budget),
replaying through ``OpenAIToolLoopReplayAdapter`` built as a user builds it: ``resume``, ``execute_tool`` and the
loop's ``client``, nothing said of determinism (on the embedded server it counts as deterministic by itself).

    REFLECT_LOCAL_THREADS=1 nice -n 19 python -m benchmarks.tool_loop_agent --runs 10 --attribute 1

Prints one line per run, then ``tool_loop runs=N native=K right=R``, then one line per attribution
(``attributed=... deterministic=... budget=... replays=N (per arm) tests=T``, T the rollback points tested under
control), and last ``tool_loop_native_share=K/N``. ``--questions 5,7`` runs those questions only. ``--deadline-min`` stops starting new work after that
many minutes (the figures printed so far stand). Needs ``pip install 'reflect-otel[local]'`` (or an endpoint in
``REFLECT_LLM_BASE_URL``), and the OpenInference OpenAI instrumentation (``[openai]``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from benchmarks._common import add_smoke_option, smoke_sizes

BOOKS: dict[str, dict[str, Any]] = {
    "b1": {"title": "The Glass Orchard", "author_id": "a1", "year": 2011, "price_usd": 18.5, "pages": 312},
    "b2": {"title": "Salt and Lanterns", "author_id": "a2", "year": 2016, "price_usd": 24.0, "pages": 448},
    "b3": {"title": "The Quiet Ledger", "author_id": "a1", "year": 2019, "price_usd": 21.0, "pages": 275},
    "b4": {"title": "Northbound Rivers", "author_id": "a3", "year": 2008, "price_usd": 15.25, "pages": 390},
    "b5": {"title": "A Map of Small Hours", "author_id": "a2", "year": 2021, "price_usd": 27.5, "pages": 230},
}
AUTHORS: dict[str, dict[str, Any]] = {
    "a1": {"name": "Ines Varga", "born": 1974, "country": "Hungary"},
    "a2": {"name": "Tomas Okafor", "born": 1981, "country": "Nigeria"},
    "a3": {"name": "Mira Lindqvist", "born": 1965, "country": "Sweden"},
}
REVIEWS: dict[str, list[int]] = {"b1": [5, 4, 4], "b2": [3, 4], "b3": [5, 5, 4, 4], "b4": [2, 3, 3], "b5": [4]}
STOCK: dict[str, dict[str, int]] = {
    "b1": {"Lyon": 3, "Porto": 0},
    "b2": {"Lyon": 0, "Porto": 7},
    "b3": {"Lyon": 2, "Porto": 1},
    "b4": {"Lyon": 0, "Porto": 0},
    "b5": {"Lyon": 4, "Porto": 2},
}
RATES = {("USD", "EUR"): 0.9, ("USD", "GBP"): 0.8, ("EUR", "USD"): 1.1}

QUESTIONS: tuple[tuple[str, str], ...] = (
    ("Who wrote 'The Glass Orchard'?", "Ines Varga"),
    ("In which country was the author of 'Northbound Rivers' born?", "Sweden"),
    ("How many copies of 'Salt and Lanterns' does the Porto shop have?", "7"),
    ("What is the average review score of 'The Quiet Ledger'?", "4.5"),
    ("What does 'A Map of Small Hours' cost in euros?", "24.75"),
    ("In what year was the author of 'Salt and Lanterns' born?", "1981"),
    ("How many pages do 'The Glass Orchard' and 'The Quiet Ledger' have together?", "587"),
    ("Which shop has copies of 'The Glass Orchard' in stock, Lyon or Porto?", "Lyon"),
    ("What does 'Northbound Rivers' cost in pounds?", "12.2"),
    ("How many years after its author was born was 'The Quiet Ledger' published?", "45"),
)

SYSTEM = (
    "You answer questions about a bookshop's catalogue with the tools. Find a book's id with search_books first; "
    "never guess an id. When you know the answer, call final_answer with it."
)


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": kind} for key, kind in properties.items()},
                "required": list(properties),
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool(
        "search_books",
        "Books whose title contains the text: their ids and titles, at most max_results of them.",
        text="string",
        max_results="integer",
    ),
    _tool("get_book", "A book by id: title, author_id, year, price_usd, pages.", book_id="string"),
    _tool("get_author", "An author by id: name, born (year), country.", author_id="string"),
    _tool("get_reviews", "A book's review scores (1 to 5) and their average.", book_id="string"),
    _tool("get_stock", "Copies of a book in each shop.", book_id="string"),
    _tool(
        "convert_currency",
        "An amount converted between USD, EUR and GBP.",
        amount="number",
        from_currency="string",
        to_currency="string",
    ),
    _tool("calculate", "The value of an arithmetic expression (+ - * / and parentheses).", expression="string"),
    _tool("final_answer", "Give the answer to the question; ends the task.", answer="string"),
]
NAMES = [t["function"]["name"] for t in TOOLS]


def execute_tool(name: str, arguments: dict[str, Any]) -> str:
    """Run one tool: its result as JSON (an error as ``{"error": ...}``, as a tool's API answers)."""
    try:
        return json.dumps(_run(name, arguments))
    except Exception as error:  # a tool's error goes back to the model, as any loop sends it
        return json.dumps({"error": f"{type(error).__name__}: {error}"})


def _run(name: str, arguments: dict[str, Any]) -> Any:
    if name == "search_books":
        text = str(arguments.get("text", "")).casefold().strip(" '\"")
        found = [{"id": k, "title": b["title"]} for k, b in BOOKS.items() if text in b["title"].casefold()]
        return {"books": found[: max(1, int(arguments.get("max_results") or 5))]}
    if name == "get_book":
        book = BOOKS.get(str(arguments.get("book_id")))
        return {"id": arguments.get("book_id"), **book} if book else {"error": "no such book id"}
    if name == "get_author":
        author = AUTHORS.get(str(arguments.get("author_id")))
        return {"id": arguments.get("author_id"), **author} if author else {"error": "no such author id"}
    if name == "get_reviews":
        scores = REVIEWS.get(str(arguments.get("book_id")))
        return {"scores": scores, "average": round(sum(scores) / len(scores), 2)} if scores else {"error": "no reviews"}
    if name == "get_stock":
        stock = STOCK.get(str(arguments.get("book_id")))
        return {"copies": stock} if stock is not None else {"error": "no such book id"}
    if name == "convert_currency":
        pair = (str(arguments.get("from_currency")).upper(), str(arguments.get("to_currency")).upper())
        if pair not in RATES:
            return {"error": f"no rate for {pair[0]} to {pair[1]}; rates: USD to EUR or GBP, EUR to USD"}
        return {"amount": round(float(arguments["amount"]) * RATES[pair], 2), "currency": pair[1]}
    if name == "calculate":
        expression = str(arguments.get("expression", ""))
        if not re.fullmatch(r"[\d\s.+\-*/()]+", expression):
            return {"error": "only numbers, + - * / and parentheses"}
        return {"value": round(eval(expression, {"__builtins__": {}}), 4)}
    return {"error": f"no tool {name!r}"}


_WRITTEN_CALL = re.compile(r"<tool|\{\s*\"name\"|\b(" + "|".join(NAMES) + r")\s*[,(:]", re.IGNORECASE)


@dataclass
class Loop:
    """The agent: ``ask`` runs it on a question; ``resume`` continues it from any messages (what the replay adapter
    needs). Counts what its model did: calls returned as ``tool_calls``, and turns whose text reads as a call."""

    client: Any
    model: str
    max_steps: int = 8
    native_calls: int = 0
    written_calls: int = 0
    turns: list[str] = field(default_factory=list)

    def ask(self, question: str) -> str:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        return self.resume(messages, lambda name, arguments: None)

    def resume(
        self, messages: list[dict[str, Any]], guard: Callable[[str, dict[str, Any]], None], temperature: float = 0.0
    ) -> str:
        for _ in range(self.max_steps):
            reply = self.client.chat.completions.create(
                model=self.model, messages=messages, tools=TOOLS, tool_choice="auto", temperature=temperature
            )
            message = reply.choices[0].message
            text = message.content or ""
            if text and _WRITTEN_CALL.search(text):
                self.written_calls += 1
            calls = message.tool_calls or []
            if not calls:
                self.turns.append("text")
                return text
            call = calls[0]
            self.native_calls += 1
            arguments = _arguments(call.function.arguments)
            self.turns.append(call.function.name)
            if call.function.name == "final_answer":
                return str(arguments.get("answer", ""))
            guard(call.function.name, arguments)
            messages.append(
                {
                    "role": "assistant",
                    "content": text or None,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.function.name, "arguments": call.function.arguments},
                        }
                    ],
                }
            )
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": execute_tool(call.function.name, arguments)}
            )
        return ""


def _arguments(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


_ARMS = ("control", "intervention", "sensitivity", "localization")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10, help="questions to run, in order (at most 10)")
    parser.add_argument("--questions", help="comma-separated question numbers (1 to 10) to run instead, in order")
    parser.add_argument("--attribute", type=int, default=1, help="wrong runs to attribute with REFLECT (default 1)")
    parser.add_argument("--deadline-min", type=float, help="start nothing new after this many minutes")
    add_smoke_option(parser)
    args = parser.parse_args(argv)
    smoke_sizes(args, runs=2, attribute=1, questions=None)
    started = time.monotonic()
    with ExitStack() as stack:
        return _measure(args, started, stack)


def _measure(args: argparse.Namespace, started: float, stack: ExitStack) -> int:

    def late() -> bool:
        return args.deadline_min is not None and time.monotonic() - started > args.deadline_min * 60

    from reflect_otel.attribution.methods import method_spec
    from reflect_otel.attribution.service import AttributionService
    from reflect_otel.config import LLMConfig, ReflectConfig
    from reflect_otel.demo.sql_agent import chat_client
    from reflect_otel.flagging.verifiers import OracleVerifier, judged_correct
    from reflect_otel.llm.factory import make_llm
    from reflect_otel.online.setup import instrumented_provider
    from reflect_otel.reading.capture import recorded_run
    from reflect_otel.replay import BudgetedReplay, is_deterministic
    from reflect_otel.replay_adapters.openai_loop import OpenAIToolLoopReplayAdapter

    llm: Any
    if args.smoke:  # the loop on a scripted endpoint, REFLECT's auditor scripted
        import openai

        from reflect_otel.testing.examples import scripted_auditor
        from reflect_otel.testing.openai_server import ScriptedOpenAIServer

        server = stack.enter_context(ScriptedOpenAIServer(_smoke_turn))
        client, model = openai.OpenAI(base_url=server.base_url, api_key="smoke", max_retries=0), "scripted-model"
        llm = scripted_auditor(localize=[2])
    else:
        llm = make_llm(LLMConfig.from_env())
        client, model = chat_client(llm)  # the loop's own client, on the model the auditor uses
    provider = instrumented_provider()
    chosen = (
        [QUESTIONS[int(n) - 1] for n in args.questions.split(",") if n.strip()]
        if args.questions
        else list(QUESTIONS[: args.runs])
    )
    print(f"model {llm.model_name}; {len(chosen)} run(s)", flush=True)
    wrong: list[tuple[Any, str, Loop]] = []
    runs = native = right = 0
    for question, expected in chosen:
        if late():
            print("deadline: no more runs", flush=True)
            break
        loop = Loop(client, model)
        began = time.monotonic()
        with recorded_run(provider, "bookshop_agent") as run:
            answer = loop.ask(question)
        runs += 1
        called = loop.native_calls > 0 and loop.written_calls == 0
        native += called
        correct = judged_correct(answer, expected, question=question)
        right += correct
        print(
            f"run {runs}: {'native' if called else 'NOT native'} ({loop.native_calls} tool_calls, "
            f"{loop.written_calls} written as text; turns {' > '.join(loop.turns)}); answered {answer[:80]!r}, "
            f"expected {expected!r}: {'right' if correct else 'wrong'} ({time.monotonic() - began:.0f} s)",
            flush=True,
        )
        if not correct and run.trace is not None:
            wrong.append((run.trace.model_copy(update={"final_answer": answer or None}), expected, loop))
    print(f"tool_loop runs={runs} native={native} right={right}", flush=True)

    config = ReflectConfig.from_env()  # as 'attribute' reads it: the default replay budget unless REFLECT_* says
    service = AttributionService(llm, method_spec("reflect"), verifier=OracleVerifier(), config=config)
    for trace, expected, _ in wrong[: args.attribute]:
        if late():
            print("deadline: no more attributions", flush=True)
            break
        agent = Loop(client, model)
        adapter = OpenAIToolLoopReplayAdapter(
            agent.resume, tracer_provider=provider, execute_tool=execute_tool, client=client
        )
        began = time.monotonic()
        outcome = service.process(trace, expected=expected, replay=adapter)
        record = outcome.record
        assert record is not None
        tests = len({a.rollback_point for a in record.replays if a.arm.value == "control"})
        arms = ",".join(f"{arm}:{sum(1 for a in record.replays if a.arm.value == arm)}" for arm in _ARMS)
        print(
            f"attributed={record.status.value} step={record.step_index} deterministic="
            f"{is_deterministic(BudgetedReplay(adapter, config.max_replays or 12), trace)} "
            f"budget={config.max_replays} replays={len(record.replays)} ({arms}) tests={tests} "
            f"agent_calls_native={agent.native_calls} written={agent.written_calls} "
            f"seconds={time.monotonic() - began:.0f} reason={record.reason[:300]!r}",
            flush=True,
        )
    service.close()
    print(f"tool_loop_native_share={native / runs if runs else 0:.2f}", flush=True)
    return 0


def _smoke_turn(body: dict[str, Any]) -> Any:
    """A scripted model for ``--smoke``: it searches, reads the book, and answers the author's id (a wrong answer)."""
    from reflect_otel.testing.openai_server import ScriptedToolCall, ScriptedTurn

    results = [json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"]
    call = f"call_{len(results)}"
    if not results:
        return ScriptedTurn("", [ScriptedToolCall("search_books", {"text": "orchard", "max_results": 3}, call)])
    if "books" in results[-1] and results[-1]["books"]:
        return ScriptedTurn("", [ScriptedToolCall("get_book", {"book_id": results[-1]["books"][0]["id"]}, call)])
    answer = str(results[-1].get("author_id") or results[-1].get("name") or "unknown")
    return ScriptedTurn("", [ScriptedToolCall("final_answer", {"answer": answer}, call)])


if __name__ == "__main__":
    sys.exit(main())
