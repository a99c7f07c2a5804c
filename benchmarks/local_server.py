"""The local llama.cpp server as we start it against llama-cpp-python's server defaults: REFLECT attributes the same
failing BIG-Bench-Mistake traces (chain of thought, replayed by the same local model) once on a server computing
and caching the logits of every prompt token (its default, ``--logits_all true``) and once on ours (the last
token's alone), each freshly started with the same cache budget. Prints, per server: seconds, the share of prompt
tokens served from the cache, the median call, the server's peak resident memory, and whether both gave the same
records (step and replayed answers). Needs ``pip install 'reflect-otel[local]'``. Last line:
``local_server_speedup=N`` (the default's seconds over ours).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

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
from reflect_otel.llm.local import LocalLlamaServer, local_llm
from reflect_otel.llm.models import resolve_local_model
from reflect_otel.record import AttributionRecord

SERVERS = {"all-logits (llama-cpp-python's default)": True, "last-logits (ours)": False}


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _run(
    all_logits: bool, items: list[DatasetItem], config: ReflectConfig, threads: int, *, smoke: bool = False
) -> tuple[list[AttributionRecord], float, float]:
    """The records, their seconds and the server's peak RSS (MB), on a freshly started server (``smoke``: on the
    scripted model, no server, no RSS)."""
    server = None
    if smoke:
        llm = scripted_llm()
    else:
        previous = LocalLlamaServer._instance
        if previous is not None:
            previous.stop()
        server = LocalLlamaServer(resolve_local_model(), threads=threads, all_logits=all_logits)
        LocalLlamaServer._instance = server  # local_llm() takes this one
        llm = local_llm()
    pipeline = ReflectPipeline(llm, verifier=BBMVerifier(), config=config)
    started = time.perf_counter()
    records = attribute_replaying(pipeline, llm, items, f"{'all' if all_logits else 'last'}-logits")
    seconds = time.perf_counter() - started
    peak = float("nan")
    if server is not None:
        peak = _peak_rss_mb(server._process.pid)
        server.stop()
        LocalLlamaServer._instance = None
    return records, seconds, peak


def _outcome(record: AttributionRecord) -> tuple[object, ...]:
    return (record.status, record.step_index, tuple(a.final_answer for a in record.replays))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_bbm_workload_options(parser)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="the servers' CPU threads")
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, traces=1)
    items = bbm_workload(args)
    config = ReflectConfig(rounds=1, rollback_points=2, gate=GateMode.SOFT)
    measured = {
        name: _run(all_logits, items, config, args.threads, smoke=args.smoke) for name, all_logits in SERVERS.items()
    }
    model = "scripted-llm" if args.smoke else resolve_local_model().name
    print(f"traces={len(items)} model={model} threads={args.threads}")
    print("server                                  seconds  calls  cached_share  median_call_s  peak_rss_mb")
    for name, (records, seconds, peak) in measured.items():
        share, median, calls = call_summary(records)
        print(f"{name:<38} {seconds:>8.0f}  {calls:>5}  {share:>12.2f}  {median:>13.2f}  {peak:>11.0f}")
    for name, (records, _seconds, _peak) in measured.items():
        print(f"{name}, per stage:")
        print("\n".join(per_stage_lines(records)))
    (default, default_s, _), (ours, ours_s, _) = measured.values()
    same = sum(_outcome(a) == _outcome(b) for a, b in zip(default, ours, strict=True))
    print(f"same_records={same}/{len(items)}")
    print(f"local_server_speedup={default_s / ours_s:.2f}")


if __name__ == "__main__":
    main()
