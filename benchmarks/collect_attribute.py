"""``collect --attribute``'s receive path: spans/s from OTLP/HTTP request to stored trace with online flagging on,
against the receiver alone, in the same run.

Three set-ups receive the same bodies over loopback: the receiver writing each trace to a DuckDB store (the
baseline); the same with the attribution worker judging every run by critical evidence checks (no LLM) and
attributing the flagged ones with the ``evidence`` method; and the same with the plan-anchored proxy verifier
asking a scripted in-process auditor (no model time: what is measured is reflect-otel's own work). Flagging runs
off the receive path, so the receive rate should hold; the worker's rate (runs judged per second, until all are
done) is printed beside it. Last line: ``collect_attribute_receive_ratio=R`` (receive rate with the proxy
verifier on / the baseline's).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks._common import add_smoke_option, post_protobuf, scripted_llm, smoke_sizes, synthetic_trace
from benchmarks.receiver import encode
from reflect_otel.attribution.methods import method_spec
from reflect_otel.attribution.service import AttributionService
from reflect_otel.collectors.receiver import OTLPReceiver
from reflect_otel.collectors.trace_collector import BufferLimits
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.flagging.proxy_verifier import EvidenceVerifier, PlanAnchoredVerifier
from reflect_otel.flagging.verifiers import OracleVerifier, Verifier
from reflect_otel.llm.factory import NoModel
from reflect_otel.online.work import AttributionWorker
from reflect_otel.trace import StructuredTrace


def _receive(bodies: list[bytes], traces: int, verifier: Verifier | None) -> tuple[float, float, int]:
    """(seconds to receive and store every trace, seconds until every run is judged, runs judged)."""
    with tempfile.TemporaryDirectory() as folder:
        store = DuckDBStore(Path(folder) / "bench.duckdb")
        worker = None
        if verifier is not None:
            service = AttributionService(
                NoModel(), method_spec("evidence"), verifier=OracleVerifier(), proxy=verifier, store=store, triage=True
            )
            worker = AttributionWorker(service, store).start()
        received: list[str] = []

        def sink(trace: StructuredTrace) -> None:
            store.write_trace(trace)
            received.append(trace.trace_id)
            if worker is not None:
                worker.offer(trace)

        receiver = OTLPReceiver(
            sink, http=("127.0.0.1", 0), buffer_limits=BufferLimits(grace_s=0.0, max_traces=traces + 1)
        ).start()
        start = time.perf_counter()
        post_protobuf(receiver.http_port, bodies)
        receiver.force_flush(120_000)
        received_s = time.perf_counter() - start
        receiver.shutdown()
        judged = 0
        if worker is not None:
            while worker.stats.verified + worker.stats.failed < traces and time.perf_counter() - start < 600:
                time.sleep(0.01)
            judged = worker.stats.verified
            worker.shutdown()
        done_s = time.perf_counter() - start
        store.close()
    assert len(received) == traces, (len(received), traces)
    return received_s, done_s, judged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=int, default=1_000)
    parser.add_argument("--traces-per-request", type=int, default=50)
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, traces=20, traces_per_request=10)
    traces = [synthetic_trace(n) for n in range(args.traces)]
    step = args.traces_per_request
    bodies = [encode(traces[i : i + step]) for i in range(0, len(traces), step)]
    spans = sum(len(t) for t in traces)
    print(f"{args.traces} traces, {spans} spans in {len(bodies)} requests of {step} traces")
    setups: dict[str, Verifier | None] = {
        "receiver alone (baseline)": None,
        "flagging: evidence checks": EvidenceVerifier(),
        "flagging: proxy verifier, scripted auditor": PlanAnchoredVerifier(scripted_llm()),
    }
    rates = {}
    for name, verifier in setups.items():
        received_s, done_s, judged = _receive(bodies, args.traces, verifier)
        rates[name] = spans / received_s
        worker = f"; {judged} runs judged in {done_s:.1f} s ({judged / done_s:,.0f} runs/s)" if verifier else ""
        print(f"{name:<45} receive {rates[name]:>9,.0f} spans/s{worker}")
    baseline = rates["receiver alone (baseline)"]
    ratio = rates["flagging: proxy verifier, scripted auditor"] / baseline
    print(f"evidence / baseline: {rates['flagging: evidence checks'] / baseline:.2f}")
    print(f"collect_attribute_receive_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
