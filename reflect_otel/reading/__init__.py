"""Reading runs: spans as the conventions write them, turned into a :class:`~reflect_otel.trace.StructuredTrace`.

This stage owns the span record (:mod:`.spans`), the attribute names of OpenInference, the OTel GenAI conventions
and this project's own (:mod:`.semconv`, :mod:`.genai`, :mod:`.vercel_ai`), redaction, the assembly of spans into
steps (:mod:`.assembly`), trace files (:mod:`.tracefile`), an in-process recording of one run (:mod:`.capture`) and
how a tool's own text is read (errors, empty results, hints: :mod:`._tool_text`). Nothing here calls a model.
"""

from __future__ import annotations

from reflect_otel.reading.assembly import assemble_trace
from reflect_otel.reading.capture import recorded_run
from reflect_otel.reading.spans import SpanRecord
from reflect_otel.reading.tracefile import read_traces

__all__ = ["SpanRecord", "assemble_trace", "read_traces", "recorded_run"]
