"""The warnings a rebuilt trace carries, each naming the fix, in the order the trace was rebuilt."""

from __future__ import annotations

from dataclasses import replace

from reflect_otel.reading.assembly import ATTRIBUTE_LIMIT_FIX, assemble_trace
from reflect_otel.trace import TraceWarning, WarningCode
from tests.assembly.recorded import ADK_ALONE, ADK_WITHOUT_CONTENT, recorded_spans
from tests.spans import agent_root, llm, span, tool


def _codes(warnings: tuple[TraceWarning, ...]) -> list[WarningCode]:
    return [w.code for w in warnings]


def test_recorded_runs_missing_model_calls_or_their_content_say_how_to_record_them() -> None:
    alone = assemble_trace(recorded_spans(ADK_ALONE)).warnings
    assert _codes(alone) == [WarningCode.NO_MODEL_CALLS] and "instrument the model client" in alone[0].message
    contentless = assemble_trace(recorded_spans(ADK_WITHOUT_CONTENT)).warnings
    assert _codes(contentless) == [WarningCode.NO_QUESTION, WarningCode.NO_MESSAGE_CONTENT]
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in contentless[1].message
    assert "recorded without their messages" in contentless[0].message


def test_every_warning_in_the_order_the_trace_was_rebuilt_after_the_collectors() -> None:
    key = "sk-" + "K" * 24
    root = span("CHAIN", name="root")  # no question anywhere
    lost = llm("x", parent=root.span_id, start=1, **{"llm.input_messages.3.message.role": "user"})
    lost = replace(lost, dropped_attributes=4)
    stray = tool("t", f"token {key}", parent="00000000000000ee", start=2)
    given = TraceWarning(code=WarningCode.DROPPED_SPANS, message="the collector dropped 2 spans")
    warnings = assemble_trace([root, lost, lost, stray], warnings=[given]).warnings
    assert _codes(warnings) == [
        WarningCode.DROPPED_SPANS,
        WarningCode.DUPLICATE_SPANS,
        WarningCode.ORPHAN_SPANS,
        WarningCode.DROPPED_ATTRIBUTES,
        WarningCode.MESSAGE_INDEX_GAP,
        WarningCode.NO_QUESTION,
        WarningCode.SECRETS_REDACTED,
    ]
    assert warnings[3].message.startswith("4 attribute(s) were dropped on 1 span(s)")
    assert warnings[4].span_id == lost.span_id and ATTRIBUTE_LIMIT_FIX in warnings[4].message
    assert warnings[5].span_id == root.span_id and warnings[6].message.startswith("1 secret(s)")


def test_a_trace_without_steps_says_so_and_a_whole_one_says_nothing() -> None:
    assert _codes(assemble_trace([span("CHAIN")]).warnings) == [WarningCode.NO_STEPS]
    root = agent_root("q", "a")
    assert assemble_trace([root, llm("a", parent=root.span_id, start=1)]).warnings == ()
