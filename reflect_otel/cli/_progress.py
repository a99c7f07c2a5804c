"""Progress lines on stderr for the commands that run an agent while they work (``demo``, ``replay``), and the
attribution search's own progress records routed to them."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SEARCH_LOGGER", "Progress", "search_logs_to"]

SEARCH_LOGGER = "reflect_otel.attribution.search"
"""The logger whose INFO records are the search's progress ("round 1: ...", "step N localized")."""


class Progress:
    """One line per event on stderr, with the seconds since the command started (plain lines, so that logs and CI
    show them as a terminal does)."""

    def __init__(self, started: float) -> None:
        self.started = started

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.0f} s] {text}", file=sys.stderr, flush=True)


@contextmanager
def search_logs_to(handler: logging.Handler) -> Iterator[None]:
    """The search's records go to ``handler`` alone while the block runs (its INFO lines are progress there, not
    log records twice); the logger is as it was afterwards."""
    log = logging.getLogger(SEARCH_LOGGER)
    level, propagate = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
