"""A tool argument that is a statement (SQL, a query string, an expression) as tokens, so a correction can rewrite one
identifier or literal in it and keep the rest as written. A lexer, not a parser: quoted identifiers (``"x"``,
```x```, ``[x]``), string literals (``'x'``, with ``''`` inside), numbers and bare words; comparisons are read as
``field operator literal`` where a quoted or bare name meets a literal across an operator."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = ["Token", "TokenKind", "comparisons", "is_statement", "rewrite", "tokens"]

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


def is_statement(text: str) -> bool:
    """Whether ``text`` reads as a statement or expression rather than a value: three tokens or more, with an
    operator, a quote or a parenthesis between them."""
    return len(tokens(text)) >= 3 and bool(re.search(r"[=<>()'\"`]", text))


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
    """``text`` with ``token`` (and every other token of the same kind and value) replaced by ``value``, quoted as
    the token was; the rest of the text as written."""
    same = [
        t
        for t in tokens(text)
        if t.value == token.value
        and (t.kind is token.kind or {t.kind, token.kind} <= {TokenKind.QUOTED, TokenKind.WORD})
    ]
    out, last = [], 0
    for t in same:
        out += [text[last : t.start], _quoted(t, value)]
        last = t.end
    out.append(text[last:])
    return "".join(out)


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
