"""Flagging without an expected answer: precision and recall of HIGH_ERROR_SIGNAL on labelled runs, for the
evidence checks alone (a critical finding), the plan-anchored proxy verifier alone (its audit, evidence off) and
both combined (the default verifier), each with its standard error.

Runs: ``--bbm DATA`` takes equal numbers of right and wrong BIG-Bench-Mistake chains of thought (development
data, seeded sample); ``--live RESULTS`` takes the demo agent's runs recorded by ``eval --benchmark wtq-live``
(``results.jsonl``: each run's trace and whether its answer was right). The proxy verifiers call the configured
model (the local server by default); a run whose verifier call failed is counted as failed, never scored.

    python -m benchmarks.flagging --bbm ../shared/data --per-class 10 --verifiers evidence,proxy,both
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from reflect_otel.datasets.bbm import read_bbm
from reflect_otel.evidence import Severity, find_evidence
from reflect_otel.llm.factory import make_llm
from reflect_otel.proxy_verifier import PlanAnchoredVerifier, ProxyVerifierConfig
from reflect_otel.trace import StructuredTrace
from reflect_otel.verifiers import BBMVerifier


@dataclass(frozen=True, slots=True)
class Labelled:
    trace: StructuredTrace
    wrong: bool


def bbm_runs(data: Path, per_class: int, seed: int) -> list[Labelled]:
    verifier = BBMVerifier()
    right: list[Labelled] = []
    wrong: list[Labelled] = []
    for path in sorted((data / "bbm").glob("*.jsonl")):
        for item in read_bbm(path):
            verdict = verifier.verify(item.trace, expected=item.expected).is_correct
            if verdict is True and not item.trace.labels:
                right.append(Labelled(item.trace, wrong=False))
            elif verdict is False and item.trace.labels:
                wrong.append(Labelled(item.trace, wrong=True))
    rng = random.Random(seed)
    rng.shuffle(right)
    rng.shuffle(wrong)
    return right[:per_class] + wrong[:per_class]


def live_runs(results: Path) -> list[Labelled]:
    runs = []
    for line in results.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "trace" in row:
            runs.append(Labelled(StructuredTrace.model_validate(row["trace"]), wrong=not row["correct"]))
    return runs


Flagger = Callable[[StructuredTrace], bool | None]
"""True: HIGH_ERROR_SIGNAL; False: not flagged; None: the verifier failed (counted apart)."""


def evidence_flag(trace: StructuredTrace) -> bool:
    return any(f.severity is Severity.CRITICAL for f in find_evidence(trace))


def proxy_flag(verifier: PlanAnchoredVerifier) -> Flagger:
    def flag(trace: StructuredTrace) -> bool | None:
        verdict = verifier.verify(trace, expected=None)
        if verdict.label == "UNCERTAIN" and "failed" in verdict.reasoning:
            return None
        return verdict.label == "HIGH_ERROR_SIGNAL"

    return flag


def share(hits: int, total: int) -> str:
    if total == 0:
        return "n/a (0 runs)"
    p = hits / total
    return f"{p:.2f} ± {math.sqrt(p * (1 - p) / total):.2f} ({hits}/{total})"


def score(name: str, runs: Iterable[Labelled], flag: Flagger) -> str:
    flagged_wrong = flagged_right = missed = failed = uncertain_right = 0
    started = time.perf_counter()
    for run in runs:
        outcome = flag(run.trace)
        if outcome is None:
            failed += 1
        elif outcome and run.wrong:
            flagged_wrong += 1
        elif outcome:
            flagged_right += 1
        elif run.wrong:
            missed += 1
        else:
            uncertain_right += 1
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    flagged = flagged_wrong + flagged_right
    return (
        f"| {name} | {share(flagged_wrong, flagged)} | {share(flagged_wrong, flagged_wrong + missed)} | "
        f"{failed} | {time.perf_counter() - started:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bbm", type=Path, help="dataset folder holding bbm/*.jsonl")
    parser.add_argument("--live", type=Path, help="results.jsonl of eval --benchmark wtq-live")
    parser.add_argument("--per-class", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verifiers", default="evidence,proxy,both")
    args = parser.parse_args()
    if (args.bbm is None) == (args.live is None):
        parser.error("give exactly one of --bbm DATA and --live RESULTS")
    runs = bbm_runs(args.bbm, args.per_class, args.seed) if args.bbm else live_runs(args.live)
    wrong = sum(r.wrong for r in runs)
    print(f"{len(runs)} runs: {wrong} wrong, {len(runs) - wrong} right")
    print("| verifier | precision of HIGH_ERROR_SIGNAL | recall | verifier failed | seconds |")
    print("|---|---|---|---|---|")
    names = [n.strip() for n in args.verifiers.split(",") if n.strip()]
    llm = make_llm() if {"proxy", "both"} & set(names) else None
    for name in names:
        if name == "evidence":
            print(score("evidence checks alone", runs, evidence_flag), flush=True)
        elif name in ("proxy", "both"):
            assert llm is not None
            config = ProxyVerifierConfig(use_evidence=name == "both")
            label = "proxy verifier alone" if name == "proxy" else "proxy + evidence (default)"
            print(score(label, runs, proxy_flag(PlanAnchoredVerifier(llm, config=config))), flush=True)
        else:
            parser.error(f"unknown verifier {name!r}; choose from evidence, proxy, both")


if __name__ == "__main__":
    main()
