"""Prompt caching on the local llama.cpp server: REFLECT attributes the same failing BIG-Bench-Mistake traces
(chain of thought, replayed by the same local model) once with the shared-prefix prompt layout and once with the
per-stage layout used before (each stage's own system message first), each on a freshly started server. Prints,
per layout, the share of auditor prompt tokens the server reused from its cache and the median auditor call time,
then their ratio. Targets: shared-prefix cached share >= 0.60 and median call >= 5x faster than per-stage.
Needs ``pip install 'reflect-otel[local]'``; ``REFLECT_LOCAL_MODEL`` picks the model (default: the registry's).
Last line: ``prompt_cache_speedup=N``."""

from __future__ import annotations

import argparse
from typing import Literal

from benchmarks._common import (
    add_bbm_workload_options,
    add_smoke_option,
    attribute_replaying,
    bbm_workload,
    call_summary,
    per_stage_lines,
    scripted_llm,
    smoke_sizes,
)
from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.config import GateMode, ReflectConfig
from reflect_otel.datasets import DatasetItem
from reflect_otel.datasets.bbm import BBMVerifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.local import LocalLlamaServer, local_llm
from reflect_otel.record import AttributionRecord

Layout = Literal["shared_prefix", "per_stage"]


def _run(
    layout: Layout, items: list[DatasetItem], config: ReflectConfig, *, smoke: bool = False
) -> list[AttributionRecord]:
    if smoke:
        llm: StructuredLLM = scripted_llm()
    else:
        server = LocalLlamaServer._instance
        if server is not None:
            server.stop()  # a fresh server: no cache carried over from the other layout
        LocalLlamaServer._instance = None
        llm = local_llm()
    pipeline = ReflectPipeline(llm, verifier=BBMVerifier(), config=config.model_copy(update={"prompt_layout": layout}))
    return attribute_replaying(pipeline, llm, items, layout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_bbm_workload_options(parser)
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, traces=1)
    items = bbm_workload(args)
    config = ReflectConfig(rounds=1, rollback_points=2, gate=GateMode.SOFT)
    results = {}
    details: dict[str, list[str]] = {}
    for layout in ("per_stage", "shared_prefix"):
        records = _run(layout, items, config, smoke=args.smoke)
        if not any(c.ok for r in records for c in r.llm_calls):
            raise SystemExit(f"{layout}: every auditor call failed; nothing was measured")
        results[layout] = call_summary(records)
        details[layout] = per_stage_lines(records)
    server = LocalLlamaServer._instance
    if server is not None:
        server.stop()
    print(f"traces={len(items)} model={server.model.name if server else 'scripted-llm' if args.smoke else '?'}")
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
