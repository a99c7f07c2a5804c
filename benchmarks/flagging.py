"""Flagging without an expected answer: precision and recall of HIGH_ERROR_SIGNAL on labelled runs, for the
evidence checks alone (a critical finding), the plan-anchored proxy verifier alone (its audit, evidence off) and
both combined (the default verifier), each with its standard error.

Runs: ``--bbm DATA`` takes equal numbers of right and wrong BIG-Bench-Mistake chains of thought (development
data, seeded sample); ``--live RESULTS`` takes the demo agent's runs recorded by ``eval --benchmark wtq-live``
(``results.jsonl``: each run's trace and whether its answer was right). The proxy verifiers call the configured
model (the local server by default); a run whose verifier call failed is counted as failed, never scored.

For the proxy verifiers it also prints how often verdicts on each basis were right (the counts a
:class:`~reflect_otel.proxy_verifier.ConfidenceCalibration` holds); ``--calibration-out FILE`` writes those of the
last proxy verifier run as one, for ``REFLECT_PROXY_CALIBRATION``.

    python -m benchmarks.flagging --bbm ../shared/data --per-class 10 --verifiers evidence,proxy,both
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from benchmarks._common import RESULTS, add_smoke_option, scripted_llm
from reflect_otel.datasets.bbm import BBMVerifier, read_bbm
from reflect_otel.evidence import Severity, find_evidence
from reflect_otel.llm.factory import make_llm
from reflect_otel.proxy_verifier import BASES, ConfidenceCalibration, PlanAnchoredVerifier, ProxyVerifierConfig
from reflect_otel.trace import StructuredTrace


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


Flagger = Callable[[Labelled], bool | None]
"""True: HIGH_ERROR_SIGNAL; False: not flagged; None: the verifier failed (counted apart)."""


def evidence_flag(run: Labelled) -> bool:
    return any(f.severity is Severity.CRITICAL for f in find_evidence(run.trace))


class ProxyFlagger:
    """A :data:`Flagger` over the proxy verifier that also counts, per verdict basis, the verdicts that were right."""

    def __init__(self, verifier: PlanAnchoredVerifier) -> None:
        self.verifier = verifier
        self.right: Counter[str] = Counter()
        self.judged: Counter[str] = Counter()

    def __call__(self, run: Labelled) -> bool | None:
        verdict, basis = self.verifier.judge(run.trace)
        if verdict.label == "UNCERTAIN" and "failed" in verdict.reasoning:
            return None
        if basis is not None:
            self.judged[basis] += 1
            self.right[basis] += verdict.is_correct is (not run.wrong)
        return verdict.label == "HIGH_ERROR_SIGNAL"

    def calibration(self, source: str) -> ConfidenceCalibration:
        counts = {b: (self.right[b], self.judged[b]) for b in BASES if self.judged[b]}
        return ConfidenceCalibration(model=self.verifier.llm.model_name, counts=counts, source=source)


def share(hits: int, total: int) -> str:
    if total == 0:
        return "n/a (0 runs)"
    p = hits / total
    return f"{p:.2f} ± {math.sqrt(p * (1 - p) / total):.2f} ({hits}/{total})"


def score(name: str, runs: Iterable[Labelled], flag: Flagger) -> str:
    flagged_wrong = flagged_right = missed = failed = uncertain_right = 0
    started = time.perf_counter()
    for run in runs:
        outcome = flag(run)
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
    parser.add_argument("--calibration-out", type=Path, help="write the last proxy verifier's calibration here")
    add_smoke_option(parser)
    args = parser.parse_args()
    if args.smoke:  # the demo agent's 7 live runs kept in the repository, the proxy's auditor scripted
        args.live, args.bbm = RESULTS / "wtq-live-qwen2.5-coder-1.5b" / "results.jsonl", None
    if (args.bbm is None) == (args.live is None):
        parser.error("give exactly one of --bbm DATA and --live RESULTS")
    runs = bbm_runs(args.bbm, args.per_class, args.seed) if args.bbm else live_runs(args.live)
    wrong = sum(r.wrong for r in runs)
    print(f"{len(runs)} runs: {wrong} wrong, {len(runs) - wrong} right")
    print("| verifier | precision of HIGH_ERROR_SIGNAL | recall | verifier failed | seconds |")
    print("|---|---|---|---|---|")
    names = [n.strip() for n in args.verifiers.split(",") if n.strip()]
    llm = (scripted_llm() if args.smoke else make_llm()) if {"proxy", "both"} & set(names) else None
    calibrations: list[tuple[str, ConfidenceCalibration]] = []
    data = f"--bbm {args.bbm} --per-class {args.per_class} --seed {args.seed}" if args.bbm else f"--live {args.live}"
    for name in names:
        if name == "evidence":
            print(score("evidence checks alone", runs, evidence_flag), flush=True)
        elif name in ("proxy", "both"):
            assert llm is not None
            config = ProxyVerifierConfig(use_evidence=name == "both")
            label = "proxy verifier alone" if name == "proxy" else "proxy + evidence (default)"
            flagger = ProxyFlagger(PlanAnchoredVerifier(llm, config=config))
            print(score(label, runs, flagger), flush=True)
            source = (
                f"{len(runs)} labelled runs, {date.today()}: python -m benchmarks.flagging {data} --verifiers {name}"
            )
            calibrations.append((label, flagger.calibration(source)))
        else:
            parser.error(f"unknown verifier {name!r}; choose from evidence, proxy, both")
    for label, calibration in calibrations:
        print(f"\n{label}, verdicts right per basis (model {calibration.model}):")
        for basis, (right, judged) in calibration.counts.items():
            print(f"- {basis}: {right}/{judged}, calibrated confidence {(right + 1) / (judged + 2):.2f}")
    if args.calibration_out and calibrations:
        args.calibration_out.write_text(calibrations[-1][1].model_dump_json(indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.calibration_out} (use it with REFLECT_PROXY_CALIBRATION={args.calibration_out})")
    print(f"flagging_runs={len(runs)}")


if __name__ == "__main__":
    main()
