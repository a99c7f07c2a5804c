"""Prompt caching on the local llama.cpp server: REFLECT attributes the same failing BIG-Bench-Mistake traces
(chain of thought, replayed by the same local model) once with the shared-prefix prompt layout and once with the
per-stage layout used before (each stage's own system message first), each on a freshly started server. Prints,
per layout, the share of auditor prompt tokens the server reused from its cache and the median auditor call time,
then their ratio. Targets: shared-prefix cached share >= 0.60 and median call >= 5x faster than per-stage.
Needs ``pip install 'reflect-otel[local]'``; ``REFLECT_LOCAL_MODEL`` picks the model (default: the registry's).
Last line: ``prompt_cache_speedup=N``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Literal

from benchmarks._common import call_summary, failing_bbm_items, per_stage_lines
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.datasets import DatasetItem
from reflect_otel.demo.examples import example_path
from reflect_otel.llm.local import LocalLlamaServer, local_llm
from reflect_otel.pipeline import ReflectPipeline
from reflect_otel.record import AttributionRecord
from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter
from reflect_otel.verifiers import BBMVerifier

Layout = Literal["shared_prefix", "per_stage"]


def _run(layout: Layout, items: list[DatasetItem], config: ReflectConfig) -> list[AttributionRecord]:
    server = LocalLlamaServer._instance
    if server is not None:
        server.stop()  # a fresh server: no cache carried over from the other layout
    LocalLlamaServer._instance = None
    llm = local_llm()
    pipeline = ReflectPipeline(llm, verifier=BBMVerifier(), config=config.model_copy(update={"prompt_layout": layout}))
    records = []
    for item in items:
        started = time.perf_counter()
        record = pipeline.attribute(
            item.trace,
            expected=item.expected,
            replay=ReasoningReplayAdapter(llm, task_context=item.domain_context),
            domain_context=item.domain_context,
        )
        print(
            f"  {layout}: {item.trace.trace_id[:12]} {record.status.value} in {time.perf_counter() - started:.0f} s, "
            f"{record.total_calls} auditor calls",
            file=sys.stderr,
            flush=True,
        )
        records.append(record)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, help="a BIG-Bench-Mistake .jsonl (default: the example shipped)")
    parser.add_argument("--traces", type=int, default=2)
    args = parser.parse_args()
    path = args.data or example_path("bbm/multistep_arithmetic.jsonl")
    items = failing_bbm_items(path, args.traces)
    if not items:
        raise SystemExit(f"{path}: no failing traces")
    config = ReflectConfig(rounds=1, rollback_points=2, gate=GateMode.SOFT)
    results = {}
    details: dict[str, list[str]] = {}
    for layout in ("per_stage", "shared_prefix"):
        records = _run(layout, items, config)
        if not any(c.ok for r in records for c in r.llm_calls):
            raise SystemExit(f"{layout}: every auditor call failed; nothing was measured")
        results[layout] = call_summary(records)
        details[layout] = per_stage_lines(records)
    server = LocalLlamaServer._instance
    if server is not None:
        server.stop()
    print(f"traces={len(items)} model={server.model.name if server else '?'}")
    print("layout         calls  cached_share  median_call_s")
    for layout, (share, median, calls) in results.items():
        print(f"{layout:<14} {calls:>5}  {share:>12.2f}  {median:>13.2f}")
    for layout, lines in details.items():
        print(f"{layout}, per stage:")
        print("\n".join(lines))
    speedup = results["per_stage"][1] / results["shared_prefix"][1]
    print(f"cached_share_shared_prefix={results['shared_prefix'][0]:.2f}")
    print(f"prompt_cache_speedup={speedup:.2f}")


if __name__ == "__main__":
    main()
