"""Every text a trace keeps is cut to the limits and its secrets replaced, each counted once by its pass."""

from __future__ import annotations

from reflect_otel.reading.assembly import AssemblyLimits
from reflect_otel.reading.assembly.scrub import TextRules
from reflect_otel.reading.redaction import default_redactor

_KEY = "sk-" + "P" * 24


def test_texts_are_cut_with_a_note_and_model_inputs_have_their_own_limit() -> None:
    scrubber = TextRules(AssemblyLimits(max_text_chars=10, max_model_input_chars=20), default_redactor()).scrubber()
    assert scrubber.text("x" * 25) == "x" * 10 + "…[truncated 15 chars]"
    assert scrubber.model_input("y" * 25) == "y" * 20 + "…[truncated 5 chars]"
    assert scrubber.model_input("") is None and scrubber.secrets == 0


def test_each_scrubber_counts_its_own_secrets() -> None:
    rules = TextRules(AssemblyLimits(), default_redactor())
    first, second = rules.scrubber(), rules.scrubber()
    assert first.args(f'{{"key": "{_KEY}", "n": 1}}') == {"key": "[REDACTED:api_key]", "n": 1}
    assert first.clean(f"a {_KEY}") == "a [REDACTED:api_key]"
    assert (first.secrets, second.secrets) == (2, 0)


def test_a_wrapped_result_keeps_its_wrapper_raw_and_counts_its_secret_once() -> None:
    scrubber = TextRules(AssemblyLimits(), default_redactor()).scrubber()
    text, raw = scrubber.result(f'{{"result": "{_KEY}"}}')
    assert text == "[REDACTED:api_key]" and raw == '{"result": "[REDACTED:api_key]"}' and scrubber.secrets == 1
    assert scrubber.result("plain") == ("plain", None)
