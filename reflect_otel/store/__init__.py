"""The store: where traces, verdicts, jobs and attribution records are kept for SQL, dashboards and reports.

This package owns the contract every backend implements (:class:`AttributionStore`, :class:`ReadsRecords`), how a
target names its backend (:func:`store_kind`, :func:`check_store_target`) and how backends and record exporters are
opened by name (:func:`open_store`, :func:`open_exporter`); the record exporter contract (:class:`RecordExporter`
returning an :class:`ExportResult`), its fan-out (:class:`CompositeRecordExporter`) and the store as an exporter. The backends themselves live in
``reflect_otel.exporters``.
"""

from __future__ import annotations

from reflect_otel.store._export import (
    CompositeRecordExporter,
    ExportFailure,
    ExportResult,
    RecordExporter,
    ReportsFailures,
    StoreRecordExporter,
    VerdictExporter,
)
from reflect_otel.store._protocol import (
    DEFAULT_STORE,
    JOB_RANK,
    AttributionJob,
    AttributionStore,
    JobStatus,
    ReadsRecords,
    StoreStats,
    check_store_target,
    moves_on,
    open_exporter,
    open_store,
    store_kind,
    store_path,
    store_target,
)
from reflect_otel.store.memory import InMemoryStore

__all__ = [
    "DEFAULT_STORE",
    "JOB_RANK",
    "AttributionJob",
    "AttributionStore",
    "CompositeRecordExporter",
    "ExportFailure",
    "ExportResult",
    "InMemoryStore",
    "JobStatus",
    "ReadsRecords",
    "RecordExporter",
    "ReportsFailures",
    "StoreRecordExporter",
    "StoreStats",
    "VerdictExporter",
    "check_store_target",
    "moves_on",
    "open_exporter",
    "open_store",
    "store_kind",
    "store_path",
    "store_target",
]
