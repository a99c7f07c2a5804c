"""Secrets are redacted from every text of a trace before it is stored, sent or shown to the auditor: one test
per default pattern, user patterns, tool arguments, and the count on the trace."""

from __future__ import annotations

import pytest

from reflect_otel.errors import ConfigError
from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.redaction import Redactor, default_redactor
from reflect_otel.trace import WarningCode
from tests.spans import agent_root, llm, tool


@pytest.mark.parametrize(
    ("text", "secret", "kind"),
    [
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def", "eyJhbGciOiJIUzI1NiJ9.abc.def", "bearer_token"),
        ("use key sk-proj-AbCdEf0123456789xyz to call", "sk-proj-AbCdEf0123456789xyz", "api_key"),
        ("id AKIAIOSFODNN7EXAMPLE in the config", "AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
        (
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "aws_secret_key",
        ),
        ("connect to postgres://admin:hunter2@db.internal/app", "admin:hunter2", "url_password"),
    ],
)
def test_each_default_pattern(text: str, secret: str, kind: str) -> None:
    redacted, count = default_redactor().redact(text)
    assert secret not in redacted and f"[REDACTED:{kind}]" in redacted and count == 1
    assert redacted.split("[REDACTED")[0] == text.split(secret)[0]  # the words around it stay readable


def test_ordinary_text_is_left_alone() -> None:
    text = "The bearer of the flag was sk-8 (a skier); see https://example.com/a:b and AKIA1."
    assert default_redactor().redact(text) == (text, 0)


def test_user_patterns_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REFLECT_REDACT_PATTERNS", '["ghp_[A-Za-z0-9]{36}"]')
    redacted, count = default_redactor().redact("token ghp_" + "a" * 36)
    assert redacted == "token [REDACTED:custom_1]" and count == 1
    monkeypatch.setenv("REFLECT_REDACT_PATTERNS", "ghp_.*")
    with pytest.raises(ConfigError, match="JSON list"):
        default_redactor()
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        Redactor.of({"broken": "(unclosed"})


def test_every_text_of_an_assembled_trace_is_redacted_and_counted() -> None:
    key = "sk-" + "A1b2C3d4" * 3
    root = agent_root(f"Use {key} to look up Paris", f"done with {key}")
    call = llm("looking it up", [("lookup", f'{{"city": "Paris", "api_key": "{key}"}}', "c1")], parent=root.span_id)
    result = tool("lookup", f"2100000 (authorized with {key})", parent=root.span_id, start=5)
    trace = assemble_trace([root, call, result])
    assert key not in trace.model_dump_json()
    assert trace.steps[0].tool_args == {"city": "Paris", "api_key": "[REDACTED:api_key]"}
    (warning,) = [w for w in trace.warnings if w.code is WarningCode.SECRETS_REDACTED]
    assert warning.message.startswith("4 secret(s) replaced")
