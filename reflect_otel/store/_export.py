"""The record exporter contract, as the OpenTelemetry SDK writes its span exporters: ``export(records) ->
ExportResult``, ``force_flush(timeout_millis) -> bool``, ``shutdown()``; a composite that fans out to several
(the SDK's ``SynchronousMultiSpanProcessor``), and the store as one of them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import NamedTuple, Protocol, runtime_checkable

from reflect_otel.record import AttributionRecord
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = [
    "CompositeRecordExporter",
    "ExportFailure",
    "ExportResult",
    "RecordExporter",
    "ReportsFailures",
    "StoreRecordExporter",
    "VerdictExporter",
]

_log = logging.getLogger("reflect_otel.store.export")


class ExportResult(Enum):
    """What an export did, named as the SDK's ``SpanExportResult``."""

    SUCCESS = 0
    FAILURE = 1


class RecordExporter(Protocol):
    """Sends attribution records somewhere users look (an OTLP backend, Phoenix, the store). ``export`` never raises
    for what the backend does (down, refusing, full): it returns :attr:`ExportResult.FAILURE` after its own retries
    and keeps why in ``failure`` (the message the record's ``errors`` and the logs carry) until the next export.
    ``force_flush`` waits up to ``timeout_millis`` for what is queued (True when done); ``shutdown`` flushes and
    releases the backend. A backend's entry point is a factory with no arguments that reads its settings from the
    environment. Exporters are called from one thread at a time."""

    failure: str
    """Why the last export failed ("" after one that succeeded)."""

    def export(self, records: Sequence[AttributionRecord]) -> ExportResult: ...

    def force_flush(self, timeout_millis: int = 30_000) -> bool: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class VerdictExporter(Protocol):
    """A record exporter that also sends the verdict on each run's answer (the OTLP exporter's evaluation event on
    the run's root span). Called after ``export`` with every verdict the service reaches, the runs judged right
    included; reports like ``export``."""

    def export_verdict(self, trace: StructuredTrace, verdict: Verdict) -> ExportResult: ...


class ExportFailure(NamedTuple):
    """One exporter that failed: its name and why."""

    exporter: str
    message: str

    def __str__(self) -> str:
        return f"{self.exporter}: {self.message}"


class CompositeRecordExporter:
    """Fans each export out to ``exporters`` (by name), in order, each tried whatever the others did; an exporter
    that breaks its contract and raises counts as failed. :meth:`export_each` says which failed and why;
    :meth:`export` only whether all succeeded. The mapping is read at each call: exporters added to it later
    take part."""

    def __init__(self, exporters: Mapping[str, RecordExporter]) -> None:
        self.exporters = exporters
        self.failure = ""

    def export_each(
        self, records: Sequence[AttributionRecord], *, verdict: tuple[StructuredTrace, Verdict] | None = None
    ) -> tuple[ExportFailure, ...]:
        """Export ``records`` (and ``verdict``, on the exporters that send verdicts) to every exporter; the failures."""
        failures = []
        for name, exporter in self.exporters.items():
            message = _tried(exporter, records, verdict)
            if message:
                _log.warning("exporting to %s failed: %s", name, message)
                failures.append(ExportFailure(name, message))
        self.failure = "; ".join(map(str, failures))
        return tuple(failures)

    def export(self, records: Sequence[AttributionRecord]) -> ExportResult:
        return ExportResult.FAILURE if self.export_each(records) else ExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return all([exporter.force_flush(timeout_millis) for exporter in self.exporters.values()])

    def shutdown(self) -> None:
        for name, exporter in self.exporters.items():
            try:
                exporter.shutdown()
            except Exception:  # one exporter that cannot stop must not keep the others open
                _log.warning("shutting down the %s exporter failed", name, exc_info=True)


def _tried(
    exporter: RecordExporter, records: Sequence[AttributionRecord], verdict: tuple[StructuredTrace, Verdict] | None
) -> str:
    """Why exporting to ``exporter`` failed, or ""."""
    try:
        if exporter.export(records) is not ExportResult.SUCCESS:
            return exporter.failure or "the export failed"
        if verdict is not None and isinstance(exporter, VerdictExporter):  # noqa: SIM102 (one call per branch)
            if exporter.export_verdict(*verdict) is not ExportResult.SUCCESS:
                return exporter.failure or "the verdict's export failed"
    except Exception as error:  # an exporter that raises breaks its contract; the others still run
        return f"{type(error).__name__}: {error}"
    return ""


@runtime_checkable
class ReportsFailures(Protocol):
    """A store that counts the writes it could not apply (the built-in ones do; an optional part of the contract)."""

    def failed_writes(self) -> tuple[int, str]:
        """Writes refused, dropped or given up so far, and why the last of them failed."""
        ...


class _Store(Protocol):
    def write_record(self, record: AttributionRecord) -> None: ...

    def force_flush(self, timeout_millis: int = 30_000) -> bool: ...


class StoreRecordExporter:
    """The store as a record exporter: each record written, then waited for up to ``wait_millis``, so that a write
    the store cannot apply (a full disk, a refused row) or not within the wait (a server out of reach: the write
    stays queued and is applied when it answers) comes back as a failure. ``shutdown`` leaves the store open: its
    owner closes it."""

    def __init__(self, store: _Store, *, wait_millis: int = 30_000) -> None:
        self.store = store
        self.wait_millis = wait_millis
        self.failure = ""

    def export(self, records: Sequence[AttributionRecord]) -> ExportResult:
        counts = isinstance(self.store, ReportsFailures)
        before = self.store.failed_writes()[0] if isinstance(self.store, ReportsFailures) else 0
        for record in records:
            self.store.write_record(record)
        written = self.store.force_flush(self.wait_millis)
        failed, why = self.store.failed_writes() if isinstance(self.store, ReportsFailures) else (0, "")
        if counts and failed > before:
            self.failure = f"{failed - before} write(s) failed: {why}"
        elif not written:
            self.failure = f"not written within {self.wait_millis / 1000:g} s; still queued"
        else:
            self.failure = ""
        return ExportResult.FAILURE if self.failure else ExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.store.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Nothing to release: the store is its owner's."""
