"""Localization on the development benchmarks, every method on the same traces: the evidence method and the
position floors (no LLM), the all-at-once baseline, and REFLECT's localize stage with and without the evidence
checks' findings in its prompt, all with the configured model (the local server by default).

Per benchmark it takes a seeded sample of the failing traces with a gold step (``--limit`` each) and prints exact
match, off-by-one and the share of traces given a step, each with its standard error; a trace whose LLM call failed
is counted under "failed", never scored. A trace on which the evidence checks find nothing gets the same localize
prompt with and without evidence, so the second call is not made and the first result counts for both (the table
says on how many traces the prompts differed; its seconds count only calls made). Rows go to ``--out`` as they
finish; re-running skips them, and the table covers every row in the folder.

    python -m benchmarks.localization --data ../shared/data --limit 8 --out benchmarks/results/localization
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import add_smoke_option, scripted_llm
from benchmarks.evaluation.loaders import BENCHMARKS, EvalItem, load_benchmark
from benchmarks.evaluation.metrics import Prediction, compute_metrics, mean_se
from reflect_otel import prompts
from reflect_otel.attribution import stages
from reflect_otel.attribution._run import AttributionRun
from reflect_otel.attribution.baselines import BASELINES
from reflect_otel.config import ReflectConfig
from reflect_otel.datasets.bbm import BBMVerifier
from reflect_otel.demo.examples import example_path
from reflect_otel.errors import LLMError
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.factory import NoModel, make_llm

FREE = ("evidence", "first-step", "last-step")
METHODS = (*FREE, "aao", "localize", "localize-no-evidence")


def _context(item: EvalItem, config: ReflectConfig, llm: StructuredLLM, *, evidence: bool) -> prompts.PromptContext:
    """The prompts' context as an attribution on ``llm`` builds it, with the evidence checks' findings or without."""
    settings = config.model_copy(update={"evidence_in_prompts": evidence})
    verifier = BBMVerifier() if item.benchmark == "bbm" else OracleVerifier()
    run = AttributionRun("localize", llm, item.trace, {}, verifier)
    return run.prompt_context(
        item.trace,
        item.expected,
        include_expected=settings.include_expected_answer,
        domain_context=item.domain_context,
        config=settings,
    )


def _timed(call: Callable[[], int | None]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        step, error = call(), None
    except LLMError as failed:
        step, error = None, str(failed)[:300]
    return {"predicted": step, "failed": error is not None, "error": error, "seconds": time.perf_counter() - started}


def predictions(item: EvalItem, llm: StructuredLLM, config: ReflectConfig) -> dict[str, dict[str, Any]]:
    """Every method's step for ``item`` (1-based, None when it gave none)."""
    verifier = BBMVerifier() if item.benchmark == "bbm" else OracleVerifier()
    out: dict[str, dict[str, Any]] = {}
    for name in FREE:
        method = BASELINES[name](NoModel(), verifier=verifier, config=config)
        out[name] = _timed(lambda m=method: m.attribute(item.trace, expected=item.expected).step_index)
    with_evidence = _context(item, config, llm, evidence=True)
    out["localize"] = _timed(lambda: stages.localize(llm, with_evidence, item.trace).step_index)
    if with_evidence.evidence:
        without = _context(item, config, llm, evidence=False)
        out["localize-no-evidence"] = _timed(lambda: stages.localize(llm, without, item.trace).step_index)
    else:
        out["localize-no-evidence"] = out["localize"] | {"same_prompt": True}
    aao = BASELINES["aao"](llm, verifier=verifier, config=config)

    def aao_step() -> int | None:
        record = aao.attribute(item.trace, expected=item.expected, domain_context=item.domain_context)
        if record.failed:
            raise LLMError("; ".join(e.message for e in record.errors) or "aao failed")
        return record.step_index

    out["aao"] = _timed(aao_step)
    return out


def _sample(benchmark: str, data: Path, limit: int, seed: int) -> list[EvalItem]:
    items = load_benchmark(benchmark, data)
    random.Random(seed).shuffle(items)
    return items[:limit]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| benchmark | method | traces | failed | EM | Off-1 | gave a step | s/trace |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for benchmark in BENCHMARKS:
        mine = [r for r in rows if r["benchmark"] == benchmark]
        if not mine:
            continue
        differed = sum(1 for r in mine if not r["methods"]["localize-no-evidence"].get("same_prompt"))
        for method in METHODS:
            scored = [
                Prediction(
                    r["trace_id"],
                    r["methods"][method]["predicted"],
                    frozenset(r["gold"]),
                    failed=r["methods"][method]["failed"],
                )
                for r in mine
            ]
            m = compute_metrics(scored)
            gave = mean_se([1.0 if p.predicted is not None else 0.0 for p in scored if not p.failed])
            made = [r["methods"][method]["seconds"] for r in mine if not r["methods"][method].get("same_prompt")]
            seconds = f"{sum(made) / len(made):.1f}" if made else "-"
            label = method + (f" (prompts differed on {differed})" if method == "localize-no-evidence" else "")
            lines.append(
                f"| {benchmark} | {label} | {m['traces']} | {m['failed']} | {_pct(m['exact_match'])} | "
                f"{_pct(m['off_by_one'])} | {_pct(gave)} | {seconds} |"
            )
    return "\n".join(lines)


def _pct(stat: dict[str, float | int]) -> str:
    return f"{stat['mean'] * 100:.1f} ({stat['se'] * 100:.1f})" if stat.get("n") else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="the dataset folder, e.g. ../shared/data")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS), help="comma-separated (default: all)")
    parser.add_argument("--limit", type=int, default=8, help="traces per benchmark (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="folder for rows.jsonl and table.md (resumable)")
    add_smoke_option(parser)
    args = parser.parse_args(argv)
    if args.smoke:  # the BIG-Bench-Mistake example shipped with the package, a scripted model, a folder thrown away
        with tempfile.TemporaryDirectory(prefix="reflect-localization-smoke-") as folder:
            (Path(folder) / "bbm").mkdir()
            shutil.copy(example_path("bbm/multistep_arithmetic.jsonl"), Path(folder) / "bbm")
            return run(Path(folder), ["bbm"], 2, args.seed, Path(folder) / "out", scripted_llm())
    if args.data is None or args.out is None:
        parser.error("give --data and --out (or --smoke)")
    chosen = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown or args.limit < 1:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}" if unknown else "--limit must be >= 1")
    return run(args.data, chosen, args.limit, args.seed, args.out, make_llm())


def run(data: Path, chosen: list[str], limit: int, seed: int, out_folder: Path, llm: StructuredLLM) -> int:
    """Every method on ``limit`` sampled traces of each benchmark in ``chosen``, rows appended to ``out_folder``."""
    out_folder.mkdir(parents=True, exist_ok=True)
    path = out_folder / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    done = {(r["benchmark"], r["trace_id"]) for r in rows}
    config = ReflectConfig()
    items = [item for b in chosen for item in _sample(b, data, limit, seed)]
    with path.open("a", encoding="utf-8") as out:
        for number, item in enumerate(items, start=1):
            if (item.benchmark, item.trace.trace_id) in done:
                continue
            started = time.perf_counter()
            row = {
                "benchmark": item.benchmark,
                "trace_id": item.trace.trace_id,
                "steps": len(item.trace.steps),
                "gold": sorted(item.gold_steps),
                "model": llm.model_name,
                "methods": predictions(item, llm, config),
            }
            out.write(json.dumps(row) + "\n")
            out.flush()
            rows.append(row)
            print(
                f"[{number}/{len(items)}] {item.benchmark} {item.trace.trace_id[:12]} gold {row['gold'][:4]} "
                + " ".join(f"{k}={v['predicted']}" for k, v in row["methods"].items())
                + f" ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    rendered = table(rows)
    (out_folder / "table.md").write_text(rendered + "\n", encoding="utf-8")
    print(rendered)
    print(f"localization_traces={len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
