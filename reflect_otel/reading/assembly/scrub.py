"""Every text a trace keeps passes through a :class:`Scrubber`: cut to the limits, secrets replaced, and counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reflect_otel import _values
from reflect_otel.reading.redaction import Redactor

__all__ = ["AssemblyLimits", "Scrubber", "TextRules"]


@dataclass(frozen=True, slots=True)
class AssemblyLimits:
    """Bounds on what one trace may hold; longer text is cut with a note of how much was cut."""

    max_text_chars: int = 100_000
    max_model_input_chars: int = 1_000_000


@dataclass(frozen=True, slots=True)
class TextRules:
    """How the texts of one trace are cleaned: what the passes are given."""

    limits: AssemblyLimits
    redactor: Redactor

    def scrubber(self) -> Scrubber:
        return Scrubber(self.limits, self.redactor)


class Scrubber:
    """Cleans texts for one pass and counts the secrets it replaced (``secrets``), which the pass reports in its
    result: each pass makes its own from the :class:`TextRules` it is given, so no count is shared."""

    __slots__ = ("limits", "redactor", "secrets")

    def __init__(self, limits: AssemblyLimits, redactor: Redactor) -> None:
        self.limits = limits
        self.redactor = redactor
        self.secrets = 0

    def clean(self, text: str) -> str:
        """``text`` with its secrets replaced (see :mod:`reflect_otel.reading.redaction`)."""
        cleaned, count = self.redactor.redact(text)
        self.secrets += count
        return cleaned

    def text(self, value: object) -> str:
        """Any value as text, cut to ``max_text_chars``, cleaned."""
        return self.clean(_values.truncate(_values.as_text(value), self.limits.max_text_chars))

    def model_input(self, value: object) -> str | None:
        """A model call's raw request, cut to ``max_model_input_chars``, cleaned; None when there is none."""
        return self.clean(_values.truncate(str(value), self.limits.max_model_input_chars)) if value else None

    def args(self, value: object) -> dict[str, Any]:
        """Tool-call arguments as a dict (see :func:`reflect_otel._values.tool_args`), every string cleaned."""
        cleaned, count = self.redactor.redact_value(_values.tool_args(value))
        self.secrets += count
        return cleaned  # type: ignore[no-any-return]

    def result(self, value: object, extracted: str | None = None) -> tuple[str, str | None]:
        """A tool result as text, out of its wrappers (``extracted`` when the caller has taken it out already), and
        the recorded value when that differs."""
        inner = extracted if extracted is not None else _values.tool_result_text(value)
        text = self.text(inner)
        if value is None or _values.as_text(inner) == _values.as_text(value):
            return text, None
        # the secrets of the raw value are the result's own, counted once (in the text)
        raw, _count = self.redactor.redact(_values.truncate(_values.as_text(value), self.limits.max_text_chars))
        return text, raw
