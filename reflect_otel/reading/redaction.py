"""Secrets out of trace text before anything is written, sent or shown to the auditor.

Assembly passes every text of a trace (question, answer, reasoning, tool arguments and results, model input,
status messages) through a :class:`Redactor`; each match becomes ``[REDACTED:<kind>]`` and the trace says how many
were redacted. The defaults catch what leaks most: bearer tokens, ``sk-...`` API keys, AWS access keys and secret
keys, passwords in URLs. ``REFLECT_REDACT_PATTERNS`` adds patterns: a JSON list of regular expressions (each match
is replaced whole). What no pattern names is not found: redaction lowers the risk, it does not prove absence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from reflect_otel.errors import ConfigError
from reflect_otel.settings import settings

__all__ = ["DEFAULT_PATTERNS", "REDACT_PATTERNS_ENV", "Redactor", "default_redactor"]

REDACT_PATTERNS_ENV = "REFLECT_REDACT_PATTERNS"

DEFAULT_PATTERNS: Mapping[str, str] = {
    "bearer_token": r"(?i)(?<=\bbearer )[A-Za-z0-9._~+/-]{8,}=*",
    "api_key": r"\bsk-[A-Za-z0-9_-]{16,}",
    "aws_access_key": r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    "aws_secret_key": r"(?i)aws_secret_access_key[\"']?\s*[=:]\s*[\"']?(?P<secret>[A-Za-z0-9/+=]{40})",
    "url_password": r"(?<=://)[^\s:/@]+:[^\s@/]+(?=@)",
}
"""kind -> pattern; the match is replaced, or only its group ``secret`` when it has one (lookarounds and that
group keep the words around a secret readable)."""

_DEFAULT_TRIGGERS = ("earer ", "EARER ", "sk-", "AKIA", "ASIA", "_access_key", "_ACCESS_KEY", "://")
"""Each default pattern needs one of these in its usual spellings (Bearer/bearer/BEARER, aws_secret_access_key
lower or upper case): text holding none is skipped with a few substring scans instead of five regexes, and that
is nearly all text. A mixed-case spelling such as ``Aws_Secret_Access_Key`` is therefore not caught."""


def _may_hold_default_secret(text: str) -> bool:
    return any(trigger in text for trigger in _DEFAULT_TRIGGERS)


@dataclass(frozen=True, slots=True)
class Redactor:
    """Replaces every match of its patterns; ``redact`` returns the new text and how many matches it replaced."""

    patterns: tuple[tuple[str, re.Pattern[str]], ...]
    defaults: frozenset[str] = frozenset()
    """The kinds that are default patterns (gated by ``_DEFAULT_TRIGGER``)."""

    @classmethod
    def of(cls, patterns: Mapping[str, str]) -> Redactor:
        compiled = []
        for kind, pattern in patterns.items():
            try:
                compiled.append((kind, re.compile(pattern)))
            except re.error as error:
                raise ConfigError(f"redaction pattern {kind!r} is not a valid regular expression: {error}") from None
        defaults = frozenset(k for k in patterns if DEFAULT_PATTERNS.get(k) == patterns[k])
        return cls(tuple(compiled), defaults)

    def redact(self, text: str) -> tuple[str, int]:
        total = 0
        skip_defaults = bool(self.defaults) and not _may_hold_default_secret(text)
        for kind, pattern in self.patterns:
            if skip_defaults and kind in self.defaults:
                continue
            mark = f"[REDACTED:{kind}]"
            if "secret" in pattern.groupindex:
                text, count = pattern.subn(lambda m, mark=mark: _replace_group(m, mark), text)  # type: ignore[misc]
            else:
                text, count = pattern.subn(mark, text)
            total += count
        return text, total

    def redact_value(self, value: Any) -> tuple[Any, int]:
        """Strings inside JSON-like values (tool arguments), keys kept."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            out, total = {}, 0
            for key, item in value.items():
                out[key], count = self.redact_value(item)
                total += count
            return out, total
        if isinstance(value, list | tuple):
            items, total = [], 0
            for item in value:
                redacted, count = self.redact_value(item)
                items.append(redacted)
                total += count
            return items, total
        return value, 0


def _replace_group(match: re.Match[str], mark: str) -> str:
    whole, start = match.group(0), match.start()
    return whole[: match.start("secret") - start] + mark + whole[match.end("secret") - start :]


def _user_patterns(raw: str) -> dict[str, str]:
    try:
        patterns = json.loads(raw)
    except ValueError:
        patterns = None
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(
            f'{REDACT_PATTERNS_ENV} must be a JSON list of regular expressions, e.g. ["ghp_[A-Za-z0-9]{{36}}"]'
        )
    return {f"custom_{i + 1}": p for i, p in enumerate(patterns)}


@lru_cache(maxsize=8)
def _redactor_for(raw: str) -> Redactor:
    return Redactor.of({**DEFAULT_PATTERNS, **(_user_patterns(raw) if raw.strip() else {})})


def default_redactor() -> Redactor:
    """The defaults, plus the patterns of ``REFLECT_REDACT_PATTERNS``."""
    return _redactor_for(settings().redact_patterns)
