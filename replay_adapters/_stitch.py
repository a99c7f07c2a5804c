"""Joining the kept prefix and a captured continuation into one replayed trace."""

from __future__ import annotations

from reflect_otel.trace import Step, StructuredTrace

__all__ = ["stitch"]


def stitch(
    original: StructuredTrace,
    rollback_point: int,
    continuation: tuple[Step, ...],
    *,
    trace_id: str,
    final_answer: str | None,
) -> StructuredTrace:
    """Original steps ``1..rollback_point`` exactly, then ``continuation`` renumbered after them."""
    kept = original.steps[:rollback_point]
    renumbered = tuple(s.model_copy(update={"index": rollback_point + i}) for i, s in enumerate(continuation, start=1))
    return original.model_copy(
        update={
            "trace_id": trace_id,
            "steps": kept + renumbered,
            "final_answer": final_answer,
            "labels": (),
            "warnings": (),
        }
    )
