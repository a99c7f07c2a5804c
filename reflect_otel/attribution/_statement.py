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
occurrences would leave a statement that fails on the other.

A name with spaces or symbols (``Train No``, ``Length (miles)``) must be quoted; :func:`bare_spellings` finds where a
statement writes one unquoted, so a correction can quote the whole name rather than one of its words."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Token",
    "TokenKind",
    "bare_spellings",
    "comparisons",
    "identifier_quote",
    "is_sql",
    "is_statement",
    "marked",
    "name_at",
    "needs_quotes",
    "qualified_start",
    "qualifier_of",
    "quote_name",
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


def is_sql(text: str) -> bool:
    """Whether ``text`` opens as a SQL statement (``SELECT ... FROM``, ``WITH ... AS``, ``UPDATE ... SET``, ...)."""
    return _STATEMENT.match(text) is not None


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


_PLAIN_NAME = re.compile(r"[^\W\d][\w$]*")


def needs_quotes(name: str) -> bool:
    """Whether ``name`` can be written in a statement only quoted: it holds a space or a symbol (``Train No``,
    ``pos.``, ``Length (miles)``)."""
    return bool(name.strip()) and _PLAIN_NAME.fullmatch(name) is None


def quote_name(name: str, quote: str) -> str:
    """``name`` as an identifier quoted with ``quote`` (``"``, ````` or ``[``)."""
    return _quoted(Token(TokenKind.QUOTED, name, 0, 0, quote), name)


def identifier_quote(text: str) -> str:
    """The quote ``text`` writes identifiers with: the one of its first quoted identifier; else ``"`` for SQL, and
    ````` for an expression that is not SQL (a pandas ``query``, where ``"x"`` would be a string)."""
    quoted = next((t for t in tokens(text) if t.kind is TokenKind.QUOTED), None)
    if quoted is not None:
        return quoted.quote
    return '"' if is_sql(text) else "`"


_PIECE = re.compile(r"\w+|[^\w\s]")


def _spelling(name: str) -> re.Pattern[str] | None:
    """A pattern for ``name`` written bare: its words and symbols in order, in any case, with any spacing between a
    symbol and its neighbours and at least one space between two words; the symbols after its last word may be left
    out (``Train No`` writes ``Train No:``)."""
    pieces = _PIECE.findall(name)
    words = [i for i, piece in enumerate(pieces) if piece[0].isalnum() or piece[0] == "_"]
    if not words:
        return None
    parts = []
    for i, piece in enumerate(pieces):
        between = "" if i == 0 else r"\s+" if i in words and i - 1 in words else r"\s*"
        parts.append(between + re.escape(piece))
    core, tail = "".join(parts[: words[-1] + 1]), "".join(parts[words[-1] + 1 :])
    return re.compile(rf"(?<![\w\"'`\[.]){core}(?:{tail})?(?!\w)", re.IGNORECASE)


def bare_spellings(text: str, name: str) -> list[tuple[int, int]]:
    """Where ``text`` writes ``name``, a name that needs quotes (:func:`needs_quotes`), unquoted: ``(start, end)`` of
    each place, in order: its words and symbols in order, in any case and spacing, the symbols after its last word
    possibly left out (``Train No`` for ``Train No:``). Never inside a quoted identifier
    or a string literal, and never a place that is one bare word: that is a name as any is written."""
    if not needs_quotes(name):
        return []
    pattern = _spelling(name)
    if pattern is None:
        return []
    text = text[:_MAX_CHARS]
    closed = [(t.start, t.end) for t in tokens(text) if t.kind in (TokenKind.QUOTED, TokenKind.LITERAL)]
    found = []
    for match in pattern.finditer(text):
        start, end = match.span()
        if _PLAIN_NAME.fullmatch(match.group()) or any(s < end and start < e for s, e in closed):
            continue
        found.append((start, end))
    return found


def qualified_start(text: str, token: Token) -> int:
    """Where the dotted name that ends in ``token`` starts (``o`` of ``o.amount``): ``token.start`` when it has no
    qualifier."""
    found = tokens(text)
    at = next((i for i, t in enumerate(found) if (t.start, t.end) == (token.start, token.end)), None)
    start = token.start
    while at is not None and at > 0 and text[found[at - 1].end : found[at].start] == ".":
        at -= 1
        start = found[at].start
    return start


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


def comparisons(text: str, *, numbers: bool = False) -> list[tuple[Token, Token]]:
    """``(field, literal)`` for each ``field <operator> literal`` in ``text`` (``"status" = 'done'``,
    ``name LIKE 'x%'``, ``city IN ('a', 'b')`` gives each literal); with ``numbers``, a number compared counts as a
    literal too (``"Tie no" = 1``)."""
    operands = (TokenKind.LITERAL, TokenKind.NUMBER) if numbers else (TokenKind.LITERAL,)
    found = []
    found_tokens = tokens(text)
    for i, token in enumerate(found_tokens):
        if token.kind not in operands:
            continue
        j = i  # in an IN list, walk back over the literals before this one
        while j > 0 and found_tokens[j - 1].kind in operands:
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
