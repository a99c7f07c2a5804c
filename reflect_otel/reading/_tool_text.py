"""Reading what tools answer, as any tool writes it: JSON objects and arrays, library error messages (DuckDB,
PostgreSQL, SQLite, Python exceptions, HTTP problem+json) and prose. No LLM; every function is bounded in the text it
reads and never raises on content.

What the evidence checks and the correction rules ask of a tool result:

- :func:`reads_as_error`: the call failed (an error line as a library writes it, an exception, an object whose
  ``error`` says so, a problem+json body with an error status);
- :func:`reads_as_empty`: it succeeded and returned nothing (``[]``, an object whose row set is empty or whose count
  is 0, ``0 rows``);
- :func:`hints`: the values it offers instead (keys naming the available, valid or existing values; ``Candidate
  bindings:``, ``Did you mean``, ``HINT: Perhaps you meant``; prose such as ``must be one of a, b``);
- :func:`named`: what an error names as wrong (``column "x" does not exist``, ``no such column: x``);
- :func:`shown_fields`: the data a result shows, field by field (JSON rows, ``columns`` + ``rows``, Markdown tables),
  and :func:`shown_kinds`: whether a field holds text or numbers (JSON cell types, a schema's column types);
- :func:`shown_tables`, :func:`row_counts`: the tables a result names and how many rows it says they have, and
  :func:`stated_size`: how many items an error says there are (``out of bounds for axis 0 with size 10``);
- :func:`type_clash`: what an error says about a value compared with a field of the other type (DuckDB's
  ``Could not convert string``, PostgreSQL's ``operator does not exist: text = integer``, pandas' ``Invalid
  comparison between dtype=int64 and str``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "HEAD_CHARS",
    "Kind",
    "TypeClash",
    "hints",
    "listed_in_prose",
    "messages",
    "named",
    "parsed",
    "reads_as_empty",
    "reads_as_error",
    "row_counts",
    "shown_fields",
    "shown_kinds",
    "shown_names",
    "shown_tables",
    "stated_size",
    "type_clash",
    "type_kind",
]

HEAD_CHARS = 4000
"""Only the head of a result is read for hints and names: they come with the failure, and rules must stay cheap."""
_MAX_JSON_CHARS = 200_000
_MAX_DEPTH = 4
_MAX_OPTIONS = 100
_MAX_OPTION_CHARS = 80
_MAX_ROWS = 200

# -- JSON -------------------------------------------------------------------------------------------------------
_HINT_KEY = re.compile(
    r"avail|valid|exist|allow|known|support|possib|suggest|candidat|did.?you.?mean|option|choice|alternativ|"
    r"similar|closest|nearest|expected|accepted|permitted|hint",
    re.IGNORECASE,
)
"""Keys whose values are the values a tool offers instead of the one it was given."""
_ERROR_KEYS = frozenset({"error", "errors", "exception", "error_message", "errormessage", "fault"})
_COUNTED = r"(?:rows?|results?|items?|hits|records?|matches|documents?|docs|entries|objects)"
_COUNT_KEY = re.compile(
    rf"n|count|total|total_count|num_found|hits|matches|(?:n|num|total)_{_COUNTED}|{_COUNTED}_?count", re.IGNORECASE
)
"""Keys (whole, camelCase read as snake_case) whose number counts the rows a result holds: ``count``, ``total``,
``row_count``, ``n_rows``, ``totalCount``, ``num_found``; not ``error_count``, ``retries`` or ``discount``."""
_NOT_DATA_KEY = re.compile(
    r"columns?|fields?|headers?|schema|(?:column|col|field)_?(?:names|types)|names|keys|d?types|description|"
    r"warnings?|messages?|notices?|notes|links|_links|errors",
    re.IGNORECASE,
)
"""Keys whose arrays describe a result (its columns, schema, warnings), not the rows it holds."""


def parsed(text: str | None) -> Any | None:
    """``text`` as a JSON object or array (None for anything else, or over 200,000 characters)."""
    if not text:
        return None
    stripped = text.strip()
    if not stripped.startswith(("{", "[")) or len(stripped) > _MAX_JSON_CHARS:
        return None
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict | list) else None


def _truthy(value: Any) -> bool:
    return value not in (None, False, "", [], {}, 0)


def _json_error(value: Any) -> bool:
    """An object that reports a failure: a truthy ``error``-like key, ``ok``/``success`` false with a message, or an
    HTTP problem (RFC 9457: ``title`` or ``detail`` with a ``status`` of 400 or more)."""
    if not isinstance(value, dict):
        return False
    keys = {str(k).casefold(): v for k, v in value.items()}
    if any(_truthy(keys.get(k)) for k in _ERROR_KEYS):
        return True
    if (keys.get("ok") is False or keys.get("success") is False) and any(
        _truthy(keys.get(k)) for k in ("message", "detail", "reason", "msg")
    ):
        return True
    status = keys.get("status", keys.get("status_code", keys.get("code")))
    return (
        isinstance(status, int)
        and not isinstance(status, bool)
        and 400 <= status < 600
        and any(isinstance(keys.get(k), str) for k in ("title", "detail", "message"))
    )


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).casefold()


def _count(key: str, value: Any) -> int | None:
    """The number a count key holds (``{"total": {"value": 0}}`` as Elasticsearch writes it too), else None."""
    if not _COUNT_KEY.fullmatch(key):
        return None
    if isinstance(value, dict):
        value = value.get("value")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _row_sets(value: dict[Any, Any], data: list[list[Any]], counts: list[int], depth: int = 0) -> None:
    """The arrays of data in ``value`` and its nested objects (not those naming hints, columns or a schema), and
    the numbers of its count keys."""
    if depth > _MAX_DEPTH:
        return
    for raw, item in list(value.items())[:_MAX_OPTIONS]:
        key = _snake(str(raw))
        if _HINT_KEY.search(key) or _NOT_DATA_KEY.fullmatch(key):
            continue
        count = _count(key, item)
        if count is not None:
            counts.append(count)
        elif isinstance(item, list):
            data.append(item)
        elif isinstance(item, dict):
            _row_sets(item, data, counts, depth + 1)


def _json_empty(value: Any) -> bool:
    """An empty array; or an object (not an error) whose arrays of data are all empty (``{"rows": []}``,
    ``{"columns": [...], "rows": []}``, ``{"hits": {"total": 0, "hits": []}}``). The arrays decide; only an object
    with no array of data is read by its counts (``{"count": 0}``)."""
    if isinstance(value, list):
        return not value
    if not isinstance(value, dict) or _json_error(value):
        return False
    data: list[list[Any]] = []
    counts: list[int] = []
    _row_sets(value, data, counts)
    if data:
        return all(not rows for rows in data)
    return bool(counts) and all(c == 0 for c in counts)


# -- library and prose errors -------------------------------------------------------------------------------------
_ERROR_START = re.compile(
    r"^\s*[\[(]?(error|exception|traceback|failed|failure|invalid|not found|no such|unknown|denied|forbidden|"
    r"timed? ?out|unauthori[sz]ed|cannot|could not|unable to)\b",
    re.IGNORECASE,
)
_LIBRARY_ERROR = re.compile(
    # DuckDB "Binder Error: ...", psql "ERROR:  ...", a Python exception "ValueError: ..." or
    # "psycopg.errors.UndefinedColumn: ...", a traceback anywhere
    r"^\s*(?:[A-Z][A-Za-z]*(?: [A-Z][A-Za-z]*)* Error|ERROR|FATAL|[\w.]+\.[A-Z]\w+|[A-Z]\w*(?:Error|Exception|Warning))"
    r": |Traceback \(most recent call last\)|\b[A-Z]\w*(?:Error|Exception): ",
    re.MULTILINE,
)
_ERROR_PHRASE = re.compile(
    r"\b(does not exist|syntax error|not found|no such \w+|is not defined|permission denied|not allowed|"
    r"validation errors? for|out of range|out of bounds|out-of-bounds|has fewer than \d+ rows|"
    r"not supported between instances of|invalid comparison between|cannot compare values|invalid input syntax|"
    r"unknown (?:column|table|field|function|key|parameter|argument))\b",
    re.IGNORECASE,
)
_SQL_CONTEXT = re.compile(r"^LINE \d+:", re.MULTILINE)


def reads_as_error(result: str | None) -> bool:
    """Whether a tool result reads as a failed call (see the module)."""
    if not result:
        return False
    value = parsed(result)
    if value is not None:
        return _json_error(value)
    head = result[:HEAD_CHARS]
    first = head.strip().split("\n", 1)[0]
    return bool(
        _ERROR_START.match(head)
        or _LIBRARY_ERROR.search(head)
        or _SQL_CONTEXT.search(head)
        or (len(first) <= 300 and _ERROR_PHRASE.search(first))
    )


_EMPTY_VALUES = frozenset({"", "[]", "{}", "()", "null", "none", "nil", '""', "''", "nan", "n/a", "undefined"})
_EMPTY_TEXT = re.compile(
    r"\b0 (rows?|results?|items?|matches|records?|hits|documents?|entries)\b|"
    r"\bno (rows?|results?|items?|matches|records?|hits|documents?|entries|data)\b[^.\n]{0,20}\b"
    r"(found|matched|returned|available)\b|\bnothing (was )?found\b|\bempty (result|response|list|table)\b",
    re.IGNORECASE,
)


def reads_as_empty(result: str | None) -> bool:
    """Whether a (successful) tool result returned nothing (see the module)."""
    if result is None:
        return False
    stripped = result.strip()
    if stripped.lower() in _EMPTY_VALUES:
        return True
    value = parsed(stripped)
    if value is not None:
        return _json_empty(value)
    return bool(_EMPTY_TEXT.search(stripped[:300]))


# -- hints ----------------------------------------------------------------------------------------------------------
_LISTING = re.compile(
    r"(?P<lead>[^\n;:?]{0,80}?)\b(?:include|includes|are|were|(?:is |must be |should be )?one of|should be|must be|"
    r"available|valid(?: \w+)?|allowed|"
    r"expected|options|choices|did you mean|possible values?|known(?: \w+)?|supported(?: \w+)?|such as|"
    r"candidate bindings|candidates|perhaps you meant(?: to reference the \w+)?|maybe you meant|similar(?: \w+)?)\b"
    r"\s*[:?]?\s*\[?(?P<items>[^\n;)\[\]]+)",
    re.IGNORECASE,
)
_QUOTED_ITEM = re.compile(r"'([^'\n]{1,80})'|\"([^\"\n]{1,80})\"|`([^`\n]{1,80})`")
_SPLIT = re.compile(r"\s*(?:,|\||\bor\b)\s*")


def listed_in_prose(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every list of values prose offers, with the words that introduce it: ``values of X include: 'a', 'b'``,
    ``columns are: a, b``, ``must be one of a, b``, ``did you mean 'a'?``, ``Candidate bindings: "a", "b"``.
    Quoted items when the list quotes them."""
    found = []
    for match in _LISTING.finditer(text[:HEAD_CHARS]):
        items = match.group("items")
        quoted = [next(g for g in groups if g) for groups in _QUOTED_ITEM.findall(items)]
        if quoted:
            options = quoted
        else:
            options = [o.strip(" .'\"`[]{}") for o in _SPLIT.split(items)]
            if len(options) < 2:  # an unquoted single word after "are" is prose, not a list
                continue
        kept = _kept(options)
        if kept:
            found.append((match.group("lead"), kept))
    return found


def _kept(options: Iterator[str] | list[str]) -> tuple[str, ...]:
    out = dict.fromkeys(o for o in options if o and o != "..." and len(o) <= _MAX_OPTION_CHARS)
    return tuple(out)[:_MAX_OPTIONS]


def _walk(value: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """``(key, value)`` of every member of nested objects (arrays walked through), to a bounded depth."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, dict):
        for key, item in list(value.items())[:_MAX_OPTIONS]:
            yield str(key), item
            yield from _walk(item, depth + 1)
    elif isinstance(value, list):
        for item in value[:_MAX_OPTIONS]:
            yield from _walk(item, depth + 1)


def _scalars(value: Any) -> list[str]:
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, list):
        return [str(v) for v in value if isinstance(v, str | int | float) and not isinstance(v, bool)]
    return []


def hints(result: str | None) -> list[tuple[str, tuple[str, ...]]]:
    """The values a tool result offers instead of the one it was given, each list with the words that introduce it
    (a JSON key such as ``valid_columns``, or prose): from JSON keys that name hints and from every text in it."""
    if not result:
        return []
    value = parsed(result)
    if value is None:
        return listed_in_prose(result)
    found: list[tuple[str, tuple[str, ...]]] = []
    for key, item in _walk(value):
        if _HINT_KEY.search(key):
            options = _kept(
                [v for v in _scalars(item)] or [str(k) for k in item] if isinstance(item, dict) else _scalars(item)
            )
            if options:
                found.append((key.replace("_", " ").replace("-", " "), options))
        elif isinstance(item, str):
            found += listed_in_prose(item)
    return found


_QUOTED_NAME = re.compile(r"\"([^\"\n]{1,80})\"|'([^'\n]{1,80})'|`([^`\n]{1,80})`")
_TRAILING_NAME = re.compile(r"\b(?:column|table|field|function|key|name|relation|attribute)s?:?\s+([\w.$-]{1,80})\s*$")
_SYNTAX_ERROR = re.compile(r"\bsyntax error\b", re.IGNORECASE)
_MISSING_NAME = re.compile(r"\b(?:column|table|relation|function)\s+([\w.$]{1,80})\s+does not exist\b")
"""PostgreSQL names an unquoted name bare: ``column o.custmer does not exist``."""


def _marker(line: str) -> bool:
    """A line that only marks a place in the line above it (``^^^``, ``~~~``)."""
    return bool(line) and set(line) <= {"^", " ", "~"}


def messages(result: str | None) -> list[str]:
    """The texts a result holds: the strings of a JSON result, else its head."""
    if not result:
        return []
    value = parsed(result)
    return [item for _, item in _walk(value) if isinstance(item, str)] if value is not None else [result[:HEAD_CHARS]]


def named(result: str | None) -> list[str]:
    """What an error names as wrong: the quoted names of its message lines (``column "x" does not exist``), or the
    name ending its first line (``no such column: x``, ``Table with name x does not exist!``), or the bare name
    PostgreSQL says does not exist (``column o.x does not exist``). The lines that echo the statement (``LINE 1:
    ...`` and its marker, Python's ``File "..."`` and the code line over its ``^``), the lines that offer
    alternatives and a syntax error's lines (``syntax error at or near "No"`` says where parsing stopped, not what
    name is wrong) are not read."""
    names: list[str] = []
    for text in messages(result):
        lines = text.splitlines()[:6]
        for i, line in enumerate(lines):
            stripped = line.strip()
            if not stripped or _SQL_CONTEXT.match(stripped) or _marker(stripped) or stripped.startswith('File "'):
                continue
            if (i + 1 < len(lines) and _marker(lines[i + 1].strip())) or _SYNTAX_ERROR.search(stripped):
                continue  # a line echoed over its marker; "at or near "No"": where parsing stopped, not a name
            offered = _LISTING.search(stripped)
            if offered is not None:  # "Did you mean ...", "Candidate bindings: ...": alternatives, not the wrong name
                stripped = stripped[: offered.end("lead")]
            quoted = [next(g for g in groups if g) for groups in _QUOTED_NAME.findall(stripped)]
            names += quoted
            if not quoted:
                trailing = _TRAILING_NAME.search(stripped.rstrip("!. ")) or _MISSING_NAME.search(stripped)
                if trailing:
                    names.append(trailing.group(1))
                elif " with name " in stripped:
                    names.append(stripped.split(" with name ", 1)[1].split()[0])
    return list(dict.fromkeys(n for n in names if n.strip()))


# -- data shown -----------------------------------------------------------------------------------------------------
_RULE_LINE = re.compile(r"^\s*\|?\s*:?-{3,}")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _markdown(text: str) -> Iterator[dict[str, list[str]]]:
    lines = text[: HEAD_CHARS * 4].splitlines()
    for i, line in enumerate(lines):
        if "|" not in line or i + 1 >= len(lines) or not _RULE_LINE.match(lines[i + 1]):
            continue
        header = _cells(line)
        if len(header) < 2 or len(set(header)) != len(header):
            continue
        rows = []
        for row_line in lines[i + 2 : i + 2 + _MAX_ROWS]:
            row = _cells(row_line)
            if "|" not in row_line or len(row) != len(header):
                break
            rows.append(row)
        if rows:
            yield {name: [row[j] for row in rows] for j, name in enumerate(header)}


def _json_tables(value: Any) -> Iterator[dict[str, list[str]]]:
    """Arrays of row objects, and ``{"columns": [...], "rows": [[...], ...]}``, anywhere in ``value``."""
    candidates = [value, *(item for _, item in _walk(value))]
    for item in candidates:
        if isinstance(item, list) and item and all(isinstance(r, dict) for r in item[:_MAX_ROWS]):
            fields: dict[str, list[str]] = {}
            for row in item[:_MAX_ROWS]:
                for key, cell in row.items():
                    if isinstance(cell, str | int | float) and not isinstance(cell, bool):
                        fields.setdefault(str(key), []).append(str(cell))
            if fields:
                yield fields
        elif isinstance(item, dict) and isinstance(item.get("columns"), list) and isinstance(item.get("rows"), list):
            header = [c if isinstance(c, str) else str((c or {}).get("name", "")) for c in item["columns"]]
            rows = [r for r in item["rows"][:_MAX_ROWS] if isinstance(r, list) and len(r) == len(header)]
            if rows and all(header):
                yield {name: [str(r[j]) for r in rows if r[j] is not None] for j, name in enumerate(header)}


def shown_fields(text: str | None) -> dict[str, list[str]]:
    """The values ``text`` shows under each field name (JSON rows, ``columns`` + ``rows``, Markdown tables),
    distinct, in the order shown."""
    if not text:
        return {}
    value = parsed(text)
    tables = list(_json_tables(value)) if value is not None else list(_markdown(text))
    out: dict[str, list[str]] = {}
    for table in tables:
        for name, cells in table.items():
            out.setdefault(name, [])
            out[name] += [c for c in cells if c not in out[name]]
    return out


def shown_names(text: str | None) -> list[str]:
    """The field names ``text`` shows: those of its rows, and a schema's ``columns`` (names, or objects with a
    ``name``)."""
    names = list(shown_fields(text))
    value = parsed(text)
    for key, item in _walk(value) if value is not None else ():
        if key.casefold() in ("columns", "fields") and isinstance(item, list):
            for column in item[:_MAX_OPTIONS]:
                name = column if isinstance(column, str) else column.get("name") if isinstance(column, dict) else None
                if isinstance(name, str) and name and name not in names:
                    names.append(name)
    return names


Kind = Literal["number", "text"]
"""What a field holds, as far as a comparison is concerned."""

_NUMBER_TYPE = re.compile(
    r"(?:u?(?:tiny|small|medium|big|huge)?int(?:eger)?\d*|float\d*|double(?: precision)?|real|numeric|decimal|"
    r"number)\b",
    re.IGNORECASE,
)
_TEXT_TYPE = re.compile(
    r"(?:varchar|character varying|nvarchar|text|char(?:acter)?|bpchar|string|str|object)\b", re.IGNORECASE
)
_SCHEMA_KEYS = frozenset({"columns", "fields", "schema"})
_TYPE_KEYS = ("type", "dtype", "data_type")


def type_kind(name: str) -> Kind | None:
    """The kind a type name gives its values: ``number`` for ``INTEGER``, ``INT32``, ``int64``, ``DOUBLE``,
    ``numeric``; ``text`` for ``VARCHAR``, ``text``, ``character varying``, ``str``, ``object``; None for the rest
    (dates, booleans)."""
    name = name.strip()
    if _NUMBER_TYPE.match(name):
        return "number"
    return "text" if _TEXT_TYPE.match(name) else None


def _cell_kind(cell: Any) -> Kind | None:
    if isinstance(cell, bool) or cell is None:
        return None
    if isinstance(cell, int | float):
        return "number"
    return "text" if isinstance(cell, str) else None


def shown_kinds(text: str | None) -> dict[str, set[Kind]]:
    """The kinds of value (``number``, ``text``) ``text`` shows under each field: the JSON types of its rows' cells
    (``"1"`` is text, ``1`` a number), the types a schema gives its columns (``{"columns": [{"name": "amount",
    "type": "INTEGER"}]}``) and a ``dtypes`` object. Markdown tables and prose tell no kind."""
    value = parsed(text)
    if value is None:
        return {}
    out: dict[str, set[Kind]] = {}

    def add(name: Any, kind: Kind | None) -> None:
        if kind is not None:
            out.setdefault(str(name), set()).add(kind)

    for key, item in [("", value), *_walk(value)]:
        if key.casefold() in _SCHEMA_KEYS and isinstance(item, list):
            for column in item[:_MAX_OPTIONS]:
                if isinstance(column, dict) and isinstance(column.get("name"), str):
                    declared = next((column[k] for k in _TYPE_KEYS if isinstance(column.get(k), str)), None)
                    add(column["name"], type_kind(declared) if declared else None)
        elif key.casefold() in ("dtypes", "types", "column_types") and isinstance(item, dict):
            for name, declared in list(item.items())[:_MAX_OPTIONS]:
                add(name, type_kind(declared) if isinstance(declared, str) else None)
        elif isinstance(item, list) and item and all(isinstance(r, dict) for r in item[:_MAX_ROWS]):
            for row in item[:_MAX_ROWS]:
                for name, cell in row.items():
                    add(name, _cell_kind(cell))
        elif isinstance(item, dict) and isinstance(item.get("columns"), list) and isinstance(item.get("rows"), list):
            header = [c if isinstance(c, str) else str((c or {}).get("name", "")) for c in item["columns"]]
            for row in item["rows"][:_MAX_ROWS]:
                if isinstance(row, list) and len(row) == len(header):
                    for name, cell in zip(header, row, strict=True):
                        add(name, _cell_kind(cell))
    return out


_TABLE_KEYS = ("table", "table_name", "tablename", "relation", "dataframe")
_ROWS_KEY = re.compile(r"(?:n_?|num_?|total_?)?rows|rows?_?count|rowcount", re.IGNORECASE)
"""Keys (whole) whose number is how many rows a table or result has: ``row_count``, ``n_rows``, ``num_rows``,
``rows``; not ``count`` or ``total``, which rows of data use as fields."""
_ROWS_LINE = re.compile(r"^\s*([\w.$-]{1,80}):\s+(\d[\d,]*)\s+rows?\b", re.MULTILINE)
"""A result that opens with a table's name and its size: ``t0: 10 rows; columns: ...``."""
_ROWS_FOOTER = re.compile(r"^\s*\((\d[\d,]*) rows?\)\s*$", re.MULTILINE)
"""psql's footer: ``(10 rows)``."""


def _table_of(value: dict[Any, Any]) -> str | None:
    return next((v for k in _TABLE_KEYS if isinstance(v := value.get(k), str) and v), None)


def _json_counts(value: Any, out: list[tuple[str | None, int]], depth: int = 0) -> None:
    """The row counts of ``value``'s objects, not of the rows inside its arrays (a row's ``rows`` field is data)."""
    if depth > _MAX_DEPTH or not isinstance(value, dict):
        return
    table = _table_of(value)
    for raw, item in list(value.items())[:_MAX_OPTIONS]:
        key = _snake(str(raw))
        if _ROWS_KEY.fullmatch(key) and isinstance(item, int) and not isinstance(item, bool):
            out.append((table, item))
        elif key == "shape" and isinstance(item, list) and item and type(item[0]) is int:
            out.append((table, item[0]))  # a DataFrame's (rows, columns)
        elif isinstance(item, dict):
            _json_counts(item, out, depth + 1)


def row_counts(text: str | None) -> list[tuple[str | None, int]]:
    """How many rows ``text`` says a table or result has, with the table's name where it gives one: ``t0: 10 rows``,
    ``{"table": "data", "row_count": 10}``, ``{"shape": [10, 3]}`` (a DataFrame's), psql's ``(10 rows)``."""
    if not text:
        return []
    value = parsed(text)
    if value is not None:
        found: list[tuple[str | None, int]] = []
        _json_counts(value, found)
        return found
    head = text[:HEAD_CHARS]
    named_counts: list[tuple[str | None, int]] = [
        (m.group(1), int(m.group(2).replace(",", ""))) for m in _ROWS_LINE.finditer(head)
    ]
    return named_counts + [(None, int(m.group(1).replace(",", ""))) for m in _ROWS_FOOTER.finditer(head)]


def shown_tables(text: str | None) -> list[str]:
    """The table names ``text`` shows: a JSON ``table`` or ``table_name`` and a ``tables`` list (of names, or of
    objects with a ``name``), and the name opening a result such as ``t0: 10 rows``."""
    if not text:
        return []
    value = parsed(text)
    if value is None:
        return list(dict.fromkeys(name for name, _ in row_counts(text) if name))
    names: list[str] = []
    for key, item in [("", value), *_walk(value)]:
        if isinstance(item, dict) and (table := _table_of(item)):
            names.append(table)
        if key.casefold() == "tables" and isinstance(item, list):
            for table in item[:_MAX_OPTIONS]:
                name = table if isinstance(table, str) else table.get("name") if isinstance(table, dict) else None
                if isinstance(name, str) and name:
                    names.append(name)
    return list(dict.fromkeys(names))


_SIZE = re.compile(
    r"\bwith size (\d+)|\((\d+) (?:items?|rows?|elements?|entries|records?)\)"
    r"|\bhas (?:only )?(\d+) (?:items?|rows?|elements?|entries|records?)\b|\b(?:length|size|len) (?:is |of )?(\d+)\b",
    re.IGNORECASE,
)


def stated_size(text: str | None) -> int | None:
    """How many items or rows an error says there are: numpy's ``index 26 is out of bounds for axis 0 with size
    10``, ``index 26 out of range (10 items)``, ``the table has 10 rows``; None when it says no number (``fewer than
    26 rows`` bounds the size, it does not say it)."""
    for message in messages(text):
        match = _SIZE.search(message)
        if match:
            return int(next(g for g in match.groups() if g))
    return None


@dataclass(frozen=True, slots=True)
class TypeClash:
    """What an error says of a value compared with a field of the other type. ``field_kind`` is what the field
    holds; ``column`` the field when the error names it; ``value`` the value the error could not read as the
    field's type (a literal of the call, or a cell of the data when ``column`` is given)."""

    field_kind: Kind | None
    column: str | None = None
    value: str | None = None


_CONVERT = re.compile(r"Could not convert string '(.*)' to (\w+)(?: when casting from source column (.+?))?\s*$")
_COMPARE = re.compile(r"Cannot compare values of type (\w[\w ]*?) and type (\w+)")
_OPERATOR_TYPES = re.compile(r"operator does not exist: (\w[\w ]*?) (?:=|<>|!=|<=|>=|<|>|~~\*?|!~~\*?) (\w[\w ]*)")
_INPUT_SYNTAX = re.compile(r'invalid input syntax for type ([\w ]+): "(.*)"')
_DTYPE_COMPARISON = re.compile(r"Invalid comparison between dtype=(\w+) and (\w+)")
_NOT_SUPPORTED = re.compile(r"'\S+' not supported between instances of '(\w+)' and '(\w+)'")
_LITERAL_VALUE = re.compile(
    r"invalid literal for (?:int|float)\(\)(?: with base \d+)?: '(.*)'|could not convert string to float: '(.*)'"
)


def type_clash(result: str | None) -> TypeClash | None:
    """What an error says of a comparison of values of two types, read from DuckDB (``Could not convert string
    'Replay' to INT32 when casting from source column Tie no``: the column holds text; without the column: the
    literal is not a number; ``Cannot compare values of type VARCHAR and type INTEGER_LITERAL``), PostgreSQL
    (``operator does not exist: text = integer``; ``invalid input syntax for type integer: "abc"``), pandas
    (``Invalid comparison between dtype=int64 and str``), Python (``'>' not supported between instances of 'str' and
    'int'``, ``invalid literal for int() with base 10: 'abc'``); None for any other error."""
    for text in messages(result):
        line = text.strip().split("\n", 1)[0]
        if match := _CONVERT.search(line):
            if match.group(3):
                return TypeClash("text", column=match.group(3).strip().strip('"'), value=match.group(1))
            return TypeClash("number", value=match.group(1))
        if match := _COMPARE.search(line) or _OPERATOR_TYPES.search(line):
            return TypeClash(type_kind(match.group(1)))
        if match := _INPUT_SYNTAX.search(line):
            return TypeClash(type_kind(match.group(1)), value=match.group(2))
        if match := _DTYPE_COMPARISON.search(line) or _NOT_SUPPORTED.search(line):
            return TypeClash(type_kind(match.group(1)))
        if match := _LITERAL_VALUE.search(line):
            return TypeClash("number", value=match.group(1) if match.group(1) is not None else match.group(2))
    return None
