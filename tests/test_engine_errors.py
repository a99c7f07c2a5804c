"""The evidence rules on the failures any table, SQL or JSON-API agent meets, each produced here by the real engine
(DuckDB, SQLite, PostgreSQL, pandas, the table demo's tools), never typed by hand: a name with spaces left unquoted,
an unknown name, a value of the wrong type or case, a row past the last one, a value near one the data or the
question writes. Each correction is run again on the same engine to show it is the fix; beside each rule, the cases
where it must stay silent."""

from __future__ import annotations

import json
import sqlite3
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from reflect_otel.attribution import corrections
from reflect_otel.demo.table_tools import TableWorkspace
from reflect_otel.flagging.evidence import FindingKind, empty_call, failed_call, find_evidence
from reflect_otel.testing import make_trace
from reflect_otel.trace import StructuredTrace, ToolDefinition

pd = pytest.importorskip("pandas", reason="pip install -e '.[dev]'")

COLUMNS = ["Train No", "Tie no", "pos.", "Home team", "Attendance", "Length (miles)"]
ROWS: list[tuple[Any, ...]] = [
    ("16", "1", "FW", "Ann Arbor", 100, 30.5),
    ("17", "2", "GK", "Boston", 250, 12.0),
    ("18", "Replay", "DF", "Cardiff", 1200, 62.0),
    ("19", "3", "MF", "Dundee", 90, 8.0),
]
QUESTION = "Which home team played the replay?"
Query = Callable[[str], str]


def _records(names: list[str], rows: list[tuple[Any, ...]]) -> str:
    """A query tool's answer: the rows as JSON objects with their count (as the SQL demo agent writes them)."""
    return json.dumps({"row_count": len(rows), "rows": [dict(zip(names, row, strict=True)) for row in rows]})


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# -- the engines: a query tool over the same table, answering rows as JSON or the engine's own error -------------
def duckdb_query() -> Query:
    db = duckdb.connect(":memory:")
    types = ["VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "INTEGER", "DOUBLE"]
    db.execute(f"CREATE TABLE data ({', '.join(f'{_quoted(c)} {t}' for c, t in zip(COLUMNS, types, strict=True))})")
    db.executemany(f"INSERT INTO data VALUES ({', '.join('?' for _ in COLUMNS)})", ROWS)

    def query(sql: str) -> str:
        try:
            cursor = db.execute(sql)
            return _records([d[0] for d in cursor.description or ()], cursor.fetchall())
        except duckdb.Error as error:
            return str(error)

    return query


def sqlite_query() -> Query:
    """SQLite as a CSV loader leaves it: columns without a declared type, so a value keeps the type it came with and
    ``'1'`` is not ``1``."""
    db = sqlite3.connect(":memory:")
    db.execute(f"CREATE TABLE data ({', '.join(_quoted(c) for c in COLUMNS)})")
    db.executemany(f"INSERT INTO data VALUES ({', '.join('?' for _ in COLUMNS)})", ROWS)

    def query(sql: str) -> str:
        try:
            cursor = db.execute(sql)
            return _records([d[0] for d in cursor.description or ()], cursor.fetchall())
        except sqlite3.Error as error:
            return f"{type(error).__name__}: {error}"  # as tool wrappers write an exception

    return query


@pytest.fixture(scope="module")
def postgres_query(postgres_server: Any) -> Iterator[Query]:
    import psycopg

    types = ["TEXT", "TEXT", "TEXT", "TEXT", "INTEGER", "DOUBLE PRECISION"]
    connection = psycopg.connect(postgres_server.url, autocommit=True)
    connection.execute("DROP TABLE IF EXISTS data")
    connection.execute(f"CREATE TABLE data ({', '.join(f'{_quoted(c)} {t}' for c, t in zip(COLUMNS, types, strict=True))})")  # fmt: skip
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO data VALUES ({', '.join('%s' for _ in COLUMNS)})", ROWS)

    def query(sql: str) -> str:
        try:
            cursor = connection.execute(sql)
            return _records([d.name for d in cursor.description or ()], cursor.fetchall())
        except psycopg.Error as error:
            return str(error)

    yield query
    connection.close()


def engine(name: str, request: pytest.FixtureRequest) -> Query:
    """One of the three databases' query tools (PostgreSQL's from its fixture: skipped without a server)."""
    if name == "postgres":
        tool: Query = request.getfixturevalue("postgres_query")
        return tool
    return {"duckdb": duckdb_query, "sqlite": sqlite_query}[name]()


ENGINES = ["duckdb", "sqlite", "postgres"]


def schema_of(query: Query) -> str:
    """A schema tool's answer: the table, its row count, its columns and its first rows, as JSON."""
    rows = json.loads(query("SELECT * FROM data LIMIT 3"))["rows"]
    count = json.loads(query("SELECT count(*) AS n FROM data"))["rows"][0]["n"]
    return json.dumps({"table": "data", "row_count": count, "columns": [{"name": n} for n in rows[0]], "sample_rows": rows})  # fmt: skip


def sql_trace(query: Query, sql: str, *, schema: bool = True, question: str = QUESTION) -> StructuredTrace:
    steps: list[dict[str, Any]] = [{"tool": "schema", "args": {}, "result": schema_of(query)}] if schema else []
    steps += [
        {"tool": "query", "args": {"sql": sql}, "result": query(sql)},
        {"reasoning": "?", "is_final_answer": True},
    ]
    return make_trace(question, steps, final_answer="?")


def proposed(trace: StructuredTrace, rule: str, argument: str = "sql") -> list[Any]:
    found = [c for c in corrections.evidence_corrections(trace) if c.source == f"evidence:{rule}"]
    return [c.replacement.arguments[argument] for c in found if c.replacement is not None]


def rows_of(result: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(result)["rows"]  # a JSON error would raise here: the fix must run
    return rows


# -- pandas: a DataFrame behind tools, as an agent framework wraps them -------------------------------------------
class FrameTools:
    """Tools over one pandas DataFrame: JSON records, or the exception as Python prints it."""

    def __init__(self) -> None:
        self.frame = pd.DataFrame(ROWS, columns=COLUMNS)

    def call(self, tool: str, **args: Any) -> str:
        try:
            return str(getattr(self, tool)(**args))
        except Exception as error:
            return "".join(traceback.format_exception_only(error)).strip()

    def _json(self, frame: Any) -> str:
        return json.dumps({"rows": json.loads(frame.to_json(orient="records"))})

    def describe(self) -> str:
        head = json.loads(self.frame.head(3).to_json(orient="records"))
        return json.dumps({"table": "df", "shape": list(self.frame.shape), "rows": head})

    def column(self, column: str) -> str:
        return self._json(self.frame[[column]]) if column in self.frame else str(self.frame[column])

    def row(self, index: int) -> str:
        return json.dumps(json.loads(self.frame.iloc[index].to_json()))

    def cell(self, column: str, position: int) -> str:
        return str(self.frame[column].to_numpy()[position])

    def filter(self, column: str, op: str, value: Any) -> str:
        compare = {"==": "__eq__", ">": "__gt__", "<": "__lt__"}[op]
        return self._json(self.frame[getattr(self.frame[column], compare)(value)])

    def query(self, expr: str) -> str:
        return self._json(self.frame.query(expr))


def frame_trace(tools: FrameTools, calls: list[tuple[str, dict[str, Any]]], *, question: str = QUESTION) -> StructuredTrace:  # fmt: skip
    steps: list[dict[str, Any]] = [{"tool": t, "args": a, "result": tools.call(t, **a)} for t, a in calls]
    return make_trace(question, [*steps, {"reasoning": "?", "is_final_answer": True}], final_answer="?")


DESCRIBE: tuple[str, dict[str, Any]] = ("describe", {})


# -- 3. a name with spaces or symbols left unquoted -------------------------------------------------------------
UNQUOTED = [
    # the parser stops at the second word: DuckDB and PostgreSQL 'at or near "no"', SQLite 'near "no"'
    ('SELECT "Home team" FROM data WHERE Tie no = \'Replay\'', 'SELECT "Home team" FROM data WHERE "Tie no" = \'Replay\''),
    # read as a column and its alias: the first word is the unknown column ("Train"), the second no alias left behind
    ("SELECT Train No FROM data WHERE \"Home team\" = 'Boston'", "SELECT \"Train No\" FROM data WHERE \"Home team\" = 'Boston'"),
    # a symbol ends the name: the parser stops at the word after it
    ("SELECT \"Home team\" FROM data WHERE pos. = 'GK'", "SELECT \"Home team\" FROM data WHERE \"pos.\" = 'GK'"),
    # read as a function call: "miles" is the unknown column
    ('SELECT "Home team" FROM data WHERE Length (miles) > 60', 'SELECT "Home team" FROM data WHERE "Length (miles)" > 60'),
    # one name written bare twice is one reference: both places quoted
    ("SELECT Tie no FROM data WHERE Tie no = 'Replay'", "SELECT \"Tie no\" FROM data WHERE \"Tie no\" = 'Replay'"),
]  # fmt: skip


@pytest.mark.parametrize(("sql", "fixed"), UNQUOTED)
@pytest.mark.parametrize("name", ENGINES)
def test_a_name_left_unquoted_is_quoted_whole(sql: str, fixed: str, name: str, request: pytest.FixtureRequest) -> None:
    query = engine(name, request)
    trace = sql_trace(query, sql)
    assert failed_call(trace.steps[1])
    assert proposed(trace, "unquoted_name") == [fixed]
    assert rows_of(query(fixed))  # the quoted statement runs and finds the row
    assert proposed(trace, "valid_options") == []  # no word of the name rewritten alone


def test_duckdb_train_no_is_quoted_whole_never_leaving_an_alias_behind() -> None:
    """WikiTableQuestions nt-801 as the SQL agent met it: the column is "Train No:", the agent wrote ``Train No``
    bare, DuckDB read "No" as an alias and offered "Train No:" for "Train"; rewriting the word alone gave
    ``"Train No:" No``."""
    db = duckdb.connect(":memory:")
    db.execute('CREATE TABLE data ("No." VARCHAR, "Train No:" VARCHAR, "Destination" VARCHAR, "Train Name" VARCHAR)')
    db.executemany(
        "INSERT INTO data VALUES (?, ?, ?, ?)", [("1", "56650", "Kannur", "A"), ("2", "56656", "Kannur", "B")]
    )

    def query(sql: str) -> str:
        try:
            cursor = db.execute(sql)
            return _records([d[0] for d in cursor.description or ()], cursor.fetchall())
        except duckdb.Error as error:
            return str(error)

    sql = "SELECT Train No FROM data WHERE Destination = 'Kannur'"
    trace = sql_trace(query, sql, schema=False)
    assert 'Candidate bindings: "Train No:"' in (trace.steps[0].tool_result or "")
    (correction,) = corrections.evidence_corrections(trace)
    assert correction.source == "evidence:unquoted_name"
    assert correction.replacement is not None
    assert correction.replacement.arguments["sql"] == "SELECT \"Train No:\" FROM data WHERE Destination = 'Kannur'"
    assert "its error lists the field 'Train No:'" in correction.finding
    assert rows_of(query(correction.replacement.arguments["sql"])) == [{"Train No:": "56650"}, {"Train No:": "56656"}]


def test_a_pandas_query_with_a_name_left_unquoted_is_quoted_with_backticks() -> None:
    tools = FrameTools()
    trace = frame_trace(tools, [DESCRIBE, ("query", {"expr": "Attendance > 100 and Tie no == 'Replay'"})])
    assert "SyntaxError" in (trace.steps[1].tool_result or "")
    (fixed,) = proposed(trace, "unquoted_name", "expr")
    assert fixed == "Attendance > 100 and `Tie no` == 'Replay'"
    assert rows_of(tools.call("query", expr=fixed))[0]["Home team"] == "Cardiff"


@pytest.mark.parametrize(
    ("sql", "schema"),
    [
        ('SELECT "Home team" FROM data WHERE "Attendance" > > 5', True),  # a syntax error with no name in it
        ('SELEC "Tie no" FROM data', True),
        # the statement writes a name bare, but the error points elsewhere
        ('SELECT Tie no FROM data WHERE "Attendance" > > 5', True),
        ("SELECT Away team FROM data", True),  # no field of the data is that name
        ("SELECT Train No FROM data", False),  # nothing shown names a field (DuckDB's candidates are the exception)
    ],
)
@pytest.mark.parametrize("name", ENGINES)
def test_the_unquoted_name_rule_stays_silent_where_it_cannot_tell(
    sql: str, schema: bool, name: str, request: pytest.FixtureRequest
) -> None:
    trace = sql_trace(engine(name, request), sql, schema=schema)
    step = trace.steps[-2]
    assert failed_call(step)
    if name == "duckdb" and sql == "SELECT Train No FROM data":
        assert proposed(trace, "unquoted_name") == ['SELECT "Train No" FROM data']  # its error lists "Train No"
        return
    assert proposed(trace, "unquoted_name") == []


@pytest.mark.parametrize("schema", [True, False])
def test_postgres_folds_a_bare_name_in_capitals_and_it_is_quoted(schema: bool, postgres_query: Query) -> None:
    """PostgreSQL reads ``Attendance`` as ``attendance``; its HINT offers ``data.Attendance``, the name as written,
    which no rewrite of the word changes: quoting it does."""
    trace = sql_trace(postgres_query, 'SELECT "Home team" FROM data WHERE Attendance > 1000', schema=schema)
    assert 'column "attendance" does not exist' in (trace.steps[-2].tool_result or "")
    assert proposed(trace, "unquoted_name") == ['SELECT "Home team" FROM data WHERE "Attendance" > 1000']
    assert rows_of(postgres_query('SELECT "Home team" FROM data WHERE "Attendance" > 1000')) == [
        {"Home team": "Cardiff"}
    ]


def test_a_pandas_query_writing_two_names_bare_is_left_alone() -> None:
    """Python's SyntaxError marks a reformatted line: with two names bare, nothing tells which one it stopped at."""
    trace = frame_trace(FrameTools(), [DESCRIBE, ("query", {"expr": "Home team == 'Cardiff' and Tie no == 'Replay'"})])
    assert failed_call(trace.steps[1])
    assert proposed(trace, "unquoted_name", "expr") == []


# -- 2. an unknown name: tables and pandas columns ------------------------------------------------------------------
@pytest.mark.parametrize("name", ENGINES)
def test_an_unknown_table_is_corrected_from_the_tables_shown(name: str, request: pytest.FixtureRequest) -> None:
    """DuckDB offers the table ("Did you mean"); SQLite's ``no such table`` and PostgreSQL's ``relation "x" does not
    exist`` offer nothing, and the schema shown before names it."""
    query = engine(name, request)
    trace = sql_trace(query, 'SELECT "Home team" FROM dta WHERE "Tie no" = \'Replay\'')
    assert failed_call(trace.steps[1])
    (fixed,) = proposed(trace, "valid_options")
    assert fixed == 'SELECT "Home team" FROM data WHERE "Tie no" = \'Replay\''
    assert rows_of(query(fixed)) == [{"Home team": "Cardiff"}]
    if name != "duckdb":
        silent = sql_trace(query, 'SELECT "Home team" FROM dta WHERE "Tie no" = \'Replay\'', schema=False)
        assert proposed(silent, "valid_options") == []  # no table shown, none offered


def test_a_pandas_key_error_is_corrected_from_the_columns_shown() -> None:
    tools = FrameTools()
    trace = frame_trace(tools, [DESCRIBE, ("column", {"column": "Attendence"})])
    assert trace.steps[1].tool_result == "KeyError: 'Attendence'"
    assert proposed(trace, "valid_options", "column") == ["Attendance"]
    assert rows_of(tools.call("column", column="Attendance"))[0] == {"Attendance": 100}
    alone = frame_trace(tools, [("column", {"column": "Attendence"})])
    assert proposed(alone, "valid_options", "column") == []  # nothing shown: silent


# -- 4. a value of the other type -----------------------------------------------------------------------------------
RETYPED = [
    # text compared with a number: DuckDB's Conversion Error names the column, PostgreSQL's 'text = integer'
    ("duckdb", "SELECT \"Home team\" FROM data WHERE \"Tie no\" = 2", "SELECT \"Home team\" FROM data WHERE \"Tie no\" = '2'"),
    ("postgres", "SELECT \"Home team\" FROM data WHERE \"Tie no\" = 2", "SELECT \"Home team\" FROM data WHERE \"Tie no\" = '2'"),
    ("duckdb", "SELECT \"Home team\" FROM data WHERE \"Tie no\" IN (1, 2)", "SELECT \"Home team\" FROM data WHERE \"Tie no\" IN ('1', '2')"),
    # SQLite finds nothing: the rows shown write 2 as text under "Tie no"
    ("sqlite", "SELECT \"Home team\" FROM data WHERE \"Tie no\" = 2", "SELECT \"Home team\" FROM data WHERE \"Tie no\" = '2'"),
    # a number compared with text: DuckDB's 'Could not convert string', PostgreSQL's 'invalid input syntax'
    ("duckdb", "SELECT \"Home team\" FROM data WHERE \"Attendance\" > '1,000'", "SELECT \"Home team\" FROM data WHERE \"Attendance\" > 1000"),
    ("postgres", "SELECT \"Home team\" FROM data WHERE \"Attendance\" > '1,000'", "SELECT \"Home team\" FROM data WHERE \"Attendance\" > 1000"),
    # SQLite finds nothing: the rows shown hold 250 as a number
    ("sqlite", "SELECT \"Home team\" FROM data WHERE \"Attendance\" = '250'", "SELECT \"Home team\" FROM data WHERE \"Attendance\" = 250"),
    # text ordered against a number, every value shown a number: the field cast
    ("duckdb", "SELECT \"Home team\" FROM data WHERE \"Train No\" > 17", "SELECT \"Home team\" FROM data WHERE CAST(\"Train No\" AS NUMERIC) > 17"),
    ("postgres", "SELECT \"Home team\" FROM data WHERE \"Train No\" > 17", "SELECT \"Home team\" FROM data WHERE CAST(\"Train No\" AS NUMERIC) > 17"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "sql", "fixed"), RETYPED)
def test_a_value_of_the_other_type_is_written_as_the_field_holds_it(
    name: str, sql: str, fixed: str, request: pytest.FixtureRequest
) -> None:
    query = engine(name, request)
    trace = sql_trace(query, sql)
    assert failed_call(trace.steps[1]) or empty_call(trace.steps[1])
    assert proposed(trace, "value_type") == [fixed]
    assert rows_of(query(fixed))  # the retyped statement runs and finds rows


@pytest.mark.parametrize(
    ("sql", "names"),
    [
        ('SELECT "Home team" FROM data WHERE "Attendance" = \'abc\'', ENGINES),  # no number however it is quoted
        ('SELECT "Home team" FROM data WHERE "Tie no" > 1', ENGINES),  # ordered, and "Replay" is no number: no cast
        # nothing found, and no row shown writes 7: nothing says the type is the mistake (DuckDB and PostgreSQL
        # fail on the type, and are corrected)
        ('SELECT "Home team" FROM data WHERE "Tie no" = 7', ["sqlite"]),
        ('SELECT "Home team" FROM data WHERE "Tie no" = \'Replay\'', ENGINES),  # the types agree
        ('SELECT "Home team" FROM data WHERE "Attendance" > > 5', ENGINES),  # an error that is not about types
    ],
)
@pytest.mark.parametrize("name", ENGINES)
def test_the_value_type_rule_stays_silent_where_it_cannot_tell(
    sql: str, names: list[str], name: str, request: pytest.FixtureRequest
) -> None:
    found = proposed(sql_trace(engine(name, request), sql), "value_type")
    assert found == ([] if name in names else ['SELECT "Home team" FROM data WHERE "Tie no" = \'7\''])


def test_a_schema_s_declared_types_say_what_a_field_holds() -> None:
    """SQLite finds nothing for ``"Tie no" = 2``; a schema that declares the column's type (as the SQL demo's
    schema tool does) says it is text, whatever the rows shown."""
    query = sqlite_query()
    schema = json.dumps({"table": "data", "columns": [{"name": "Tie no", "type": "VARCHAR"}, {"name": "Home team", "type": "VARCHAR"}]})  # fmt: skip
    sql = 'SELECT "Home team" FROM data WHERE "Tie no" = 2'
    trace = make_trace(QUESTION, [
        {"tool": "schema", "args": {}, "result": schema},
        {"tool": "query", "args": {"sql": "SELECT \"Tie no\" FROM data LIMIT 2"}, "result": query("SELECT \"Tie no\" FROM data LIMIT 2")},
        {"tool": "query", "args": {"sql": sql}, "result": query(sql)},
        {"reasoning": "?", "is_final_answer": True},
    ])  # fmt: skip
    assert empty_call(trace.steps[2])
    assert proposed(trace, "value_type") == ['SELECT "Home team" FROM data WHERE "Tie no" = \'2\'']


def test_pandas_comparisons_of_the_other_type_take_the_value_as_the_column_holds_it() -> None:
    tools = FrameTools()
    number = frame_trace(tools, [DESCRIBE, ("filter", {"column": "Attendance", "op": ">", "value": "1000"})])
    assert "TypeError: Invalid comparison between dtype=int64 and str" in (number.steps[1].tool_result or "")
    assert proposed(number, "value_type", "value") == [1000]
    assert rows_of(tools.call("filter", column="Attendance", op=">", value=1000))[0]["Home team"] == "Cardiff"
    text = frame_trace(tools, [DESCRIBE, ("filter", {"column": "Tie no", "op": "==", "value": 2})])
    assert empty_call(text.steps[1])  # pandas compares "2" with 2 and finds nothing
    assert proposed(text, "value_type", "value") == ["2"]
    assert rows_of(tools.call("filter", column="Tie no", op="==", value="2"))[0]["Home team"] == "Boston"
    # ordered against a number, a text column cannot be cast through a value argument: silent
    ordered = frame_trace(tools, [DESCRIBE, ("filter", {"column": "Tie no", "op": ">", "value": 1})])
    assert (ordered.steps[1].tool_result or "").startswith("TypeError: ")  # pandas 3 and 2 word it differently
    assert proposed(ordered, "value_type", "value") == []


def test_a_case_mismatch_in_a_pandas_filter_takes_the_value_as_the_rows_shown_write_it() -> None:
    tools = FrameTools()
    trace = frame_trace(tools, [DESCRIBE, ("filter", {"column": "Home team", "op": "==", "value": "boston"})])
    assert empty_call(trace.steps[1])
    assert proposed(trace, "shown_value", "value") == ["Boston"]
    assert rows_of(tools.call("filter", column="Home team", op="==", value="Boston"))[0]["Tie no"] == "2"
    unseen = frame_trace(tools, [DESCRIBE, ("filter", {"column": "Home team", "op": "==", "value": "dundee"})])
    assert proposed(unseen, "shown_value", "value") == []  # Dundee is not in the rows shown: silent


# -- 5. a row past the last one -------------------------------------------------------------------------------------
@pytest.fixture()
def workspace(tmp_path: Path) -> TableWorkspace:
    table = tmp_path / "t.tsv"
    table.write_text("Year\tCity\tPosition\n" + "".join(f"{2000 + i}\tCity {i}\t{i + 1}th\n" for i in range(10)))
    return TableWorkspace(table)


def test_the_table_agents_lookup_past_the_rows_takes_its_last_row(workspace: TableWorkspace) -> None:
    described = workspace.describe("t0")
    looked_up = workspace.lookup("t0", "City", 26)
    assert looked_up == "error: t0 has fewer than 26 rows" and described.startswith("t0: 10 rows")
    trace = make_trace(QUESTION, [
        {"tool": "describe", "args": {"table": "t0"}, "result": described},
        {"tool": "lookup", "args": {"table": "t0", "column": "City", "row": 26}, "result": looked_up},
        {"reasoning": "?", "is_final_answer": True},
    ])  # fmt: skip
    (correction,) = corrections.evidence_corrections(trace)
    assert correction.source == "evidence:last_row" and correction.replacement is not None
    assert correction.replacement.arguments == {"table": "t0", "column": "City", "row": 10}  # counted from 1
    assert "t0 has 10 rows, so 10 is its last row" in correction.finding and "a guess" in correction.finding
    assert workspace.lookup(**correction.replacement.arguments) == "City 9"
    # the tool's recorded definition decides how it counts
    zero = trace.model_copy(update={"tools": (ToolDefinition(name="lookup", description="row: 0-based position"),)})
    assert proposed(zero, "last_row", "row") == [9]
    # no count shown: silent
    alone = make_trace(QUESTION, [
        {"tool": "lookup", "args": {"table": "t0", "column": "City", "row": 26}, "result": looked_up},
        {"reasoning": "?", "is_final_answer": True},
    ])  # fmt: skip
    assert proposed(alone, "last_row", "row") == []


def test_pandas_positions_past_the_rows_take_the_last_row() -> None:
    tools = FrameTools()
    trace = frame_trace(tools, [DESCRIBE, ("row", {"index": 26})])
    assert trace.steps[1].tool_result == "IndexError: single positional indexer is out-of-bounds"
    assert proposed(trace, "last_row", "index") == [3]  # shape [4, 6], counted from 0
    assert json.loads(tools.call("row", index=3))["Home team"] == "Dundee"
    # numpy says the size itself
    sized = frame_trace(tools, [("cell", {"column": "Home team", "position": 26})])
    assert "with size 4" in (sized.steps[0].tool_result or "")
    assert proposed(sized, "last_row", "position") == [3]
    assert tools.call("cell", column="Home team", position=3) == "Dundee"
    # no count known: silent
    assert proposed(frame_trace(tools, [("row", {"index": 26})]), "last_row", "index") == []


def test_a_json_api_index_out_of_range_takes_the_last_item() -> None:
    items = [{"id": i, "name": f"item {i}"} for i in range(10)]

    def get_item(index: int) -> str:
        """A JSON API's handler: the item, or an error object that says how many there are."""
        try:
            return json.dumps(items[index])
        except IndexError:
            return json.dumps({"error": f"index {index} out of range ({len(items)} items)"})

    trace = make_trace(QUESTION, [
        {"tool": "get_item", "args": {"index": "26"}, "result": get_item(26)},
        {"reasoning": "?", "is_final_answer": True},
    ])  # fmt: skip
    assert failed_call(trace.steps[0])
    assert proposed(trace, "last_row", "index") == ["9"]  # a string argument stays a string
    assert json.loads(get_item(9))["id"] == 9


@pytest.mark.parametrize("name", ENGINES)
def test_an_offset_past_a_tables_rows_takes_its_last_row(name: str, request: pytest.FixtureRequest) -> None:
    query = engine(name, request)
    trace = sql_trace(query, 'SELECT "Home team" FROM data ORDER BY "Train No" LIMIT 1 OFFSET 26')
    assert empty_call(trace.steps[1])
    (fixed,) = proposed(trace, "last_row")
    assert fixed == 'SELECT "Home team" FROM data ORDER BY "Train No" LIMIT 1 OFFSET 3'
    assert rows_of(query(fixed)) == [{"Home team": "Dundee"}]
    # filtered rows are not the table's: their count is not known
    filtered = sql_trace(query, 'SELECT "Home team" FROM data WHERE "Attendance" > 95 LIMIT 1 OFFSET 26')
    assert empty_call(filtered.steps[1]) and proposed(filtered, "last_row") == []


# -- 6. a value near one the data or the question writes; 1. the values an empty result lists ----------------------
def test_a_pandas_filter_on_a_near_miss_takes_the_value_the_question_names() -> None:
    tools = FrameTools()
    trace = frame_trace(tools, [("filter", {"column": "Home team", "op": "==", "value": "Cardif"})], question='Did "Cardiff" play a replay?')  # fmt: skip
    assert empty_call(trace.steps[0])
    assert proposed(trace, "question_value", "value") == ["Cardiff"]
    assert rows_of(tools.call("filter", column="Home team", op="==", value="Cardiff"))[0]["Tie no"] == "Replay"


def test_the_table_agents_empty_filter_takes_a_value_it_lists(workspace: TableWorkspace) -> None:
    result = workspace.filter_rows("t0", "Position", "=", "3")
    assert "values of Position in t0 include: '1th', '2th', '3th'" in result
    trace = make_trace(QUESTION, [
        {"tool": "filter_rows", "args": {"table": "t0", "column": "Position", "op": "=", "value": "3"}, "result": result},
        {"reasoning": "?", "is_final_answer": True},
    ])  # fmt: skip
    assert proposed(trace, "listed_values", "value") == ["3th"]


# -- what the evidence checks read as failed ------------------------------------------------------------------------
def _bare(action: Callable[[], object]) -> str:
    """An exception's message alone, as a tool that returns ``str(error)`` writes it."""
    try:
        action()
    except Exception as error:
        return str(error)
    raise AssertionError("no error")


def test_out_of_range_and_type_errors_read_as_failed_calls_without_their_exception_name() -> None:
    frame = pd.DataFrame(ROWS, columns=COLUMNS)
    bare = [
        _bare(lambda: frame.iloc[26]),  # single positional indexer is out-of-bounds
        _bare(lambda: frame["Attendance"] > "5"),  # Invalid comparison between dtype=int64 and str
        _bare(lambda: [1, 2][26]),  # list index out of range
        _bare(lambda: 1 < "a"),  # type: ignore[operator]  # '<' not supported between instances of 'int' and 'str'
    ]
    for result in bare:
        trace = make_trace(
            "q", [{"tool": "t", "args": {}, "result": result}, {"reasoning": "?", "is_final_answer": True}]
        )
        assert failed_call(trace.steps[0]), result
        assert [f.kind for f in find_evidence(trace)] == [FindingKind.TOOL_ERROR], result
