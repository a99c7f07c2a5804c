"""Who&When multi-agent failure logs: ``history`` (one step per message), ``mistake_step`` (a 0-based index into
``history``, as a string), ``mistake_agent``, ``mistake_reason``, ``question`` and ``ground_truth``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from reflect_otel.errors import InputError
from reflect_otel.trace import ErrorLabel, Step, StepKind, StructuredTrace, TraceSource

__all__ = ["WhoAndWhenLog", "is_who_and_when_log", "read_who_and_when"]


@dataclass(frozen=True, slots=True)
class WhoAndWhenLog:
    """One log as a trace (its mistake as the trace's one label) with the expected answer."""

    trace: StructuredTrace
    expected: str | None
    mistake_step: int
    reason: str


def is_who_and_when_log(document: object) -> bool:
    """True for a JSON document shaped as a Who&When log (its history and its labelled mistake step)."""
    return isinstance(document, dict) and "history" in document and "mistake_step" in document


def read_who_and_when(folder: Path, *, max_bytes: int) -> Iterator[WhoAndWhenLog]:
    """Every ``SUBSET/N.json`` under ``folder`` whose mistake step lies inside its history, in a stable order.
    Raises :class:`InputError` naming the file that is not a Who&When log."""
    for path in sorted(folder.glob("*/*.json"), key=lambda p: (p.parent.name, int(p.stem) if p.stem.isdigit() else 0)):
        if path.stat().st_size > max_bytes:
            raise InputError(f"{path}: over {max_bytes} bytes")
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
            history = row["history"]
            mistake = int(str(row["mistake_step"]).strip())
        except (ValueError, KeyError, TypeError) as error:
            raise InputError(f"{path}: not a Who&When log ({error})") from None
        if not isinstance(history, list) or not 0 <= mistake < len(history):
            continue
        trace_id = hashlib.sha256(f"who-and-when:{path.parent.name}/{path.name}".encode()).hexdigest()[:32]
        steps = tuple(
            Step(
                index=i,
                span_id=hashlib.sha256(f"{trace_id}:{i}".encode()).hexdigest()[:16],
                kind=StepKind.FINAL_ANSWER if i == len(history) else StepKind.MESSAGE,
                agent=str(message.get("name") or message.get("role") or "") or None,
                reasoning=str(message.get("content", "")),
                is_final_answer=i == len(history),
            )
            for i, message in enumerate(history, start=1)
        )
        reason = str(row.get("mistake_reason") or "")
        trace = StructuredTrace(
            trace_id=trace_id,
            question=str(row.get("question", "")),
            final_answer=steps[-1].reasoning if steps else None,
            steps=steps,
            source=TraceSource(framework="multi_agent", collector="dataset:who_and_when"),
            labels=(
                ErrorLabel(step_index=mistake + 1, category=str(row.get("mistake_agent") or ""), description=reason),
            ),
            metadata={"dataset": "who_and_when", "subset": path.parent.name},
        )
        yield WhoAndWhenLog(trace, str(row.get("ground_truth") or "") or None, mistake + 1, reason)
