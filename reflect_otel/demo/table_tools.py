"""Real table tools over DuckDB for the table-QA demo agent.

A :class:`TableWorkspace` holds the question's table as ``t0`` (every cell text, as in the source). Each tool reads
a named table and, when it derives one, stores it under the next name (``t1``, ``t2``, ...). The names are part of
what the agent reads, so a replay must see the ones its run saw: :meth:`TableWorkspace.reset` drops every derived
table, and the agent re-runs its prefix's calls (``TableQAAgent.rewind``) before each replay. Tool
results are short text (a preview), and bad input (an unknown table or column) comes back as an ``error:`` line
the agent can read, as a real tool's error would; a filter that matches nothing lists some values the column does
hold, as a database's hint would.

Every result is a function of the call and the table alone: rows keep their table's order (``rowid``, which a derived
table takes from the order it was made in), and every sort is a total order: ties are broken by the group's value
(``group_aggregate``) or keep the table's order (``sort_rows``). SQL leaves tied rows in any order, and a hash
aggregate's order changes from call to call; a rewind that re-ran a call whose tied rows came back in another order
refused the replay (two groups at 9.0 on WikiTableQuestions nt-1034).
"""

from __future__ import annotations

import itertools
import re
import threading
from pathlib import Path
from typing import Literal, get_args

import duckdb

from reflect_otel.demo.wtq import read_table

__all__ = ["AGGREGATES", "OPERATORS", "TableWorkspace"]

Operator = Literal["=", "!=", "contains", "starts_with", ">", ">=", "<", "<="]
Aggregate = Literal["count", "sum", "avg", "min", "max"]
OPERATORS: tuple[str, ...] = get_args(Operator)
AGGREGATES: tuple[str, ...] = get_args(Aggregate)
"""The tools' signatures carry these as enums, so a model's call (and a correction's) is held to them."""
PREVIEW_ROWS = 8
HINT_VALUES = 8
CELL_CHARS = 60


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _number(column: str) -> str:
    """A cell as a number where it reads as one ("1,912" -> 1912, "12 m" -> 12), else NULL."""
    return f"TRY_CAST(regexp_extract(replace({_quote(column)}, ',', ''), '-?[0-9]+(\\.[0-9]+)?') AS DOUBLE)"


class ToolInputError(ValueError):
    """Bad tool input; shown to the agent as an ``error:`` result."""


class TableWorkspace:
    """One question's tables in an in-memory DuckDB database. Thread-safe (one lock per workspace)."""

    def __init__(self, table: Path) -> None:
        header, rows = read_table(table)
        names: list[str] = []
        for position, raw in enumerate(header):
            name = re.sub(r"\s+", " ", raw).strip() or f"column_{position + 1}"
            while name in names:
                name += "_2"
            names.append(name)
        self.columns = {"t0": names}
        self._source = list(names)
        self._db = duckdb.connect(":memory:")
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        columns_sql = ", ".join(f"{_quote(n)} VARCHAR" for n in names)
        self._db.execute(f"CREATE TABLE t0 ({columns_sql})")
        if rows:
            self._db.executemany(f"INSERT INTO t0 VALUES ({', '.join('?' for _ in names)})", rows)

    def reset(self) -> None:
        """Back to the question's table alone: derived tables dropped, the next one named ``t1`` again."""
        with self._lock:
            for name in list(self.columns):
                if name != "t0":
                    self._db.execute(f"DROP TABLE IF EXISTS {name}")
            self.columns = {"t0": list(self._source)}
            self._counter = itertools.count(1)

    # -- helpers -------------------------------------------------------------------------------------------------
    def _table(self, table: str) -> str:
        if table not in self.columns:
            raise ToolInputError(f"no table {table!r}; tables are: {', '.join(self.columns)}")
        return table

    def _column(self, table: str, column: str) -> str:
        if column not in self.columns[table]:
            lowered = {c.lower(): c for c in self.columns[table]}
            if column.lower() in lowered:
                return lowered[column.lower()]
            raise ToolInputError(f"no column {column!r} in {table}; columns are: {', '.join(self.columns[table])}")
        return column

    def _derive(self, sql: str, params: list[object]) -> str:
        name = f"t{next(self._counter)}"
        self._db.execute(f"CREATE TABLE {name} AS {sql}", params)
        self.columns[name] = [d[0] for d in self._db.execute(f"SELECT * FROM {name} LIMIT 0").description]
        return self._describe(name)

    def _describe(self, table: str) -> str:
        count = self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
        rows = self._db.execute(f"SELECT * FROM {table} ORDER BY rowid LIMIT {PREVIEW_ROWS}").fetchall()
        lines = [f"{table}: {count} rows; columns: {', '.join(self.columns[table])}"]
        for row in rows:
            cells = ["" if v is None else " ".join(str(v).split())[:CELL_CHARS] for v in row]
            lines.append(" | ".join(cells))
        if count > PREVIEW_ROWS:
            lines.append(f"... {count - PREVIEW_ROWS} more rows")
        return "\n".join(lines)

    def _run(self, action: str, *args: object) -> str:
        with self._lock:
            try:
                return str(getattr(self, f"_{action}")(*args))
            except ToolInputError as error:
                return f"error: {error}"
            except duckdb.Error as error:
                return f"error: {action} failed: {str(error).splitlines()[0]}"

    # -- the tools -----------------------------------------------------------------------------------------------
    def describe(self, table: str = "t0") -> str:
        """Rows, columns and the first rows of a table."""
        return self._run("describe_", table)

    def _describe_(self, table: str) -> str:
        return self._describe(self._table(table))

    def filter_rows(self, table: str, column: str, op: Operator, value: str) -> str:
        """Rows of ``table`` where ``column op value``; numeric comparison for >, >=, <, <=."""
        return self._run("filter_rows", table, column, op, value)

    def _filter_rows(self, table: str, column: str, op: str, value: str) -> str:
        table = self._table(table)
        column = self._column(table, column)
        if op not in OPERATORS:
            raise ToolInputError(f"op must be one of {', '.join(OPERATORS)}")
        cell = f"lower(trim({_quote(column)}))"
        conditions: dict[str, tuple[str, list[object]]] = {
            "=": (f"{cell} = lower(trim(?))", [value]),
            "!=": (f"{cell} <> lower(trim(?))", [value]),
            "contains": (f"{cell} LIKE '%' || lower(?) || '%'", [value]),
            "starts_with": (f"{cell} LIKE lower(?) || '%'", [value]),
        }
        if op in conditions:
            where, params = conditions[op]
        else:
            try:
                number = float(value.replace(",", ""))
            except ValueError:
                raise ToolInputError(f"{op} compares numbers; {value!r} is not a number") from None
            where, params = f"{_number(column)} {op} ?", [number]  # op is one of OPERATORS: safe to inline
        result = self._derive(f"SELECT * FROM {table} WHERE {where} ORDER BY rowid", params)
        if op in conditions and result.split(":", 2)[1].strip().startswith("0 rows"):
            result += f"\n(no row matched; {self._some_values(table, column)})"  # as a database would hint
        return result

    def _some_values(self, table: str, column: str) -> str:
        found = self._db.execute(  # in the order they first appear, not a hash table's
            f"SELECT {_quote(column)} FROM {table} WHERE {_quote(column)} IS NOT NULL GROUP BY {_quote(column)} "
            f"ORDER BY min(rowid) LIMIT {HINT_VALUES + 1}"
        ).fetchall()
        values = [" ".join(str(v[0]).split())[:CELL_CHARS] for v in found[:HINT_VALUES]]
        more = ", ..." if len(found) > HINT_VALUES else ""
        return f"values of {column} in {table} include: {', '.join(repr(v) for v in values)}{more}"

    def sort_rows(self, table: str, column: str, descending: bool = False, limit: int | None = None) -> str:
        """Rows sorted by ``column`` (numerically where the cells are numbers), optionally only the first ``limit``."""
        return self._run("sort_rows", table, column, descending, limit)

    def _sort_rows(self, table: str, column: str, descending: bool, limit: int | None) -> str:
        table = self._table(table)
        column = self._column(table, column)
        direction = "DESC" if descending else "ASC"
        # ties keep the table's order (a stable sort): a total order, and the one a reader expects ("the earliest")
        order = f"{_number(column)} {direction} NULLS LAST, {_quote(column)} {direction}, rowid"
        tail = f" LIMIT {int(limit)}" if limit is not None and int(limit) > 0 else ""
        return self._derive(f"SELECT * FROM {table} ORDER BY {order}{tail}", [])

    def group_aggregate(self, table: str, group_by: str, aggregate: Aggregate, column: str | None = None) -> str:
        """One row per value of ``group_by`` with ``aggregate`` (count, sum, avg, min, max) of ``column``."""
        return self._run("group_aggregate", table, group_by, aggregate, column)

    def _group_aggregate(self, table: str, group_by: str, aggregate: str, column: str | None) -> str:
        table = self._table(table)
        group = self._column(table, group_by)
        if aggregate not in AGGREGATES:
            raise ToolInputError(f"aggregate must be one of {', '.join(AGGREGATES)}")
        if aggregate == "count":
            value = "count(*)"
        else:
            if not column:
                raise ToolInputError(f"{aggregate} needs a column")
            value = f"{aggregate}({_number(self._column(table, column))})"
        return self._derive(
            f"SELECT {_quote(group)}, {value} AS {_quote(aggregate)} FROM {table} GROUP BY {_quote(group)} "
            f"ORDER BY {_quote(aggregate)} DESC NULLS LAST, {_quote(group)} ASC NULLS LAST",  # groups are unique
            [],
        )

    def select_columns(self, table: str, columns: list[str]) -> str:
        """Only the named columns."""
        return self._run("select_columns", table, columns)

    def _select_columns(self, table: str, columns: list[str]) -> str:
        table = self._table(table)
        chosen = [self._column(table, c) for c in columns] or self.columns[table]
        return self._derive(f"SELECT {', '.join(_quote(c) for c in chosen)} FROM {table} ORDER BY rowid", [])

    def count_rows(self, table: str) -> str:
        """The number of rows."""
        return self._run("count_rows", table)

    def _count_rows(self, table: str) -> str:
        return str(self._db.execute(f"SELECT count(*) FROM {self._table(table)}").fetchone()[0])  # type: ignore[index]

    def lookup(self, table: str, column: str, row: int = 1) -> str:
        """The cell of ``column`` in the ``row``-th row (1-based)."""
        return self._run("lookup", table, column, row)

    def _lookup(self, table: str, column: str, row: int) -> str:
        table = self._table(table)
        column = self._column(table, column)
        found = self._db.execute(
            f"SELECT {_quote(column)} FROM {table} ORDER BY rowid LIMIT 1 OFFSET ?", [max(0, int(row) - 1)]
        ).fetchone()
        if found is None:
            raise ToolInputError(f"{table} has fewer than {row} rows")
        return "" if found[0] is None else str(found[0])
