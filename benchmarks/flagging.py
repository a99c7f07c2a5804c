"""Flagging without an expected answer, measured on labelled runs: recall, precision and F1 of each verifier's
HIGH_ERROR_SIGNAL, with Wilson intervals, model calls, agent runs and seconds per run.

Verifiers (``--verifiers``, any of): ``evidence`` (a critical evidence finding, no model call), ``proxy`` (the
plan-anchored verifier: evidence, then the audit), ``consistency`` (the agent run again ``--samples`` times at
``--temperature``; an answer fewer than half of its resamples reproduce is flagged) and ``combined`` (evidence, then
consistency, then the audit where they do not decide, shown the resamples; see ``reflect_otel.flagging``).

Runs: ``--live RESULTS`` reads the ``results.jsonl`` of an ``eval --benchmark wtq-live`` run, each run once (the
file has a row per finished method; the last row of a question wins), right and wrong runs as they came; the
consistency check re-runs the table agent on each run's question (``--data``, default the run's own, from its
``run_config.json``). ``eval --benchmark wtq-live --method none --runs N`` records N runs without attributing
any (the cheapest labelled runs: one agent run each). ``--bbm DATA`` takes equal numbers of right and wrong BIG-Bench-Mistake chains of thought,
resampled by the chain-of-thought replay adapter. The proxy and combined audits call the configured model (the
local server by default); a verifier that failed on a run is counted apart, never scored.

Long: every model call and agent run is kept in ``--out DIR/flagging.jsonl`` as it finishes (with ``--live``, by
default the ``flagging`` folder beside the results), and a second run with the same ``--out`` resumes (what is
there is not run again). The precision per basis of the ``--calibrate`` verifier's verdicts (default combined) is
written to ``DIR/calibration.json`` (or ``--calibration-out FILE``), for ``REFLECT_PROXY_CALIBRATION``: no
calibration file, no confidence shown.

    python -m benchmarks.flagging --live benchmarks/results/RUN/results.jsonl \\
        --verifiers evidence,proxy,consistency,combined
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS, add_smoke_option, scripted_llm
from reflect_otel._stats import wilson
from reflect_otel.calibration import BASES, ConfidenceCalibration
from reflect_otel.consistency import ConsistencyVerifier
from reflect_otel.datasets.bbm import BBMVerifier, read_bbm
from reflect_otel.evaluation.run_config import write_run_config
from reflect_otel.evidence import find_evidence
from reflect_otel.flagging import CombinedVerifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.factory import make_llm
from reflect_otel.llm.recording import CallLog, RecordingLLM
from reflect_otel.proxy_verifier import PlanAnchoredVerifier, ProxyVerifierConfig, critical_evidence_verdict
from reflect_otel.replay import SamplesRuns, resampler
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import ConsistencyCheck, Verdict

VERIFIERS = ("evidence", "proxy", "consistency", "combined")
VERIFIER_OF = {"evidence": "evidence", "proxy": "plan_anchored", "consistency": "consistency", "combined": "combined"}
"""Each benchmark verifier's name on its verdicts: the name a calibration applies to."""
_NO_CALIBRATION = ConfidenceCalibration()  # measured here, so nothing earlier may colour the verdicts


@dataclass(frozen=True, slots=True)
class Labelled:
    key: str
    trace: StructuredTrace
    wrong: bool
    question_id: str | None = None


def live_runs(results: Path) -> list[Labelled]:
    """Each run of ``results.jsonl`` once: the last row of a question that carries its trace. A last line cut short
    (the eval stopped mid-write; its resume mends the file) is left out, and so is a run whose answer was undecided
    (``correct`` None: neither right nor wrong, so no label to score a verifier against)."""
    rows: dict[str, dict[str, Any]] = {}
    text = results.read_text(encoding="utf-8")
    lines = text.splitlines()
    if text and not text.endswith("\n"):
        lines = lines[:-1]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise SystemExit(
                f"{results}:{number}: not a JSON line; is this an eval --benchmark wtq-live results.jsonl?"
            ) from None
        if isinstance(row, dict) and "trace" in row and "correct" in row:
            rows[str(row.get("question_id") or number)] = row
    return [
        Labelled(key, StructuredTrace.model_validate(row["trace"]), wrong=row["correct"] is False, question_id=key)
        for key, row in rows.items()
        if row["correct"] is not None
    ]


def bbm_runs(data: Path, per_class: int, seed: int) -> list[Labelled]:
    verifier = BBMVerifier()
    right: list[Labelled] = []
    wrong: list[Labelled] = []
    for path in sorted((data / "bbm").glob("*.jsonl")):
        for item in read_bbm(path):
            verdict = verifier.verify(item.trace, expected=item.expected).is_correct
            key = f"{path.stem}:{item.trace.trace_id}"
            if verdict is True and not item.trace.labels:
                right.append(Labelled(key, item.trace, wrong=False))
            elif verdict is False and item.trace.labels:
                wrong.append(Labelled(key, item.trace, wrong=True))
    rng = random.Random(seed)
    rng.shuffle(right)
    rng.shuffle(wrong)
    return right[:per_class] + wrong[:per_class]


@dataclass
class Measured:
    """One verifier's verdict on one run, and what it cost. ``verdict`` None, or one with ``error`` set: the
    verifier failed on the run (counted apart, never scored, and measured again on resume)."""

    verdict: Verdict | None
    calls: int = 0
    agent_runs: int = 0
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.verdict is None or self.verdict.error is not None

    def row(self, key: str, verifier: str) -> dict[str, Any]:
        return {
            "key": key,
            "verifier": verifier,
            "verdict": self.verdict.model_dump(mode="json") if self.verdict is not None else None,
            "calls": self.calls,
            "agent_runs": self.agent_runs,
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def of(cls, row: dict[str, Any]) -> Measured:
        verdict = Verdict.model_validate(row["verdict"]) if row.get("verdict") else None
        return cls(verdict, int(row["calls"]), int(row["agent_runs"]), float(row["seconds"]))


class Journal:
    """``flagging.jsonl``: its first line the settings measured under, then each measurement appended as it
    finishes (failures are not kept: a resume measures them again). A resume with other settings is refused; a
    last line cut by a stop is dropped."""

    def __init__(self, path: Path | None, settings: dict[str, Any]) -> None:
        self.path = path
        self.done: dict[tuple[str, str], Measured] = {}
        if path is None:
            return
        if not path.is_file():
            path.write_text(json.dumps({"settings": settings}) + "\n", encoding="utf-8")
            return
        lines = path.read_text(encoding="utf-8").splitlines()
        header = json.loads(lines[0]) if lines else {}
        if header.get("settings") != settings:
            raise SystemExit(
                f"{path} was measured with {header.get('settings')}, not {settings}: give another --out to measure "
                "with these settings"
            )
        for number, line in enumerate(lines[1:], start=2):
            try:
                row = json.loads(line)
            except ValueError:
                if number == len(lines):  # cut by a stop mid-write
                    continue
                raise SystemExit(f"{path}:{number}: not a JSON line; the journal is damaged") from None
            self.done[(row["key"], row["verifier"])] = Measured.of(row)

    def get(self, key: str, verifier: str, measure: Callable[[], Measured]) -> Measured:
        if (key, verifier) in self.done:
            return self.done[(key, verifier)]
        measured = measure()
        if measured.failed:
            return measured
        self.done[(key, verifier)] = measured
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(measured.row(key, verifier)) + "\n")
        return measured


class _KnownCheck(ConsistencyVerifier):
    """The consistency check already made for this run (its resamples are not run again for the combined
    verdict: the same agent runs, counted once)."""

    def __init__(self, outcome: ConsistencyCheck | str) -> None:
        super().__init__(calibration=_NO_CALIBRATION)
        self.outcome = outcome

    def check(self, trace: StructuredTrace) -> ConsistencyCheck | str:
        return self.outcome


@dataclass
class Bench:
    llm: StructuredLLM | None
    runs_for: Callable[[Labelled], SamplesRuns | None]
    journal: Journal
    samples: int
    temperature: float
    config: ProxyVerifierConfig = field(default_factory=lambda: ProxyVerifierConfig(calibration=_NO_CALIBRATION))

    def measure(self, name: str, run: Labelled) -> Measured:
        if name == "evidence":
            flagged = critical_evidence_verdict(find_evidence(run.trace), "evidence", _NO_CALIBRATION)
            return Measured(flagged or Verdict(verifier="evidence", is_correct=None, confidence=None))
        if name == "proxy":
            return self.journal.get(run.key, name, lambda: self._proxy(run))
        if name == "consistency":
            return self.journal.get(run.key, name, lambda: self._consistency(run))
        if name == "combined":
            return self._combined(run)
        raise ValueError(name)

    def _proxy(self, run: Labelled) -> Measured:
        assert self.llm is not None
        log = CallLog()
        started = time.perf_counter()
        verdict = PlanAnchoredVerifier(RecordingLLM(self.llm, log), config=self.config).verify(run.trace, expected=None)
        return Measured(verdict, len(log.calls), 0, time.perf_counter() - started)

    def _consistency(self, run: Labelled) -> Measured:
        source = self.runs_for(run)
        started = time.perf_counter()
        verifier = ConsistencyVerifier(
            source, samples=self.samples, temperature=self.temperature, calibration=_NO_CALIBRATION
        )
        verdict = verifier.verify(run.trace, expected=None)
        if source is None:  # nothing could re-run this run's agent: a failure of the setup, not a verdict
            verdict = verdict.model_copy(update={"error": verdict.reasoning})
        runs = verdict.consistency.agent_runs if verdict.consistency is not None else 0
        return Measured(verdict, 0, runs, time.perf_counter() - started)

    def _combined(self, run: Labelled) -> Measured:
        """The combined verifier itself, its consistency check the one measured for ``consistency`` (the same agent
        runs, counted once); its audit (where evidence and the check do not decide) journaled as its own."""
        consistency = self.measure("consistency", run)
        check = consistency.verdict.consistency if consistency.verdict is not None else None
        outcome: ConsistencyCheck | str = check if check is not None else "no consistency check"

        def verdict() -> Measured:
            assert self.llm is not None
            log = CallLog()
            started = time.perf_counter()
            proxy = PlanAnchoredVerifier(RecordingLLM(self.llm, log), config=self.config)
            combined = CombinedVerifier(proxy, _KnownCheck(outcome), calibration=_NO_CALIBRATION)
            judged = combined.verify(run.trace, expected=None)
            return Measured(judged, len(log.calls), 0, time.perf_counter() - started)

        # a verdict made on a failed check is not journaled: a resume measures the check again, and this with it
        own = verdict() if consistency.failed else self.journal.get(run.key, "combined", verdict)
        used = own.verdict is not None and own.verdict.basis != "critical_evidence"  # evidence decides with no check
        return Measured(
            own.verdict,
            own.calls,
            consistency.agent_runs if used else 0,
            own.seconds + (consistency.seconds if used else 0.0),
        )


def _rate(hits: int, total: int) -> str:
    if total == 0:
        return "n/a"
    return f"{hits / total:.2f}"


def _interval(hits: int, total: int) -> str:
    low, high = wilson(hits, total)
    return f"[{low:.2f}, {high:.2f}] ({hits} of {total})" if total else "(none)"


def report(name: str, runs: list[Labelled], results: list[Measured]) -> tuple[str, Counter[str], Counter[str]]:
    """The verifier's lines, and per basis the verdicts right and judged (what a calibration holds). A run the
    verifier failed on is counted apart; one it could not judge (UNCERTAIN) is not flagged."""
    flagged_wrong = flagged_right = missed = failed = 0
    right: Counter[str] = Counter()
    judged: Counter[str] = Counter()
    for run, measured in zip(runs, results, strict=True):
        verdict = measured.verdict
        if verdict is None or measured.failed:
            failed += 1
            continue
        flagged = verdict.is_correct is False
        flagged_wrong += flagged and run.wrong
        flagged_right += flagged and not run.wrong
        missed += (not flagged) and run.wrong
        if verdict.basis and verdict.is_correct is not None:
            judged[verdict.basis] += 1
            right[verdict.basis] += verdict.is_correct is (not run.wrong)
    wrong_runs, flagged_runs = flagged_wrong + missed, flagged_wrong + flagged_right
    recall = flagged_wrong / wrong_runs if wrong_runs else 0.0
    precision = flagged_wrong / flagged_runs if flagged_runs else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    count = len(runs) or 1
    lines = [
        f"flagging verifier={name} runs={len(runs)} recall={_rate(flagged_wrong, wrong_runs)} "
        f"precision={_rate(flagged_wrong, flagged_runs)} f1={f1:.2f}",
        f"  recall 95% {_interval(flagged_wrong, wrong_runs)} wrong runs flagged; precision 95% "
        f"{_interval(flagged_wrong, flagged_runs)} flagged runs wrong; the verifier failed on {failed} runs",
        f"  per run: {sum(m.calls for m in results) / count:.2f} model calls, "
        f"{sum(m.agent_runs for m in results) / count:.2f} agent runs, {sum(m.seconds for m in results) / count:.1f} s",
    ]
    if judged:
        shown = [f"{basis} {right[basis]} of {judged[basis]} right" for basis in BASES if judged[basis]]
        lines.append("  verdicts per basis: " + "; ".join(shown))
    return "\n".join(lines), right, judged


def progress_line(name: str, number: int, total: int, run: Labelled, measured: Measured) -> str:
    """One run measured (or read back from the journal), for a long measurement's log: its verdict and cost, or why
    the verifier failed on it (the journal keeps no failure, and the report only counts them)."""
    verdict = measured.verdict
    if verdict is None or measured.failed:
        why = (verdict.error or verdict.reasoning) if verdict is not None else "no verdict"
        outcome = f"the verifier failed: {' '.join(why.split())[:300]}"
    else:
        outcome = {False: "flagged", True: "not flagged", None: "uncertain (not flagged)"}[verdict.is_correct]
        outcome += f" on {verdict.basis}" if verdict.basis else ""
    return (
        f"[{name} {number}/{total}] {run.key} ({'wrong' if run.wrong else 'right'} run): {outcome}; "
        f"{measured.calls} model calls, {measured.agent_runs} agent runs, {measured.seconds:.1f} s"
    )


def _live_resampler(results: Path, data: Path | None, llm: StructuredLLM | None) -> Callable[[Labelled], Any]:
    """The table agent rebuilt on each run's question with the run's step limit (``run_config.json``), its replay
    adapter resampling (the model: ``llm``). Runs of the SQL agent are refused: only the table agent is rebuilt here."""
    from reflect_otel.cli.evaluate import table_agent_rebuilt
    from reflect_otel.demo.wtq import load_questions
    from reflect_otel.online.setup import instrumented_provider

    config_path = results.parent / "run_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    folder = data or (Path(config["data"]) if config.get("data") else None)
    if folder is None:
        raise SystemExit("--live: give --data (the WikiTableQuestions folder the run used); no run_config.json says")
    folder = folder / "wtq" if (folder / "wtq" / "questions.tsv").is_file() else folder
    questions = {q.id: q for q in load_questions(data=folder)}
    assert llm is not None
    if config.get("agent", "table") != "table":
        raise SystemExit(
            f"--live {results}: the runs were made by the {config['agent']} agent; this benchmark rebuilds only the "
            "table agent to resample a stored run (the SQL agent's adapter resamples runs made in its process: "
            "`collect --attribute --verifier combined` or observe()); re-run with eval --benchmark wtq-live --agent "
            "table, or leave consistency and combined out of --verifiers"
        )
    rebuild = table_agent_rebuilt(  # resampled, never taken as repeatable
        llm,
        instrumented_provider(),
        max_steps=int(config.get("max_steps") or 6),  # runs recorded before it was kept: the default, 6
        deterministic=False,
    )

    def runs_for(run: Labelled) -> SamplesRuns | None:
        question = questions.get(run.question_id or "")
        return resampler(rebuild(question, run.trace).replay) if question is not None else None

    return runs_for


def _bbm_resampler(llm: StructuredLLM | None) -> Callable[[Labelled], SamplesRuns | None]:
    from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter

    assert llm is not None
    return lambda run: resampler(ReasoningReplayAdapter(llm))


def _no_resampler(_run: Labelled) -> SamplesRuns | None:
    return None


def _smoke_resampler(run: Labelled) -> SamplesRuns | None:
    """Under --smoke: resamples that repeat the run (the plumbing is checked, nothing is measured)."""
    from reflect_otel.testing import ScriptedResampler

    def repeat(trace: StructuredTrace, _sample: int, _t: float) -> Iterator[dict[str, Any]]:
        for step in trace.steps:
            yield (
                {"tool": step.tool_name, "args": step.tool_args, "reasoning": step.reasoning}
                if step.tool_name
                else {"reasoning": trace.final_answer or step.reasoning}
            )

    return ScriptedResampler(lambda trace, sample, t: list(repeat(trace, sample, t)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bbm", type=Path, help="dataset folder holding bbm/*.jsonl")
    parser.add_argument("--live", type=Path, help="results.jsonl of eval --benchmark wtq-live")
    parser.add_argument("--data", type=Path, help="--live: the WikiTableQuestions folder (default: the run's own)")
    parser.add_argument("--per-class", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verifiers", default="evidence,proxy,consistency,combined")
    parser.add_argument("--samples", type=int, default=3, help="resamples per run (REFLECT_FLAG_SAMPLES's default)")
    parser.add_argument("--temperature", type=float, default=0.7, help="the resamples' temperature")
    parser.add_argument("--limit", type=int, help="at most N runs (in file order)")
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for flagging.jsonl (every measurement kept; a second run resumes) and calibration.json "
        "(default with --live: the folder 'flagging' beside the results; with --smoke or --bbm: none)",
    )
    parser.add_argument("--calibrate", default="combined", help="the verifier whose verdicts the calibration counts")
    parser.add_argument(
        "--calibration-out", type=Path, help="write the per-basis precision here (default: OUT/calibration.json)"
    )
    add_smoke_option(parser)
    args = parser.parse_args()
    if args.smoke:  # the demo agent's 7 live runs kept in the repository, the auditor scripted
        args.live, args.bbm = RESULTS / "wtq-live-qwen2.5-coder-1.5b" / "results.jsonl", None
    if (args.bbm is None) == (args.live is None):
        parser.error("give exactly one of --bbm DATA and --live RESULTS")
    names = [n.strip() for n in args.verifiers.split(",") if n.strip()]
    unknown = [n for n in names if n not in VERIFIERS]
    if unknown:
        parser.error(f"unknown verifier(s) {unknown}; choose from {', '.join(VERIFIERS)}")
    if args.live is not None and not args.live.is_file():
        parser.error(f"--live {args.live}: no such file (the results.jsonl of an eval --benchmark wtq-live run)")
    if args.calibration_out and args.calibrate not in names:
        parser.error(f"--calibrate {args.calibrate}: not among --verifiers {','.join(names)}")
    if args.out is None and args.live is not None and not args.smoke:
        args.out = args.live.parent / "flagging"
    calibration_out = args.calibration_out
    if calibration_out is None and args.out is not None and args.calibrate in names:
        calibration_out = args.out / "calibration.json"
    if calibration_out is None:  # said before the hours of measuring, not after
        print(f"no calibration will be written: give --out DIR or --calibration-out FILE, with {args.calibrate} "
              "among --verifiers", file=sys.stderr)  # fmt: skip
    runs = bbm_runs(args.bbm, args.per_class, args.seed) if args.bbm else live_runs(args.live)
    runs = runs[: args.limit] if args.limit else runs
    wrong = sum(r.wrong for r in runs)
    print(f"{len(runs)} runs: {wrong} wrong, {len(runs) - wrong} right")
    needs_model = bool({"proxy", "consistency", "combined"} & set(names))
    llm = (scripted_llm() if args.smoke else make_llm()) if needs_model else None
    runs_for: Callable[[Labelled], SamplesRuns | None] = _no_resampler
    if args.smoke:
        runs_for = _smoke_resampler
    elif {"consistency", "combined"} & set(names):
        runs_for = _live_resampler(args.live, args.data, llm) if args.live is not None else _bbm_resampler(llm)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    settings = {
        "runs": str(args.live or args.bbm),
        "per_class": args.per_class if args.bbm else None,
        "seed": args.seed if args.bbm else None,
        "samples": args.samples,
        "temperature": args.temperature,
        "model": llm.model_name if llm is not None else None,
        "smoke": args.smoke,
    }
    journal = Journal(args.out / "flagging.jsonl" if args.out is not None else None, settings)
    if args.out is not None:  # the commit and sessions that measured the journal's rows
        write_run_config(args.out, {"benchmark": "flagging", **settings}, defining=tuple(settings))
    bench = Bench(llm, runs_for, journal, args.samples, args.temperature)
    data = f"--bbm {args.bbm} --per-class {args.per_class} --seed {args.seed}" if args.bbm else f"--live {args.live}"
    counted: dict[str, tuple[Counter[str], Counter[str]]] = {}
    for name in names:
        results = []
        for number, run in enumerate(runs, start=1):
            results.append(bench.measure(name, run))
            print(progress_line(name, number, len(runs), run, results[-1]), file=sys.stderr, flush=True)
        text, right, judged = report(name, runs, results)
        counted[name] = (right, judged)
        print(text, flush=True)
    if calibration_out is None:
        print("no calibration written")
    else:
        right, judged = counted[args.calibrate]
        verdicts = sum(judged.values())  # the runs the verifier judged (a run it failed on is in no count)
        calibration = ConfidenceCalibration(
            verifier=VERIFIER_OF[args.calibrate],
            model=llm.model_name if llm is not None else "",
            samples=args.samples,
            temperature=args.temperature,
            counts={b: (right[b], judged[b]) for b in BASES if judged[b]},
            source=f"{args.calibrate}'s verdicts on {verdicts} of {len(runs)} labelled runs ({wrong} wrong), "
            f"{date.today()}: python -m benchmarks.flagging {data} --verifiers {','.join(names)} --calibrate "
            f"{args.calibrate} --samples {args.samples} --temperature {args.temperature}",
        )
        calibration_out.write_text(calibration.model_dump_json(indent=2) + "\n", encoding="utf-8")
        print(f"wrote {calibration_out} (use it with REFLECT_PROXY_CALIBRATION={calibration_out})")
    print(f"flagging_runs={len(runs)}")


if __name__ == "__main__":
    main()
