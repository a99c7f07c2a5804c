"""A tool argument that is a statement (SQL, a query string, an expression) as tokens, so a correction can rewrite one
identifier or literal in it and keep the rest as written. A lexer, not a parser: quoted identifiers (``"x"``,
```x```, ``[x]``), string literals (``'x'``, with ``''`` inside), numbers and bare words; comparisons are read as
``field operator literal`` where a quoted or bare name meets a literal across an operator.

One identifier or literal is one reference, not one spelling: :func:`rewrite` changes the occurrence a correction
chose (the one the error marks, :func:`marked`, else the first) and the occurrences that mean the same thing, and no
other. A name means the same where it has the same qualifier and the same role: ``t.yr`` is not ``s.yr``, the alias
defined by ``AS yr`` is not the column ``yr``, the table after ``FROM yr`` is neither, and an unqualified name is
taken alone when the statement also defines an alias of that name (it may mean the alias). A literal means the same
where it is compared with the same field (``city = 'paris'`` is not ``name = 'paris'``); one compared with nothing
is taken alone. A repeated column reference (``SELECT venu ... GROUP BY venu``) moves together: rewriting one of its
occurrences would leave a statement that fails on the other."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Token",
    "TokenKind",
    "comparisons",
    "is_statement",
    "marked",
    "name_at",
    "qualifier_of",
    "rewrite",
    "tokens",
]

_MAX_CHARS = 20_000


class TokenKind(str, Enum):
    QUOTED = "quoted"
    """A quoted identifier."""
    WORD = "word"
    """A bare word: an identifier or a keyword."""
    LITERAL = "literal"
    """A string literal."""
    NUMBER = "number"


@dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    value: str
    """Unquoted."""
    start: int
    end: int
    quote: str = ""
    """The opening quote character (``"``, `````, ``[``, ``'``), "" for a bare word or number."""


_LEXER = re.compile(
    r"""(?P<dq>"(?:[^"]|"")*")|(?P<bt>`(?:[^`]|``)*`)|(?P<br>\[[^\]\n]{1,200}\])|(?P<sq>'(?:[^']|'')*')|"""
    r"""(?P<num>(?<![\w.])-?\d+(?:\.\d+)?(?![\w]))|(?P<word>[^\W\d][\w$]*)""",
    re.UNICODE,
)
_OPERATOR_WORDS = frozenset({"in", "like", "ilike", "not", "is"})
_OPERATOR = re.compile(r"^\s*(=|==|!=|<>|>=|<=|>|<|(?:not\s+)?i?like|(?:not\s+)?in\s*\(|is(?:\s+not)?)\s*$", re.I)


def tokens(text: str) -> list[Token]:
    """The tokens of ``text`` (the first 20,000 characters), in order."""
    out = []
    for match in _LEXER.finditer(text[:_MAX_CHARS]):
        group = match.lastgroup
        raw = match.group()
        if group == "dq":
            token = Token(TokenKind.QUOTED, raw[1:-1].replace('""', '"'), match.start(), match.end(), '"')
        elif group == "bt":
            token = Token(TokenKind.QUOTED, raw[1:-1].replace("``", "`"), match.start(), match.end(), "`")
        elif group == "br":
            token = Token(TokenKind.QUOTED, raw[1:-1], match.start(), match.end(), "[")
        elif group == "sq":
            token = Token(TokenKind.LITERAL, raw[1:-1].replace("''", "'"), match.start(), match.end(), "'")
        elif group == "num":
            token = Token(TokenKind.NUMBER, raw, match.start(), match.end())
        else:
            token = Token(TokenKind.WORD, raw, match.start(), match.end())
        out.append(token)
    return out


_STATEMENT = re.compile(  # a statement's opening keyword with the clause it needs
    r"\s*(?:select\b(?!\s*from\b)\s*\S.*\bfrom\b"  # something selected, then FROM
    r"|(?:with\b.*\bas|insert\s+into|update\b.*\bset|delete\s+from|(?:create|drop|alter)\s+(?:table|view|index)"
    r"|explain\s+select)\b)",
    re.IGNORECASE | re.DOTALL,
)


def is_statement(text: str) -> bool:
    """Whether ``text`` reads as a statement or expression rather than a value: three tokens or more, with an
    operator, a quote or a parenthesis between them; or a SQL statement's opening keywords (``SELECT custmer FROM
    orders`` has neither operator nor quote; "Select Committee", "Drop from the list" and "Select from the list", with
    nothing selected, are values)."""
    if len(tokens(text)) < 3:
        return False
    if re.search(r"[=<>()'\"`]", text):
        return True
    return _STATEMENT.match(text) is not None


def _quoted(token: Token, value: str) -> str:
    if token.quote == '"':
        return '"' + value.replace('"', '""') + '"'
    if token.quote == "`":
        return "`" + value.replace("`", "``") + "`"
    if token.quote == "[":
        return f"[{value}]"
    if token.quote == "'":
        return "'" + value.replace("'", "''") + "'"
    if token.kind is TokenKind.WORD and not re.fullmatch(r"[^\W\d][\w$]*", value):
        return '"' + value.replace('"', '""') + '"'  # a bare name replaced by one that needs quoting
    return value


def rewrite(text: str, token: Token, value: str) -> str:
    """``text`` with ``token`` (one of :func:`tokens` of ``text``) replaced by ``value``, quoted as the token was,
    and so are the other occurrences that mean what it means (see the module); the rest of the text as written."""
    found = tokens(text)
    same = _same_reference(text, found, token)
    out, last = [], 0
    for t in same:
        out += [text[last : t.start], _quoted(t, value)]
        last = t.end
    out.append(text[last:])
    return "".join(out)


_TABLE_WORDS = frozenset({"from", "join", "update", "into", "table"})


def _role(text: str, found: list[Token], i: int) -> tuple[str, str | None]:
    """What the name at ``found[i]`` is: an ``alias`` (after AS), a ``table`` (after FROM, JOIN, ...), a
    ``qualifier`` (before a dot) or a ``name``; with its qualifier (``t`` of ``t.yr``), None when unqualified."""
    token = found[i]
    before = found[i - 1] if i else None
    qualifier = None
    if (
        before is not None
        and text[before.end : token.start] == "."
        and before.kind in (TokenKind.WORD, TokenKind.QUOTED)
    ):
        qualifier = before.value.casefold()
    if text[token.end : token.end + 1] == ".":
        return "qualifier", qualifier
    if before is not None and before.kind is TokenKind.WORD and qualifier is None:
        if before.value.casefold() == "as":
            return "alias", None
        if before.value.casefold() in _TABLE_WORDS:
            return "table", None
    return "name", qualifier


def qualifier_of(text: str, token: Token) -> str | None:
    """The qualifier of the name ``token`` in ``text`` (``o`` of ``o.custmer``, case-folded), None when it has none."""
    found = tokens(text)
    at = next((i for i, t in enumerate(found) if (t.start, t.end) == (token.start, token.end)), None)
    return None if at is None else _role(text, found, at)[1]


def _same_reference(text: str, found: list[Token], token: Token) -> list[Token]:
    """``token`` and the occurrences of ``text`` that mean what it means (see the module), in order."""
    at = next((i for i, t in enumerate(found) if (t.start, t.end) == (token.start, token.end)), None)
    if at is None:
        return [token]
    if token.kind is TokenKind.LITERAL:
        fields = {literal.start: field for field, literal in comparisons(text)}
        field = fields.get(token.start)
        if field is None:
            return [token]
        return [
            t
            for t in found
            if t.kind is TokenKind.LITERAL
            and t.value == token.value
            and (other := fields.get(t.start)) is not None
            and other.value == field.value
        ]
    if token.kind not in (TokenKind.WORD, TokenKind.QUOTED):
        return [token]
    names = [i for i, t in enumerate(found) if t.kind in (TokenKind.WORD, TokenKind.QUOTED) and t.value == token.value]
    role = _role(text, found, at)
    if role == ("name", None) and any(_role(text, found, i)[0] == "alias" for i in names):
        return [token]  # an unqualified name that an alias of the statement also spells: it may mean the alias
    return [found[i] for i in names if _role(text, found, i) == role]


def name_at(text: str, offset: int) -> list[Token]:
    """The tokens of the (dotted) name that starts in the token at ``offset``: ``t``, ``yr`` for ``t.yr`` (an error
    marks a qualified name at its start, or underlines it whole); [] when no token is there."""
    found = tokens(text)
    at = next((i for i, t in enumerate(found) if t.start <= offset < t.end), None)
    if at is None:
        return []
    name = [found[at]]
    for token in found[at + 1 :]:
        if text[name[-1].end : token.start] != ".":
            break
        name.append(token)
    return name


_MARKED_LINE = re.compile(r"^LINE (\d+): (.*)$")


def marked(text: str, error: str) -> int | None:
    """The offset in ``text`` of what ``error`` points at, when it echoes the failing line and marks a place under
    it, as DuckDB and PostgreSQL do (``LINE 1: SELECT t.yr, s.yr ...`` over a line of spaces and ``^``; a long line
    shown cut, ``...`` before and after); None when it marks nothing in ``text``."""
    lines = error.splitlines()
    for i, line in enumerate(lines[:-1]):
        echo = _MARKED_LINE.match(line)
        caret = lines[i + 1].find("^")
        if echo is None or caret < 0 or lines[i + 1][:caret].strip():
            continue
        shown, column = echo.group(2), caret - (len(line) - len(echo.group(2)))
        if shown.startswith("..."):
            shown, column = shown[3:], column - 3
        shown = shown.removesuffix("...")
        if column < 0 or not shown.strip():
            return None
        statement_lines = text.splitlines(keepends=True)
        number = int(echo.group(1))
        if not 1 <= number <= len(statement_lines):
            return None
        line_start = sum(len(x) for x in statement_lines[: number - 1])
        within = statement_lines[number - 1].find(shown)
        return None if within < 0 else line_start + within + column
    return None


def comparisons(text: str) -> list[tuple[Token, Token]]:
    """``(field, literal)`` for each ``field <operator> literal`` in ``text`` (``"status" = 'done'``,
    ``name LIKE 'x%'``, ``city IN ('a', 'b')`` gives each literal)."""
    found = []
    found_tokens = tokens(text)
    for i, token in enumerate(found_tokens):
        if token.kind is not TokenKind.LITERAL:
            continue
        j = i  # in an IN list, walk back over the literals before this one
        while j > 0 and found_tokens[j - 1].kind is TokenKind.LITERAL:
            if text[found_tokens[j - 1].end : found_tokens[j].start].strip() != ",":
                break
            j -= 1
        k = j - 1  # the operator may be words (IN, NOT LIKE, IS NOT): the field is before them
        while k > 0 and found_tokens[k].kind is TokenKind.WORD and found_tokens[k].value.casefold() in _OPERATOR_WORDS:
            k -= 1
        if k < 0 or j == 0:
            continue
        field = found_tokens[k]
        if field.kind not in (TokenKind.QUOTED, TokenKind.WORD) or field.value.casefold() in _OPERATOR_WORDS:
            continue
        if _OPERATOR.match(text[field.end : found_tokens[j].start]):
            found.append((field, token))
    return found
