"""``collect --attribute`` writes each row once: the receiver's sink writes the trace, the worker the job at each
change of state (pending, running, done), the service the verdict and the record, and nothing writes the trace a
second time. Counted on the in-memory store behind the collect command's own sink and worker."""

from __future__ import annotations

from collections import Counter
from typing import Any

from reflect_otel.attribution.methods import method_spec
from reflect_otel.attribution.service import AttributionService
from reflect_otel.cli.collect import TraceSink
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.llm.factory import NoModel
from reflect_otel.online.work import AttributionWorker
from reflect_otel.store import AttributionJob
from reflect_otel.store.memory import InMemoryStore
from reflect_otel.testing import make_trace, wait_until
from reflect_otel.trace import StructuredTrace


class CountingStore(InMemoryStore):
    """The in-memory store, counting each write by (kind, trace id[, status])."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: Counter[tuple[str, ...]] = Counter()

    def write_trace(self, trace: StructuredTrace) -> None:
        self.writes["trace", trace.trace_id] += 1
        super().write_trace(trace)

    def write_verdict(self, trace_id: str, verdict: Any) -> None:
        self.writes["verdict", trace_id] += 1
        super().write_verdict(trace_id, verdict)

    def write_record(self, record: Any) -> None:
        self.writes["record", record.trace_id] += 1
        super().write_record(record)

    def write_job(self, job: AttributionJob) -> None:
        self.writes["job", job.trace_id, job.status] += 1
        super().write_job(job)


def _run(trace_id: str, answer: str) -> StructuredTrace:
    trace = make_trace(
        "What is the capital of France?",
        [{"tool": "search", "args": {"q": "capital"}, "result": "Paris is the capital"}],
        final_answer=answer,
    )
    return trace.model_copy(update={"trace_id": trace_id, "metadata": {"expected_answer": "Paris"}})


def test_collect_attribute_writes_each_row_once() -> None:
    store = CountingStore()
    service = AttributionService(
        NoModel(), method_spec("last-step"), verifier=OracleVerifier(), store=store, triage=True
    )
    worker = AttributionWorker(service, store).start()
    sink = TraceSink(store=store, worker=worker)
    wrong, right = _run("a" * 32, "Lyon"), _run("b" * 32, "Paris")
    sink(wrong)
    sink(right)
    wait_until(lambda: worker.stats.verified == 2, 60, "both runs judged")
    worker.shutdown()
    assert store.writes == {
        ("trace", wrong.trace_id): 1,
        ("verdict", wrong.trace_id): 1,
        ("record", wrong.trace_id): 1,  # flagged: attributed
        ("job", wrong.trace_id, "pending"): 1,
        ("job", wrong.trace_id, "running"): 1,
        ("job", wrong.trace_id, "done"): 1,
        ("trace", right.trace_id): 1,
        ("verdict", right.trace_id): 1,  # judged right: no record
        ("job", right.trace_id, "pending"): 1,
        ("job", right.trace_id, "running"): 1,
        ("job", right.trace_id, "done"): 1,
    }
    assert store.read_job(wrong.trace_id) == AttributionJob(wrong.trace_id, "done", 1, "Paris")
    (record,) = [r for r in store._records.values() if r.trace_id == wrong.trace_id]
    assert record.errors == ()  # the store took it: no export failure


def test_the_online_path_still_stores_the_trace_it_was_not_given_stored() -> None:
    store = CountingStore()
    service = AttributionService(
        NoModel(), method_spec("last-step"), verifier=OracleVerifier(), store=store, triage=True
    )
    service.process(_run("c" * 32, "Lyon"), expected="Paris")
    assert store.writes == {("trace", "c" * 32): 1, ("verdict", "c" * 32): 1, ("record", "c" * 32): 1}
