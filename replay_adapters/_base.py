"""What the built-in replay adapters share: the rollback point checked before a replay, and a resample that is a
replay from the start at the request's temperature, run once per sample."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from reflect_otel.replay import ReplayRequest, ReplayResult, check_rollback_point

Options = TypeVar("Options")


class ReplayAdapterBase:
    """The shared half of a :class:`~reflect_otel.replay.ReplayAdapter` that can also resample
    (:class:`~reflect_otel.replay.SamplesRuns`): a subclass writes only :meth:`_replay`, one run of a request whose
    rollback point is known to be valid."""

    def replay(self, request: ReplayRequest) -> ReplayResult:
        check_rollback_point(request.trace, request.rollback_point)
        return self._replay(request)

    def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
        """``request`` (normally :meth:`ReplayRequest.resampling <reflect_otel.replay.ReplayRequest.resampling>`)
        replayed ``samples`` times, one run after the other."""
        return tuple(self.replay(request) for _ in range(samples))

    def _replay(self, request: ReplayRequest) -> ReplayResult:
        raise NotImplementedError


def with_options(options: Options, named: Mapping[str, Any]) -> Options:
    """``options`` (a frozen dataclass of an adapter's options) with the ``named`` ones replaced: the keywords an
    adapter's constructor takes beside ``options=``. Raises :class:`TypeError` naming an option that is not one."""
    fields = {field.name for field in dataclasses.fields(options)}  # type: ignore[arg-type]
    unknown = sorted(set(named) - fields)
    if unknown:
        raise TypeError(
            f"unknown replay adapter option(s) {', '.join(unknown)}; the options are {', '.join(sorted(fields))}"
        )
    return dataclasses.replace(options, **named)  # type: ignore[type-var]
