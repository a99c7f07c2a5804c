"""LLM calls and prompt tokens per trace for REFLECT and each baseline on the same traces (the paper's cost
table), with a scripted auditor whose replays never flip the outcome (the worst case for the replay methods).
Token counts are the scripted model's estimate (one token per four characters of prompt), so they compare
prompt sizes between methods, not any provider's bill. Last line: ``reflect_calls_per_trace=N``."""

from __future__ import annotations

import argparse
from typing import Any

from reflect_otel.baselines import BASELINES
from reflect_otel.config import ReflectConfig
from reflect_otel.datasets import read_bbm
from reflect_otel.datasets.bbm import BBMVerifier
from reflect_otel.demo.examples import example_path
from reflect_otel.pipeline import ReflectPipeline
from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter
from reflect_otel.testing import ScriptedLLM, ScriptedRequest


def respond(request: ScriptedRequest) -> Any:
    steps = request.text.count("\nStep ") or 1
    stage = request.stage
    replies: dict[str, Any] = {
        "localize": {
            "error_step": max(1, steps // 2),
            "confidence": 0.6,
            "reasoning": "r",
            "what_should_have_been_done": "w",
        },
        "classify": {
            "error_type": "incorrect_problem_identification",
            "confidence": 0.6,
            "explanation": "e",
            "suggested_correction": "s",
        },
        "diagnose": {
            "root_cause": "r",
            "correction_instruction": "recompute carefully",
            "forbidden_actions": ["guess"],
            "expected_next_tool": None,
            "confidence": 0.6,
        },
        "gate": {"is_faithful": True, "violation_reason": None, "violation_type": None},
        "explain": {"reasoning": "r", "error_type": "incorrect_problem_identification", "explanation": "e"},
        "aao": {
            "error_step": 1,
            "responsible_agent": None,
            "reason": "r",
            "error_type": "goal_deviation",
            "confidence": 0.5,
        },
        "reflexion_extract": {
            "error_step": 1,
            "responsible_agent": None,
            "reason": "r",
            "error_type": "goal_deviation",
            "confidence": 0.5,
        },
        "sbs": {"is_error": False, "reason": "r"},
        "bs": {"half": "first", "reason": "r"},
        "bs_reason": {"reason": "r", "error_type": "goal_deviation", "confidence": 0.5},
        "reflect": {"reflection": "I should have recomputed."},
        "dover_hypotheses": {
            "hypotheses": [
                {"step": 1, "hypothesis": "h", "intervention": "i"},
                {"step": 2, "hypothesis": "h", "intervention": "i"},
            ]
        },
        "agent_replay": {"steps": ["Recomputing.", "Still the same."], "answer": "999999"},
    }
    return replies[stage]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rollback-points", type=int, default=3)
    args = parser.parse_args()
    items = list(read_bbm(example_path("bbm/multistep_arithmetic.jsonl")))
    config = ReflectConfig(rounds=args.rounds, rollback_points=args.rollback_points)
    methods: dict[str, Any] = {"reflect": ReflectPipeline} | BASELINES
    rows = []
    for name, cls in methods.items():
        calls = tokens = replays = 0
        for item in items:
            llm = ScriptedLLM(respond=respond)
            agent = ScriptedLLM(respond=respond)
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
    print(f"{len(items)} BIG-Bench-Mistake traces (4 steps each), D={args.rounds}, K={args.rollback_points}, hard gate")
    print(f"{'method':<16}{'auditor calls':>15}{'tokens (est.)':>15}{'replays':>10}")
    for name, calls, tokens, replays in rows:
        print(f"{name:<16}{calls:>15.1f}{tokens:>15.0f}{replays:>10.1f}")
    reflect = next(r for r in rows if r[0] == "reflect")
    print(f"reflect_calls_per_trace={reflect[1]:.1f}")


if __name__ == "__main__":
    main()
