"""The text-to-SQL demo agent: a plain OpenAI tool loop (the ``openai`` client, no framework) that answers a question
about one WikiTableQuestions table by writing DuckDB SQL.

Two tools: ``schema()`` (the table's columns, their types and a few rows, as JSON) and ``query(sql)`` (the rows as
JSON, or DuckDB's own error text, e.g. ``Binder Error: Referenced column "x" not found in FROM clause! Candidate
bindings: ...``). The run ends with the model's first turn without a tool call: its text is the answer. The model is
asked at temperature 0; a replay from a kept prefix redoes the run exactly only where the endpoint decodes greedily
one request at a time (the embedded local model), so only there is its adapter ``deterministic`` by default (see
``--deterministic-agent``): a remote API at temperature 0 may still answer differently.

The loop traces itself as a hand-written loop does: an AGENT span around the run, the OpenAI client's LLM spans
(OpenInference's OpenAI instrumentation, installed by the caller on the same provider), and a TOOL span per tool
call. :meth:`SQLAgent.resume` continues the loop from any message list and :meth:`SQLAgent.execute_tool` runs one
call: what ``OpenAIToolLoopReplayAdapter`` needs to replay it (the app wires the adapter; see ``reflect-otel demo
--agent sql``). Runs on any OpenAI-compatible endpoint with native tool calling, the embedded local model included.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

import duckdb
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from reflect_otel.demo.wtq import WTQQuestion, read_table
from reflect_otel.errors import ConfigError
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.recording import record_agent_response
from reflect_otel.reading.semconv import OpenInferenceSpanKindValues, SpanAttributes, ToolCallAttributes

__all__ = [
    "COUNT_CAP",
    "MAX_RESULT_CHARS",
    "MAX_ROWS",
    "QUERY_TIMEOUT_S",
    "TABLE",
    "TOOLS",
    "SQLAgent",
    "SQLWorkspace",
    "chat_client",
]

TABLE = "data"
"""The name of the question's table in the agent's database."""
MAX_ROWS = 20
"""Rows a query result shows; the count says how many there were."""
COUNT_CAP = 10_000
"""Rows of a result counted at most (the count then says it stopped there): counting reads the rows."""
MAX_RESULT_CHARS = 8_000
"""Characters of JSON a query result may take: rows are shown while they fit."""
QUERY_TIMEOUT_S = 10.0
"""Seconds one statement may run (counting its rows included) before it is interrupted."""
SAMPLE_ROWS = 3
CELL_CHARS = 100
_FETCH = 1_000
_ENVELOPE_CHARS = 300  # the count and the note around the rows

_SANDBOX: dict[str, str | int] = {
    # the statements come from a model, and in a replay from trace content (an auditor's corrected call): no file,
    # no URL, no extension installed or loaded, and no statement can turn that back on
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,
    "threads": 1,
    "memory_limit": "256MB",
}

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "schema",
            "description": f"The columns of the table {TABLE}, their types, its row count and its first rows.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "query",
            "description": f"Run one DuckDB SELECT statement on the table {TABLE}; returns the rows as JSON or the "
            "database's error. Quote column names with double quotes.",
            "parameters": {
                "type": "object",
                "properties": {"sql": {"type": "string", "description": "one SELECT statement"}},
                "required": ["sql"],
            },
        },
    },
]

SYSTEM = f"""You answer a question about a table by querying it with SQL (DuckDB).
The table is named {TABLE}. You first get its schema (its columns, their types and some rows). Then call query(sql)
with one SELECT statement at a time; use the column names of the schema, in double quotes ("Column Name"), and
values as the rows write them. Read each result before the next call; if a query fails, fix it from the error.
When you know the answer, reply with the answer alone, as short as possible (a value, a name, or several separated
by commas), and no tool call."""

_INTEGER = re.compile(r"^-?\d{1,3}(,\d{3})+$|^-?\d+$")
_DECIMAL = re.compile(r"^-?(\d{1,3}(,\d{3})+|\d+)\.\d+$")


def _column_type(cells: list[str]) -> str:
    """BIGINT or DOUBLE when every non-empty cell reads as one (thousands separators allowed), else VARCHAR: what a
    loader that sniffs types would make of the column."""
    filled = [c.strip() for c in cells if c.strip()]
    if not filled:
        return "VARCHAR"
    if all(_INTEGER.match(c) for c in filled):
        return "BIGINT"
    if all(_INTEGER.match(c) or _DECIMAL.match(c) for c in filled):
        return "DOUBLE"
    return "VARCHAR"


def _typed(cell: str, kind: str) -> Any:
    text = cell.strip()
    if not text:
        return None
    if kind == "BIGINT":
        return int(text.replace(",", ""))
    if kind == "DOUBLE":
        return float(text.replace(",", ""))
    return cell


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _cell(value: Any) -> Any:
    if isinstance(value, str) and len(value) > CELL_CHARS:
        return value[: CELL_CHARS - 3] + "..."
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


class SQLWorkspace:
    """One question's table in an in-memory DuckDB database, read-only to the agent (a statement that is not a
    SELECT is refused), so replaying a prefix never finds the data changed. The database reads nothing outside itself
    (no file, URL or extension; DuckDB's own ``Permission Error`` answers a statement that tries, and the settings are
    locked), a statement runs at most ``timeout_s`` seconds, and a result is bounded (:data:`COUNT_CAP`,
    :data:`MAX_ROWS`, :data:`MAX_RESULT_CHARS`). Thread-safe (one lock)."""

    def __init__(self, question: WTQQuestion, *, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        header, rows = read_table(question.table)
        names: list[str] = []
        for position, raw in enumerate(header):
            name = re.sub(r"\s+", " ", raw).strip() or f"column_{position + 1}"
            while name in names:
                name += "_2"
            names.append(name)
        kinds = [_column_type([row[i] for row in rows]) for i in range(len(names))]
        self.columns = dict(zip(names, kinds, strict=True))
        self.timeout_s = timeout_s
        self._db = duckdb.connect(":memory:", config=dict(_SANDBOX))
        self._lock = threading.Lock()
        self._db.execute(f"CREATE TABLE {TABLE} ({', '.join(f'{_quote(n)} {k}' for n, k in self.columns.items())})")
        if rows:
            typed = [[_typed(c, k) for c, k in zip(row, kinds, strict=True)] for row in rows]
            self._db.executemany(f"INSERT INTO {TABLE} VALUES ({', '.join('?' for _ in names)})", typed)
        self.row_count = len(rows)

    def schema(self) -> str:
        """The table's columns (name and type), row count and first rows, as JSON."""
        with self._lock:
            sample = self._rows(f"SELECT * FROM {TABLE} LIMIT {SAMPLE_ROWS}")
        return json.dumps(
            {
                "table": TABLE,
                "row_count": self.row_count,
                "columns": [{"name": n, "type": k} for n, k in self.columns.items()],
                "sample_rows": sample,
            },
            ensure_ascii=False,
        )

    def query(self, sql: str) -> str:
        """The rows of one SELECT statement as JSON (``row_count``, counted up to :data:`COUNT_CAP`, and the first
        ``rows``, at most :data:`MAX_ROWS` and :data:`MAX_RESULT_CHARS` characters; a ``note`` says what was cut), or
        the database's error text as DuckDB writes it."""
        with self._lock:
            try:
                statements = self._db.extract_statements(sql)
                if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                    return "Error: only one SELECT statement is allowed"
                names, shown, total = self._interruptible(sql)
            except duckdb.InterruptException:
                return (
                    f"Error: the query ran longer than {self.timeout_s:g} s and was stopped; write a simpler one "
                    "(filter or aggregate in SQL, avoid joining the table with itself)"
                )
            except duckdb.Error as error:
                return str(error)
        return _result(names, shown, total)

    def _interruptible(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]], int]:
        """Run ``sql`` (the lock held) under the time limit: its column names, its first :data:`MAX_ROWS` rows, and
        how many it has, counted to :data:`COUNT_CAP` in batches (never all rows at once)."""
        timer = threading.Timer(self.timeout_s, self._db.interrupt)
        timer.daemon = True
        timer.start()
        try:
            cursor = self._db.execute(sql)
            names = [d[0] for d in cursor.description or ()]
            shown = cursor.fetchmany(MAX_ROWS)
            total = len(shown)
            while len(shown) == MAX_ROWS and total < COUNT_CAP:
                batch = cursor.fetchmany(min(_FETCH, COUNT_CAP - total))
                if not batch:
                    break
                total += len(batch)
        finally:
            timer.cancel()
            timer.join()  # an interrupt that fired at the very end lands before the next statement starts
        return names, shown, total

    def _rows(self, sql: str) -> list[dict[str, Any]]:
        cursor = self._db.execute(sql)
        names = [d[0] for d in cursor.description or ()]
        return [{n: _cell(v) for n, v in zip(names, row, strict=True)} for row in cursor.fetchall()]


def _result(names: list[str], fetched: list[tuple[Any, ...]], total: int) -> str:
    """The query tool's JSON: the count and the rows that fit in :data:`MAX_RESULT_CHARS`, and a note saying what
    was left out."""
    notes = [f"counting stopped at {COUNT_CAP} rows: there may be more"] if total >= COUNT_CAP else []
    rows: list[dict[str, Any]] = []
    used = _ENVELOPE_CHARS
    for row in fetched:
        shown = {n: _cell(v) for n, v in zip(names, row, strict=True)}
        used += len(json.dumps(shown, ensure_ascii=False, default=str)) + 2
        if used > MAX_RESULT_CHARS:
            notes.append(
                f"{len(rows)} rows shown: a result is limited to {MAX_RESULT_CHARS} characters (select fewer columns)"
            )
            break
        rows.append(shown)
    result: dict[str, Any] = {"row_count": total, "rows": rows}
    if notes:
        result["note"] = "; ".join(notes)
    return json.dumps(result, ensure_ascii=False, default=str)


Guard = Callable[[str, Any], None]


class SQLAgent:
    """One question, its table and the tool loop, on ``client`` (an ``openai.OpenAI``) with ``model``.
    ``tracer_provider`` is the provider the OpenAI instrumentation writes to (the tools' spans go there too); at
    most ``max_steps`` tool calls, then the model must answer (tools withheld)."""

    def __init__(
        self,
        question: WTQQuestion,
        client: Any,
        *,
        model: str,
        tracer_provider: TracerProvider,
        max_steps: int = 6,
    ) -> None:
        self.question = question
        self.client = client
        self.model = model
        self.max_steps = max_steps
        self.workspace = SQLWorkspace(question)
        self._tracer: Tracer = tracer_provider.get_tracer("reflect_otel.demo.sql_agent")
        self.table_context = f"The agent's database has one table, {TABLE}; its schema() is:\n{self.workspace.schema()}"
        """What the agent's table holds, for the auditor (``observe(context=...)``)."""

    # -- the loop ----------------------------------------------------------------------------------------------
    def answer(self) -> str:
        """Run the agent on its question under an AGENT span; its answer ("" when it gave none). Raises when the
        model endpoint fails."""
        with self._tracer.start_as_current_span(
            "sql_agent",
            attributes={
                SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.AGENT.value,
                SpanAttributes.INPUT_VALUE: self.question.question,
            },
        ) as root:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": self.question.question},
            ]
            answer = self.resume(messages, lambda _name, _arguments: None)
            root.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
            return answer

    def resume(self, messages: list[dict[str, Any]], guard: Guard, temperature: float = 0.0) -> str:
        """Continue the loop from ``messages`` (a replay's ``resume``): ask the model, run the tool it calls
        (``guard(name, arguments)`` first), repeat until it answers without a tool call. Greedy unless
        ``temperature`` says otherwise (a resample of the run, for the consistency check)."""
        calls = sum(len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant")
        while True:
            final = calls >= self.max_steps
            reply = self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                tools=TOOLS,
                tool_choice=_choice(calls, final),
                temperature=temperature,
            )
            message = reply.choices[0].message
            tool_calls = list(message.tool_calls or []) if not final else []
            turn: dict[str, Any] = {"role": "assistant", "content": message.content}
            if tool_calls:
                turn["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in tool_calls
                ]
            messages.append(turn)
            if not tool_calls:
                return (message.content or "").strip()
            for call in tool_calls:
                calls += 1
                arguments = _arguments(call.function.arguments)
                guard(call.function.name, arguments)
                result = self._traced(call.function.name, call.id, arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

    def execute_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call as the loop does (an action replay's executor); a bad call is answered, not raised."""
        if name == "schema":
            return self.workspace.schema()
        if name == "query":
            sql = arguments.get("sql")
            if not isinstance(sql, str) or not sql.strip():
                return 'Error: query needs {"sql": "<one SELECT statement>"}'
            return self.workspace.query(sql)
        return f"Error: no tool {name!r}; the tools are schema and query"

    def _traced(self, name: str, call_id: str, arguments: dict[str, Any]) -> str:
        with self._tracer.start_as_current_span(
            name,
            attributes={
                SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.TOOL.value,
                SpanAttributes.TOOL_NAME: name,
                ToolCallAttributes.TOOL_CALL_ID: call_id,
                SpanAttributes.INPUT_VALUE: json.dumps(arguments, ensure_ascii=False),
            },
        ) as span:
            result = self.execute_tool(name, arguments)
            span.set_attribute(SpanAttributes.OUTPUT_VALUE, result)
        return result


def _choice(calls: int, final: bool) -> str | dict[str, Any]:
    """The first turn gets the schema (as SQL agents start: the model is made to call it); out of steps, the model
    must answer; otherwise it decides."""
    if final:
        return "none"
    return {"type": "function", "function": {"name": "schema"}} if calls == 0 else "auto"


def _arguments(text: str | None) -> dict[str, Any]:
    """A call's arguments; text that is not a JSON object gives none (the tool then says what it needs)."""
    try:
        parsed = json.loads(text or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def chat_client(llm: StructuredLLM) -> tuple[Any, str]:
    """An ``openai.OpenAI`` client on the endpoint ``llm`` calls (the local server included), and the model name:
    the SQL agent runs on the configured model. Raises :class:`ConfigError` for a backend that is not an
    OpenAI-compatible endpoint."""
    import openai

    config = getattr(llm, "config", None)
    base_url = getattr(config, "base_url", None)
    if config is None or not llm.model_name:
        raise ConfigError(
            f"the SQL agent needs an OpenAI-compatible endpoint with native tool calling; the {type(llm).__name__} "
            "backend is not one (set REFLECT_LLM_BASE_URL, or leave it unset for the local model)"
        )
    client = openai.OpenAI(
        base_url=base_url,
        api_key=getattr(config, "api_key", None) or "not-needed",
        timeout=getattr(config, "timeout_s", 600.0),
        max_retries=getattr(config, "max_retries", 2),
        # the requests it sends for an attribution (replays, proposals) are counted in its record as the agent's
        http_client=openai.DefaultHttpxClient(event_hooks={"response": [record_agent_response]}),
    )
    return client, llm.model_name
