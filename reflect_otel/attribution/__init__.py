"""Attribution: which step of a failed run caused the failure, and the replays that prove it.

This stage owns the REFLECT search (:mod:`.search`: diagnose, test, verify and re-localize), the controlled replay
rule every method is held to (:mod:`.controlled_replay`, :mod:`._replayer`, :mod:`.effects`: a change of effect,
beside a control and a sensitivity arm from the same prefix), where changes come from (:mod:`.proposals`,
:mod:`.corrections`, :mod:`.stages`, :mod:`.pipeline`), the guard against answers written into a change
(:mod:`.leaks`), the controls and baselines measured beside it (:mod:`.controls`, :mod:`.baselines`), the methods
by name (:mod:`.methods`) and a user's own change replayed under the same rule (:mod:`.manual`).
"""

from __future__ import annotations

from reflect_otel.attribution.manual import replay_from
from reflect_otel.attribution.methods import method_spec

__all__ = ["method_spec", "replay_from"]
