"""LLM calls and prompt tokens per trace for REFLECT and each baseline on the same traces (the paper's cost
table), with a scripted auditor whose replays never flip the outcome (the worst case for the replay methods).
Token counts are the scripted model's estimate (one token per four characters of prompt), so they compare
prompt sizes between methods, not any provider's bill. Last line: ``reflect_calls_per_trace=N``."""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks._common import add_smoke_option, scripted_reply, smoke_sizes
from reflect_otel.attribution.baselines import BASELINES
from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.config import ReflectConfig
from reflect_otel.datasets import read_bbm
from reflect_otel.datasets.bbm import BBMVerifier
from reflect_otel.demo.examples import example_path
from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter
from reflect_otel.testing import ScriptedLLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rollback-points", type=int, default=3)
    add_smoke_option(parser)
    args = parser.parse_args()
    smoke_sizes(args, rounds=1, rollback_points=1)
    items = list(read_bbm(example_path("bbm/multistep_arithmetic.jsonl")))[: 1 if args.smoke else None]
    config = ReflectConfig(rounds=args.rounds, rollback_points=args.rollback_points)
    methods: dict[str, Any] = {"reflect": ReflectPipeline} | BASELINES
    rows = []
    for name, cls in methods.items():
        calls = tokens = replays = 0
        for item in items:
            llm = ScriptedLLM(respond=scripted_reply)
            agent = ScriptedLLM(respond=scripted_reply)
            method = cls(llm, verifier=BBMVerifier(), config=config)
            record = method.attribute(
                item.trace,
                expected=item.expected,
                replay=ReasoningReplayAdapter(agent, task_context=item.domain_context),
                domain_context=item.domain_context,
            )
            calls += record.total_calls
            tokens += sum(c.prompt_tokens + c.completion_tokens for c in record.cost)
            replays += len(record.replays)
        n = len(items)
        rows.append((name, calls / n, tokens / n, replays / n))
    print(
        f"{len(items)} BIG-Bench-Mistake trace(s) (4 steps each), D={args.rounds}, K={args.rollback_points}, hard gate"
    )
    print(f"{'method':<16}{'auditor calls':>15}{'tokens (est.)':>15}{'replays':>10}")
    for name, calls, tokens, replays in rows:
        print(f"{name:<16}{calls:>15.1f}{tokens:>15.0f}{replays:>10.1f}")
    reflect = next(r for r in rows if r[0] == "reflect")
    print(f"reflect_calls_per_trace={reflect[1]:.1f}")


if __name__ == "__main__":
    main()
