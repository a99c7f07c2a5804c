"""Public annotated datasets as :class:`~reflect_otel.trace.StructuredTrace` s with their human labels, one module
each: BIG-Bench Mistake (chains of thought), TRAIL (agent span trees), Who&When (multi-agent logs)."""

from __future__ import annotations

from reflect_otel.datasets.bbm import BBM_TASKS, BBMVerifier, DatasetItem, bbm_item, is_bbm_row, read_bbm
from reflect_otel.datasets.trail import TrailImport, is_trail_document, read_trail_file
from reflect_otel.datasets.who_and_when import WhoAndWhenLog, read_who_and_when

__all__ = [
    "BBM_TASKS",
    "BBMVerifier",
    "DatasetItem",
    "TrailImport",
    "WhoAndWhenLog",
    "bbm_item",
    "is_bbm_row",
    "is_trail_document",
    "read_bbm",
    "read_trail_file",
    "read_who_and_when",
]
