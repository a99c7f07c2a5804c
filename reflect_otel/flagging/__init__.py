"""Flagging runs: is this run wrong, judged right away, with or without an expected answer.

This stage owns the verifiers (:class:`Verifier`: the oracle judge against an expected answer, the agent's own
resamples in :mod:`.consistency`, the plan-anchored proxy audit in :mod:`.proxy_verifier` and the combined rule in
:mod:`.combined`), the evidence checks that read a trace without a model (:mod:`.evidence`), the answer judge
(:mod:`.judge`), the run's score and its calibration (:mod:`.flag_score`, :mod:`.run_features`,
:mod:`.calibration`). Its verdicts decide which runs go on to attribution.
"""

from __future__ import annotations

from reflect_otel.flagging.evidence import find_evidence
from reflect_otel.flagging.judge import judge_answer
from reflect_otel.flagging.verifiers import Verifier

__all__ = ["Verifier", "find_evidence", "judge_answer"]
