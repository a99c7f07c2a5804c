"""reflect-otel: which step of a failed LLM-agent run caused the failure, proven by targeted replay.

Online use: ``@reflect_otel.observe(replay=...)`` on an agent, optionally ``reflect_otel.configure(...)`` first and
``with reflect_otel.expect(answer):`` around runs whose answer is known. For a user's own evaluation, ``with
reflect_otel.recorded_run(provider) as run:`` around one run gives that run's ``StructuredTrace`` (``run.trace``).
To try a change of one step of a failed run yourself, under the same controlled rule as attribution,
``reflect_otel.replay_from(trace, step, call="tool({...})", replay=adapter, expected=answer)``.
"""

from __future__ import annotations

from reflect_otel.attribution.manual import replay_from
from reflect_otel.online import configure, expect, observe, shutdown
from reflect_otel.reading.capture import recorded_run
from reflect_otel.record import AttributionRecord, AttributionStatus, ErrorType
from reflect_otel.trace import Step, StepKind, StructuredTrace

__all__ = [
    "AttributionRecord",
    "AttributionStatus",
    "ErrorType",
    "Step",
    "StepKind",
    "StructuredTrace",
    "configure",
    "expect",
    "observe",
    "recorded_run",
    "replay_from",
    "shutdown",
]

__version__ = "0.1.0"
