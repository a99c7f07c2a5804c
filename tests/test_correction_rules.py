"""The evidence checks and correction rules on what real tools answer: JSON results and the error messages DuckDB,
PostgreSQL, SQLite and Python libraries write when the bad statement or call is run here (never typed by hand), with
the cases where each rule must stay silent. A SQL correction rewrites one identifier or literal, and the corrected
statement is run again to show it is the fix."""

from __future__ import annotations

import json
import logging
import sqlite3
import traceback
from collections.abc import Callable
from importlib.metadata import EntryPoint
from typing import Any, Literal

import duckdb
import pydantic
import pytest

from reflect_otel import plugins
from reflect_otel.attribution import corrections
from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.config import ReflectConfig
from reflect_otel.flagging.evidence import FindingKind, empty_call, failed_call, find_evidence
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.record import AttributionStatus, Correction
from reflect_otel.testing import ScriptedReplayAdapter, make_trace
from reflect_otel.testing.examples import scripted_auditor
from reflect_otel.trace import Step, StepAction, StructuredTrace

ORDERS = [("Ann", "Shipped", "San Diego", 120), ("Bo", "Pending", "Boston", 80), ("Cy", "Cancelled", "Boston", 45)]
QUESTION = "Which customer's order was shipped?"


def _rows_json(names: list[str], rows: list[tuple[Any, ...]]) -> str:
    """A query tool's answer: the rows as JSON objects with their count (as the SQL demo agent writes them)."""
    return json.dumps({"row_count": len(rows), "rows": [dict(zip(names, row, strict=True)) for row in rows]})


# -- the three databases, each behind a tool that answers rows as JSON or the database's own error ---------------
def duckdb_tool() -> Callable[[str], str]:
    db = duckdb.connect(":memory:")
    db.execute("CREATE TABLE orders (customer VARCHAR, status VARCHAR, city VARCHAR, amount INTEGER)")
    db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", ORDERS)

    def query(sql: str) -> str:
        try:
            cursor = db.execute(sql)
            return _rows_json([d[0] for d in cursor.description or ()], cursor.fetchall())
        except duckdb.Error as error:
            return str(error)

    return query


def sqlite_tool() -> Callable[[str], str]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE orders (customer TEXT, status TEXT, city TEXT, amount INTEGER)")
    db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", ORDERS)

    def query(sql: str) -> str:
        try:
            cursor = db.execute(sql)
            return _rows_json([d[0] for d in cursor.description or ()], cursor.fetchall())
        except sqlite3.Error as error:
            return f"{type(error).__name__}: {error}"  # as tool wrappers write an exception

    return query


@pytest.fixture(scope="module")
def postgres_tool(postgres_server: Any) -> Callable[[str], str]:
    import psycopg

    connection = psycopg.connect(postgres_server.url, autocommit=True)
    connection.execute("DROP TABLE IF EXISTS orders")
    connection.execute("CREATE TABLE orders (customer TEXT, status TEXT, city TEXT, amount INTEGER)")
    with connection.cursor() as cursor:
        cursor.executemany("INSERT INTO orders VALUES (%s, %s, %s, %s)", ORDERS)

    def query(sql: str) -> str:
        try:
            cursor = connection.execute(sql)
            return _rows_json([d.name for d in cursor.description or ()], cursor.fetchall())
        except psycopg.Error as error:
            return str(error)

    return query


def schema_of(query: Callable[[str], str]) -> str:
    """A schema tool's answer: the columns and the first rows, as JSON."""
    rows = json.loads(query("SELECT * FROM orders LIMIT 3"))["rows"]
    return json.dumps({"table": "orders", "columns": [{"name": n} for n in rows[0]], "sample_rows": rows})


def sql_trace(
    query: Callable[[str], str], sql: str, *, schema: bool = True, question: str = QUESTION
) -> StructuredTrace:
    steps: list[dict[str, Any]] = [{"tool": "schema", "args": {}, "result": schema_of(query)}] if schema else []
    steps += [
        {"tool": "query", "args": {"sql": sql}, "result": query(sql)},
        {"reasoning": "?", "is_final_answer": True},
    ]
    return make_trace(question, steps, final_answer="?")


def corrected_sql(trace: StructuredTrace, rule: str) -> list[str]:
    found = [c for c in corrections.evidence_corrections(trace) if c.source == f"evidence:{rule}"]
    return [str(c.replacement.arguments["sql"]) for c in found if c.replacement is not None]


def _database(name: str, request: pytest.FixtureRequest) -> Callable[[str], str]:
    """One of the three databases' query tools (PostgreSQL's from its fixture: skipped without a server)."""
    if name == "postgres":
        tool: Callable[[str], str] = request.getfixturevalue("postgres_tool")
        return tool
    return {"duckdb": duckdb_tool, "sqlite": sqlite_tool}[name]()


DATABASES = ["duckdb", "sqlite", "postgres"]


# -- SQL: a name the error names a candidate for ---------------------------------------------------------------
def test_duckdb_candidate_bindings_rewrite_the_column_it_names() -> None:
    query = duckdb_tool()
    trace = sql_trace(query, "SELECT city FROM orders WHERE custmer = 'Ann'")
    assert failed_call(trace.steps[1])
    assert corrected_sql(trace, "valid_options") == ["SELECT city FROM orders WHERE customer = 'Ann'"]
    assert json.loads(query("SELECT city FROM orders WHERE customer = 'Ann'"))["rows"] == [{"city": "San Diego"}]


def test_duckdb_did_you_mean_rewrites_the_table_it_names() -> None:
    trace = sql_trace(duckdb_tool(), "SELECT city FROM ordrs WHERE customer = 'Ann'", schema=False)
    assert corrected_sql(trace, "valid_options") == ["SELECT city FROM orders WHERE customer = 'Ann'"]


def test_postgres_hint_rewrites_the_column_unqualified(postgres_tool: Callable[[str], str]) -> None:
    trace = sql_trace(postgres_tool, "SELECT city FROM orders WHERE \"custmer\" = 'Ann'", schema=False)
    assert "HINT" in (trace.steps[0].tool_result or "")
    (fixed,) = corrected_sql(trace, "valid_options")
    assert fixed == "SELECT city FROM orders WHERE \"customer\" = 'Ann'"  # the quoting kept, the rest as written
    assert json.loads(postgres_tool(fixed))["rows"] == [{"city": "San Diego"}]


def test_sqlite_names_no_candidate_so_the_schema_shown_gives_it() -> None:
    query = sqlite_tool()
    with_schema = sql_trace(query, "SELECT city FROM orders WHERE custmer = 'Ann'")
    assert (with_schema.steps[1].tool_result or "").startswith("OperationalError: no such column: custmer")
    assert corrected_sql(with_schema, "valid_options") == ["SELECT city FROM orders WHERE customer = 'Ann'"]
    without = sql_trace(query, "SELECT city FROM orders WHERE custmer = 'Ann'", schema=False)
    assert corrected_sql(without, "valid_options") == []  # nothing offered and nothing shown: silent


@pytest.mark.parametrize(
    ("sql", "fixed"),
    [
        ("SELECT custmer FROM orders", "SELECT customer FROM orders"),  # Candidate bindings
        ("SELECT * FROM ordrs", "SELECT * FROM orders"),  # Did you mean
        ('SELECT "custmer" FROM orders', 'SELECT "customer" FROM orders'),  # the quoting kept
        # the identifier rewritten, not the literal that happens to be written the same
        ("SELECT city FROM orders WHERE custmer = 'custmer'", "SELECT city FROM orders WHERE customer = 'custmer'"),
        # two names wrong: DuckDB names the table first, and one fix changes one name
        ("SELECT custmer FROM ordrs", "SELECT custmer FROM orders"),
    ],
)
def test_duckdb_short_statements_have_the_name_the_error_names_rewritten(sql: str, fixed: str) -> None:
    """The commonest text-to-SQL failures are short: "SELECT custmer FROM orders" has no operator or quote, and is
    still a statement whose one wrong name is rewritten, never replaced whole."""
    query = duckdb_tool()
    trace = sql_trace(query, sql, schema=False)
    assert failed_call(trace.steps[0])
    assert corrected_sql(trace, "valid_options") == [fixed]
    assert fixed == "SELECT custmer FROM orders" or "rows" in json.loads(query(fixed))  # the fix runs


# a join of orders with a derived table whose column is called custmer: o.custmer is wrong, p.custmer is right
_JOINED = "JOIN (SELECT city, customer AS custmer FROM orders) AS p USING (city)"


@pytest.mark.parametrize(
    ("sql", "fixed"),
    [
        # the column and the alias it defines are spelt alike: the column is rewritten, the alias kept
        ("SELECT o.custmer AS custmer FROM orders o", "SELECT o.customer AS custmer FROM orders o"),
        # the same name of two tables: the one the error marks is rewritten (not the first), the other is right
        (
            f"SELECT p.custmer, o.custmer FROM orders o {_JOINED}",
            f"SELECT p.custmer, o.customer FROM orders o {_JOINED}",
        ),
        # one column named twice is one reference: rewriting one occurrence would leave a statement that fails
        (
            "SELECT custmer, count(*) AS n FROM orders GROUP BY custmer",
            "SELECT customer, count(*) AS n FROM orders GROUP BY customer",
        ),
    ],
)
def test_a_name_spelt_twice_with_two_meanings_has_only_the_wrong_one_rewritten(sql: str, fixed: str) -> None:
    query = duckdb_tool()
    trace = sql_trace(query, sql, schema=False)
    assert failed_call(trace.steps[0])
    assert corrected_sql(trace, "valid_options") == [fixed]
    assert "rows" in json.loads(query(fixed))  # the fix runs


_LONG = (
    "SELECT customer, status, city, amount, customer AS a, status AS b, city AS c, amount AS d, customer AS e "
    "FROM orders o WHERE o.status = 'Shipped' AND o.custmer = 'Ann' ORDER BY city, status, amount"
)


@pytest.mark.parametrize(
    ("sql", "fixed"),
    [
        (
            f"SELECT p.custmer, o.custmer FROM orders o {_JOINED}",
            f"SELECT p.custmer, o.customer FROM orders o {_JOINED}",
        ),
        (_LONG, _LONG.replace("o.custmer", "o.customer")),  # the line echoed cut short, '...' before and after
        (
            "SELECT customer\nFROM orders o\nWHERE o.custmer = 'Ann'",
            "SELECT customer\nFROM orders o\nWHERE o.customer = 'Ann'",
        ),
    ],
)
def test_postgres_marks_the_wrong_occurrence_and_only_it_is_rewritten(
    postgres_tool: Callable[[str], str], sql: str, fixed: str
) -> None:
    trace = sql_trace(postgres_tool, sql, schema=False)
    assert "^" in (trace.steps[0].tool_result or "")  # PostgreSQL's one caret under the start of o.custmer
    assert corrected_sql(trace, "valid_options") == [fixed]
    assert "rows" in json.loads(postgres_tool(fixed))


def test_a_literal_compared_with_two_fields_is_rewritten_where_the_data_writes_it_otherwise() -> None:
    """'boston' is a city the rows write 'Boston', and a customer name no row has: only the city's is rewritten."""
    query = duckdb_tool()
    sql = "SELECT customer FROM orders WHERE customer = 'boston' OR city = 'boston'"
    trace = sql_trace(query, sql)
    (fixed,) = corrected_sql(trace, "shown_value")
    assert fixed == "SELECT customer FROM orders WHERE customer = 'boston' OR city = 'Boston'"
    assert json.loads(query(fixed))["rows"] == [{"customer": "Bo"}, {"customer": "Cy"}]


def test_sqlite_and_postgres_short_statements_have_the_wrong_column_rewritten(
    postgres_tool: Callable[[str], str],
) -> None:
    sqlite = sql_trace(sqlite_tool(), "SELECT custmer FROM orders")  # nothing offered: the schema shown gives it
    assert corrected_sql(sqlite, "valid_options") == ["SELECT customer FROM orders"]
    postgres = sql_trace(postgres_tool, "SELECT custmer FROM orders", schema=False)
    assert "HINT" in (postgres.steps[0].tool_result or "")
    assert corrected_sql(postgres, "valid_options") == ["SELECT customer FROM orders"]


def test_an_argument_that_is_the_named_value_is_replaced_whole_and_no_other() -> None:
    error = {"error": "unknown column 'custmer'", "valid_columns": ["customer", "city"]}
    trace = json_trace({"column": "custmer", "note": "custmer orders"}, error)
    assert replacements(trace) == [("evidence:valid_options", {"column": "customer", "note": "custmer orders"})]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT city FROM orders WHERE nme = 'Ann'",  # no candidate near the wrong name
        "SELEC city FROM orders",  # a syntax error names no column to rewrite
    ],
)
@pytest.mark.parametrize("database", DATABASES)
def test_sql_errors_without_a_near_candidate_stay_silent(
    sql: str, database: str, request: pytest.FixtureRequest
) -> None:
    trace = sql_trace(_database(database, request), sql, schema=False)
    assert failed_call(trace.steps[0])
    assert corrections.evidence_corrections(trace) == []


# -- SQL: a literal the data writes differently -----------------------------------------------------------------
def test_an_empty_row_set_rewrites_the_literal_as_the_rows_shown_write_it() -> None:
    query = duckdb_tool()
    trace = sql_trace(query, "SELECT customer FROM orders WHERE status = 'shipped' ORDER BY amount DESC")
    assert empty_call(trace.steps[1]) and not failed_call(trace.steps[1])
    (fixed,) = corrected_sql(trace, "shown_value")
    assert fixed == "SELECT customer FROM orders WHERE status = 'Shipped' ORDER BY amount DESC"
    assert json.loads(query(fixed))["rows"] == [{"customer": "Ann"}]


@pytest.mark.parametrize(
    ("sql", "schema"),
    [
        ("SELECT customer FROM orders WHERE status = 'Shipped' AND city = 'Boston'", True),  # both as the data writes
        ("SELECT customer FROM orders WHERE status = 'shipped'", False),  # no data shown
        ("SELECT customer FROM orders WHERE status LIKE 'ship%'", True),  # a pattern is not a value
        ("SELECT customer FROM orders WHERE status = 'Shipped'", True),  # not empty
        ("SELECT customer FROM orders WHERE region = 'north'", True),  # a field the data shown does not have
    ],
)
@pytest.mark.parametrize("database", DATABASES)
def test_the_literal_rule_stays_silent_without_a_concrete_fix(
    sql: str, schema: bool, database: str, request: pytest.FixtureRequest
) -> None:
    trace = sql_trace(_database(database, request), sql, schema=schema)
    assert corrected_sql(trace, "shown_value") == []


@pytest.mark.parametrize("database", DATABASES)
def test_each_database_s_empty_rows_have_the_literal_rewritten_as_its_sample_rows_write_it(
    database: str, request: pytest.FixtureRequest
) -> None:
    query = _database(database, request)
    trace = sql_trace(query, "SELECT customer FROM orders WHERE status = 'shipped'")
    assert empty_call(trace.steps[1]) and not failed_call(trace.steps[1])
    (fixed,) = corrected_sql(trace, "shown_value")
    assert fixed == "SELECT customer FROM orders WHERE status = 'Shipped'"
    assert json.loads(query(fixed))["rows"] == [{"customer": "Ann"}]


@pytest.mark.parametrize("database", DATABASES)
def test_a_literal_near_a_value_the_question_names_takes_it(database: str, request: pytest.FixtureRequest) -> None:
    query = _database(database, request)
    trace = sql_trace(
        query, "SELECT customer FROM orders WHERE city = 'San Deigo'", schema=False,
        question='Who ordered from "San Diego"?',
    )  # fmt: skip
    assert empty_call(trace.steps[0])
    (fixed,) = corrected_sql(trace, "question_value")
    assert fixed == "SELECT customer FROM orders WHERE city = 'San Diego'"
    assert json.loads(query(fixed))["rows"] == [{"customer": "Ann"}]


@pytest.mark.parametrize(
    ("sql", "question", "empty"),
    [
        # not empty: the misspelt literal is there, but the call found rows
        ("SELECT customer FROM orders WHERE city = 'Boston' OR city = 'San Deigo'", 'Who ordered from "San Diego"?', False),
        ("SELECT customer FROM orders WHERE city = 'Paris'", 'Who ordered from "San Diego"?', True),  # nothing near
        # the question's value already used by the call: the rule has nothing new to offer
        ("SELECT customer FROM orders WHERE city = 'San Diego' AND amount > 500", 'Who ordered from "San Diego"?', True),
        ("SELECT customer FROM orders WHERE city = 'San Deigo'", "Who ordered the most?", True),  # the question names none
    ],
)  # fmt: skip
@pytest.mark.parametrize("database", DATABASES)
def test_the_question_value_rule_stays_silent_without_a_concrete_fix(
    sql: str, question: str, empty: bool, database: str, request: pytest.FixtureRequest
) -> None:
    trace = sql_trace(_database(database, request), sql, schema=False, question=question)
    assert empty_call(trace.steps[0]) is empty and not failed_call(trace.steps[0])  # the case's premise
    assert corrected_sql(trace, "question_value") == []


def test_a_json_lookup_with_nothing_found_takes_the_value_the_question_names() -> None:
    trace = make_trace(
        'Who ordered from "San Diego"?',
        [
            {"tool": "search_orders", "args": {"city": "San Deigo"}, "result": json.dumps({"results": [], "total": 0})},
            {"reasoning": "?", "is_final_answer": True},
        ],
    )
    assert replacements(trace) == [("evidence:question_value", {"city": "San Diego"})]


# -- JSON results of any tool -----------------------------------------------------------------------------------
def json_trace(args: dict[str, Any], result: object) -> StructuredTrace:
    return make_trace(
        QUESTION,
        [{"tool": "search_orders", "args": args, "result": json.dumps(result)}, {"reasoning": "?", "is_final_answer": True}],
    )  # fmt: skip


def replacements(trace: StructuredTrace) -> list[tuple[str, dict[str, Any]]]:
    found: list[Correction] = corrections.evidence_corrections(trace)
    return [(c.source, dict(c.replacement.arguments)) for c in found if c.replacement is not None]


def test_an_empty_object_naming_the_available_values_proposes_the_nearest() -> None:
    result = {"results": [], "total": 0, "available_statuses": ["Shipped", "Pending", "Cancelled"]}
    assert replacements(json_trace({"status": "shiped", "city": "Boston"}, result)) == [
        ("evidence:listed_values", {"status": "Shipped", "city": "Boston"})
    ]


@pytest.mark.parametrize(
    "result",
    [
        {"results": [{"id": 1}], "total": 1, "available_statuses": ["Shipped"]},  # not empty
        {"results": [], "total": 0},  # empty, nothing offered
        {"results": [], "total": 0, "available_statuses": ["Open", "Closed"]},  # nothing near
        {"results": [], "total": 0, "available_statuses": ["shiped", "Pending"]},  # the value is offered as it is
    ],
)
def test_json_results_without_a_concrete_fix_stay_silent(result: object) -> None:
    assert replacements(json_trace({"status": "shiped"}, result)) == []


def test_an_error_object_naming_the_valid_fields_corrects_the_one_it_names() -> None:
    result = {"error": {"message": "unknown field 'cty'", "valid_fields": ["city", "status", "customer"]}}
    assert replacements(json_trace({"field": "cty", "value": "Boston"}, result)) == [
        ("evidence:valid_options", {"field": "city", "value": "Boston"})
    ]


def test_an_http_problem_reads_as_a_failure_and_its_detail_as_options() -> None:
    problem = {
        "type": "https://example.com/problems/invalid-parameter",
        "title": "Invalid parameter",
        "status": 400,
        "detail": "sort must be one of 'asc', 'desc'",
    }
    trace = json_trace({"sort": "ascending", "city": "Boston"}, problem)
    assert failed_call(trace.steps[0])
    assert replacements(trace) == [("evidence:valid_options", {"sort": "asc", "city": "Boston"})]


def test_a_python_validation_error_lists_the_valid_values() -> None:
    class Filter(pydantic.BaseModel):
        status: Literal["shipped", "pending", "cancelled"]

    with pytest.raises(pydantic.ValidationError) as raised:
        Filter(status="shiped")  # type: ignore[arg-type]
    trace = make_trace(QUESTION, [{"tool": "filter", "args": {"status": "shiped"}, "result": str(raised.value)}])
    assert failed_call(trace.steps[0])
    assert replacements(trace) == [("evidence:valid_options", {"status": "shipped"})]


# -- what reads as failed, and what as empty ----------------------------------------------------------------------
def _python_error(action: Callable[[], object]) -> str:
    try:
        action()
    except Exception as error:
        return "".join(traceback.format_exception_only(error)).strip()
    raise AssertionError("no error")


def _sqlite_error(sql: str) -> str:
    return sqlite_tool()(sql)


FAILED = [
    duckdb_tool()("SELECT nope FROM orders"),
    _sqlite_error("SELECT * FROM nowhere"),
    _python_error(lambda: int("twelve")),
    json.dumps({"ok": False, "message": "rate limited"}),
    json.dumps({"error": "city not found", "results": []}),
    json.dumps({"title": "Not Found", "status": 404, "detail": "no order 7"}),
]
NOT_FAILED = [
    duckdb_tool()("SELECT customer FROM orders"),
    json.dumps({"rows": [{"note": "error: customer cancelled"}], "row_count": 1}),  # data that mentions an error
    json.dumps({"error": None, "results": [{"id": 1}]}),
    json.dumps({"status": 200, "title": "OK", "detail": "done"}),
]


@pytest.mark.parametrize("result", FAILED)
def test_library_and_json_errors_read_as_failed_calls(result: str) -> None:
    assert failed_call(make_trace("q", [{"tool": "t", "args": {}, "result": result}]).steps[0])


@pytest.mark.parametrize("result", NOT_FAILED)
def test_results_that_only_mention_errors_are_not_failed_calls(result: str) -> None:
    assert not failed_call(make_trace("q", [{"tool": "t", "args": {}, "result": result}]).steps[0])


def test_postgres_errors_read_as_failed_calls(postgres_tool: Callable[[str], str]) -> None:
    for sql in ("SELECT nope FROM orders", "SELECT * FROM nowhere", "SELEC 1"):
        assert failed_call(
            make_trace("q", [{"tool": "query", "args": {"sql": sql}, "result": postgres_tool(sql)}]).steps[0]
        )


@pytest.mark.parametrize(
    ("result", "empty"),
    [
        (duckdb_tool()("SELECT * FROM orders WHERE amount > 1000"), True),
        (json.dumps({"items": [], "suggestions": ["Boston"]}), True),  # the hint list is not data
        (json.dumps({"error": None, "results": []}), True),
        (json.dumps({"count": 0}), True),
        (json.dumps({"rowCount": 0}), True),
        (json.dumps({"count": 2, "results": []}), True),  # the rows decide: a page past the end holds none
        (json.dumps({"results": [], "error_count": 0}), True),
        (json.dumps({"columns": ["customer", "city"], "rows": []}), True),  # columns are no data
        (json.dumps({"schema": {"fields": [{"name": "city"}]}, "data": []}), True),
        (json.dumps({"hits": {"total": 0, "hits": []}}), True),  # Elasticsearch 6
        (json.dumps({"_shards": {"total": 1, "failed": 0}, "hits": {"total": {"value": 0}, "hits": []}}), True),
        (duckdb_tool()("SELECT * FROM orders"), False),
        (json.dumps({"name": "orders"}), False),
        (json.dumps({"results": [{"customer": "Bo"}], "error_count": 0}), False),  # a zero count of errors
        (json.dumps({"results": [{"customer": "Bo"}], "retries": 0}), False),
        (json.dumps({"customer": "Bo", "discount": 0}), False),  # a zero that counts no rows
        (json.dumps({"error_count": 0}), False),
        (json.dumps({"count": 0, "results": [{"customer": "Bo"}]}), False),  # the rows decide
        (json.dumps({"columns": ["customer"], "rows": [["Bo"]]}), False),
        (json.dumps({"hits": {"total": 1, "hits": [{"_source": {"customer": "Bo"}}]}}), False),
    ],
)
def test_empty_row_sets_read_as_empty_results(result: str, empty: bool) -> None:
    assert empty_call(make_trace("q", [{"tool": "t", "args": {}, "result": result}]).steps[0]) is empty


def test_a_result_with_rows_and_a_zero_error_count_is_not_corrected() -> None:
    """A search API that matches case-insensitively answered the rows with ``error_count: 0``: the call worked, so
    nothing says it returned nothing, and its value is not rewritten as the data shown writes it."""
    shown = {"results": [{"customer": "Bo", "city": "Boston"}, {"customer": "Ann", "city": "San Diego"}]}
    found = {"results": [{"customer": "Bo", "city": "Boston"}], "error_count": 0}
    trace = make_trace(
        "Who ordered from Boston?",
        [
            {"tool": "list_orders", "args": {}, "result": json.dumps(shown)},
            {"tool": "search_orders", "args": {"city": "boston"}, "result": json.dumps(found)},
            {"reasoning": "Bo", "is_final_answer": True},
        ],
        final_answer="Bo",
    )
    assert not empty_call(trace.steps[1])
    assert replacements(trace) == []
    assert not [f for f in find_evidence(trace) if f.kind is FindingKind.EMPTY_RESULT]
    # the same call that did return nothing is corrected
    nothing = trace.steps[1].model_copy(update={"tool_result": json.dumps({"results": [], "error_count": 0})})
    empty = trace.model_copy(update={"steps": (trace.steps[0], nothing, trace.steps[2])})
    assert replacements(empty) == [("evidence:shown_value", {"city": "Boston"})]


# -- plugin rules: one that breaks is skipped, by name ----------------------------------------------------------
def raising_rule(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    raise KeyError("tool_args")


def sloppy_rule(trace: StructuredTrace, step: Step, context: str = "") -> Any:
    return {"sql": "SELECT 1"}  # not a list of Correction


def quoting_rule(trace: StructuredTrace, step: Step, context: str = "") -> list[Correction]:
    """A well-behaved third-party rule: quotes an identifier the error names."""
    sql = str(step.tool_args.get("sql", ""))
    if not failed_call(step) or "custmer" not in sql:
        return []
    replacement = StepAction(tool_name=step.tool_name, arguments={"sql": sql.replace("custmer", '"customer"')})
    return [corrections.rule_correction(step, "quoting", replacement, "quoted")]


def test_a_failing_plugin_is_skipped_by_name_and_the_other_rules_go_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    group = plugins.CORRECTION_RULES
    installed = [
        EntryPoint("broken", f"{__name__}:raising_rule", group),
        EntryPoint("sloppy", f"{__name__}:sloppy_rule", group),
        EntryPoint("gone", f"{__name__}:no_such_rule", group),
        EntryPoint("quoting", f"{__name__}:quoting_rule", group),
    ]
    monkeypatch.setattr(plugins, "entry_points", lambda group: installed if group == plugins.CORRECTION_RULES else [])
    trace = sql_trace(duckdb_tool(), "SELECT custmer FROM orders", schema=False)
    with caplog.at_level(logging.WARNING, logger="reflect_otel.attribution.corrections"):
        found = replacements(trace)
    assert found == [
        ("evidence:valid_options", {"sql": "SELECT customer FROM orders"}),
        ("evidence:quoting", {"sql": 'SELECT "customer" FROM orders'}),
    ]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "'gone' (entry point) could not be loaded" in logged
    assert "broken (entry point) failed on step 1" in logged
    assert "sloppy (entry point) returned {'sql': 'SELECT 1'}, not a list of Correction" in logged


def test_an_agents_broken_rule_does_not_sink_its_attribution(caplog: pytest.LogCaptureFixture) -> None:
    """REFLECT on a failed DuckDB query, the agent's replay adapter bringing a broken rule and a badly typed one:
    both are skipped by name, and the built-in rule's one-identifier fix is executed and verifies."""
    query = duckdb_tool()
    trace = sql_trace(query, "SELECT city FROM orders WHERE custmer = 'Ann'", schema=False)

    def answer(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        result = trace.steps[point - 1].tool_result or "{}" if point else "{}"
        rows = json.loads(result).get("rows") if result.startswith("{") else None  # an error: no rows
        return [{"reasoning": rows[0]["city"] if rows else "unknown", "is_final_answer": True}]

    agent = ScriptedReplayAdapter(
        answer, tools={"query": query}, deterministic=True, correction_rules=(raising_rule, sloppy_rule)
    )
    llm = scripted_auditor(localize=(1,))
    pipeline = ReflectPipeline(llm, verifier=OracleVerifier(), config=ReflectConfig(rounds=1, rollback_points=1))
    with caplog.at_level(logging.WARNING, logger="reflect_otel.attribution.corrections"):
        record = pipeline.attribute(trace, expected="San Diego", replay=agent)
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 1, record.errors
    assert record.verified_by is not None and record.verified_by.source == "evidence:valid_options"
    assert not record.errors
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{__name__}.raising_rule failed" in logged and f"{__name__}.sloppy_rule returned" in logged


# -- the leak guard reads what a fix introduces --------------------------------------------------------------------
def test_a_literal_fix_of_a_limit_1_query_is_tried_when_the_answer_is_1() -> None:
    """How many orders shipped? 1. The agent's query compares status with 'shipped' (the data writes 'Shipped')
    and ends in LIMIT 1: the fix introduces 'Shipped', not the 1 the agent wrote, so it runs and verifies."""
    query = duckdb_tool()
    sql = "SELECT COUNT(*) AS n FROM orders WHERE status = 'shipped' GROUP BY status LIMIT 1"
    trace = sql_trace(query, sql, question="How many orders shipped?")
    assert empty_call(trace.steps[1])

    def answer(trace: StructuredTrace, point: int, injection: str) -> list[dict[str, Any]]:
        rows = json.loads(trace.steps[point - 1].tool_result or "{}").get("rows")
        return [{"reasoning": str(rows[0]["n"]) if rows else "0", "is_final_answer": True}]

    (found,) = corrections.evidence_corrections(trace)
    assert corrections.refusal(found, trace, "1") is None
    agent = ScriptedReplayAdapter(answer, tools={"query": query}, deterministic=True)
    pipeline = ReflectPipeline(
        scripted_auditor(localize=(2,)), verifier=OracleVerifier(), config=ReflectConfig(rounds=1, rollback_points=1)
    )
    record = pipeline.attribute(trace, expected="1", replay=agent)
    assert record.status is AttributionStatus.VERIFIED and record.step_index == 2
    assert record.verified_by is not None and record.verified_by.source == "evidence:shown_value"
    assert record.corrected_answer == "1"


@pytest.mark.parametrize(
    ("text", "statement"),
    [
        ("SELECT custmer FROM orders", True),  # no operator, no quote: still a statement, rewritten token by token
        ("select *\nfrom orders", True),
        ("SELECT*FROM t", True),
        ("DELETE FROM orders", True),
        ("WITH t AS (SELECT 1) SELECT * FROM t", True),
        ("Select Committee", False),  # values that open with a keyword's word
        ("Drop from the list", False),
        ("Select from the list", False),  # nothing selected: a menu's label, not a statement
        ("San Diego", False),
    ],
)
def test_a_short_sql_statement_is_never_read_as_a_value_replaced_whole(text: str, statement: bool) -> None:
    from reflect_otel.attribution._statement import is_statement

    assert is_statement(text) is statement
