"""A model that waits out a busy endpoint instead of failing the work: for a worker whose runs can wait.

An endpoint that answers 429 or 503, or stalls, is busy, not wrong: the run being attributed is not at fault, and
a failed record would be a wrong answer kept for good. :class:`PatientLLM` sends a request refused that way again
(:class:`~reflect_otel.errors.EndpointBusyError`, or an endpoint taken for down for such failures) after a pause:
the ``Retry-After`` it asked for, else a jittered exponential backoff up to :data:`MAX_PAUSE_S`, for as long as
its :class:`CallGate` lets it. The attribution just takes longer; runs queued behind it wait (a worker takes one
at a time), which is the backlog ``reflect-otel stats`` shows. Any other failure (a wrong key, a 400, an answer
that never validates) passes through, for the method to record as before.

The gate is how a fleet steers each request: a shared worker's gate holds one of the endpoint's concurrency slots
around the request, and raises :class:`JobReleased` when the job is no longer the worker's to do (another worker
took it while this one was cut off from the database) or the worker is stopping.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Iterator
from typing import Protocol

from reflect_otel.errors import EndpointBusyError, EndpointDownError, LLMError
from reflect_otel.llm.base import Completion, LLMRequest, OutputT, StructuredLLM
from reflect_otel.llm.wrapper import WrapperLLM

__all__ = ["MAX_PAUSE_S", "CallGate", "JobReleased", "PatientLLM", "busy_pause"]

_log = logging.getLogger("reflect_otel.llm.patient")
MAX_PAUSE_S = 30.0
"""The longest pause between two tries of one request, unless the endpoint asks for longer."""


class JobReleased(BaseException):
    """The work in hand is no longer this worker's to do: stop it where it is, write nothing more for it, spend no
    more on it. Derives from ``BaseException``, as ``asyncio.CancelledError`` does, so that an error boundary that
    records every ``Exception`` as the run's outcome (a method's) lets it through to the worker, which leaves the
    job to whoever holds it."""


class CallGate(Protocol):
    """What a :class:`PatientLLM` asks before each try and between tries. Both may raise :class:`JobReleased`."""

    def request(self) -> contextlib.AbstractContextManager[None]:
        """Held around each try: may wait (for a concurrency slot), or raise :class:`JobReleased`."""
        ...

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` between tries (or raise :class:`JobReleased` to stop waiting)."""
        ...


class _Open:
    """The gate that lets every request through and sleeps between tries."""

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        yield

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)


def busy_pause(error: LLMError, tries: int) -> float | None:
    """How long to wait before try ``tries + 1`` after ``error``, or None when the error is not one of a busy
    endpoint: at least what the endpoint asked (its ``Retry-After``, or what is left of its cool-off), else 1 s
    doubling up to :data:`MAX_PAUSE_S`, drawn between half and all of that (full jitter)."""
    if not (isinstance(error, EndpointBusyError) or (isinstance(error, EndpointDownError) and error.busy)):
        return None
    asked = error.retry_after_s
    pause = min(2.0**tries, MAX_PAUSE_S) * random.uniform(0.5, 1.0)
    return max(pause, asked * random.uniform(1.0, 1.1)) if asked is not None else pause


class PatientLLM(WrapperLLM):
    """Wraps ``inner``; see the module's docstring. The calls that failed for a busy endpoint are not the run's
    cost: only the try that was answered is returned (and so counted by the budget and in the record)."""

    def __init__(self, inner: StructuredLLM, *, gate: CallGate | None = None) -> None:
        super().__init__(inner)
        self.gate: CallGate = gate if gate is not None else _Open()
        self.waits = 0
        """Pauses taken for a busy endpoint (all requests together)."""

    def answer(self, request: LLMRequest[OutputT]) -> Completion[OutputT]:
        tries = 0
        waited = 0.0
        while True:
            with self.gate.request():
                try:
                    return request.to(self.inner)
                except LLMError as error:
                    pause = busy_pause(error, tries)
                    if pause is None:
                        raise
                    if tries == 0 or tries % 10 == 0:
                        _log.warning(
                            "%s: the endpoint is busy (%s); waiting %.1f s before trying again (waited %.0f s so far)",
                            request.stage,
                            str(error).split(". Check")[0],
                            pause,
                            waited,
                        )
            self.waits += 1
            self.gate.pause(pause)
            waited += pause
            tries += 1
