"""Flagging without an expected answer, measured on labelled runs: per verifier, how well its score ranks a wrong run
above a right one (AUROC with DeLong's 95% interval), and its flag at a threshold (recall, precision, specificity
with Wilson intervals, beside the base rate and flagging everything), with the model calls, agent runs and seconds
each run cost.

Verifiers (``--verifiers``, any of): ``evidence`` (the trace alone, no model call: a critical finding, or the fitted
map of the trace's features), ``proxy`` (the plan-anchored verifier: evidence, then the audit), ``consistency`` (the
agent run again, at most ``--samples`` times at ``--temperature``, stopped once one side leads by ``--stop-lead``;
its score the share of resamples that did not reproduce the answer in substance, or the fitted map of the resample
features) and ``combined`` (evidence, then the consistency score on every feature, then the audit where no check
decided; see ``reflect_otel.flagging.combined``).

Runs: ``--live RESULTS`` reads the ``results.jsonl`` of an ``eval --benchmark wtq-live`` run, each run once (the
file has a row per finished method; the last row of a question wins), right and wrong runs as they came, each
labelled again by the current judge where its row keeps the expected answer (an undecided answer has no label and
is left out; the report says how many labels differ from the recorded ones). The consistency check re-runs the
run's agent on its question (``--data``, default the run's own, from its ``run_config.json``): the table agent, or
the SQL agent from its recorded first request. ``eval --benchmark wtq-live --method none --runs N`` records N runs
without attributing any (the cheapest labelled runs: one agent run each). ``--bbm DATA`` takes equal numbers of
right and wrong BIG-Bench-Mistake chains of thought, resampled by the chain-of-thought replay adapter. The proxy and
combined audits call the configured model (the local server by default); a verifier that failed on a run is counted
apart, never scored.

Calibration, never in-sample: a first sample (the calibration seed) is measured and its ``calibration.json``
written (``--calibration-out``; by default ``DIR/calibration.json``): per verifier the score map fitted on its runs,
the threshold at which that map flagged ``--recall`` of its wrong runs, the precision per basis of the
``--calibrate`` verifier's verdicts, and the runs' question ids. A second sample, drawn after it, is then scored with
``--calibration FILE``, which refuses any run the file was fitted on, and reports what each feature adds. Without
``--calibration`` the scores are the uncalibrated ones (``reflect_otel.flagging.flag_score``). ``--cross-validate K`` scores a
single sample by maps fitted on its other folds: a design estimate, never the result.

Long: every model call and agent run is kept in ``--out DIR/flagging.jsonl`` as it finishes (with ``--live``, by
default the ``flagging`` folder beside the results), and a second run with the same ``--out`` resumes (what is
there is not run again); ``--journal-only`` reports from the journal alone, starting no model and no agent.

    python -m benchmarks.flagging --live benchmarks/results/RUN/results.jsonl --verifiers evidence,consistency,combined
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
from benchmarks._flag_report import (
    Scored,
    feature_lines,
    flag_line,
    operating_lines,
    out_of_fold_scores,
    samples_line,
)
from benchmarks.evaluation.run_config import write_run_config
from reflect_otel.datasets.bbm import BBMVerifier, read_bbm
from reflect_otel.errors import ConfigError
from reflect_otel.flagging.calibration import BASES, CalibrationSample, ConfidenceCalibration
from reflect_otel.flagging.combined import CombinedVerifier
from reflect_otel.flagging.consistency import (
    ConsistencyVerifier,
    consistency_basis,
    consistency_verdict,
    revoted,
    sequential_stop,
)
from reflect_otel.flagging.evidence import find_evidence
from reflect_otel.flagging.flag_score import (
    VERIFIER_FEATURES,
    ScoreMap,
    fit_score_map,
    recall_threshold,
    uncalibrated_score,
)
from reflect_otel.flagging.judge import Outcome, judge_answer
from reflect_otel.flagging.proxy_verifier import PlanAnchoredVerifier, ProxyVerifierConfig, critical_evidence_verdict
from reflect_otel.flagging.run_features import Feature, RunFeatures, run_features
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.factory import NoModel, make_llm
from reflect_otel.llm.recording import CallLog, RecordingLLM
from reflect_otel.replay import SamplesRuns, resampler
from reflect_otel.settings import settings as reflect_settings
from reflect_otel.trace import StructuredTrace
from reflect_otel.verdict import ConsistencyCheck, Verdict

VERIFIERS = ("evidence", "proxy", "consistency", "combined")
VERIFIER_OF = {"evidence": "evidence", "proxy": "plan_anchored", "consistency": "consistency", "combined": "combined"}
"""Each benchmark verifier's name on its verdicts: the name a calibration applies to."""
_NO_CALIBRATION = ConfidenceCalibration()  # measured here, so nothing earlier may colour the verdicts
_MEASURED_AT = 0.5
"""The threshold the journaled verdicts are made at; the report scores them again at its own."""


@dataclass(frozen=True, slots=True)
class Labelled:
    key: str
    trace: StructuredTrace
    wrong: bool
    question_id: str | None = None
    relabelled: bool = False
    """The current judge labels the run otherwise than its row recorded."""


def _outcome(row: dict[str, Any], trace: StructuredTrace) -> bool | None:
    """The run judged right (True), wrong (False) or undecided (None): by the current judge where the row keeps the
    expected answer, else as recorded."""
    expected = row.get("expected")
    if not isinstance(expected, str):
        return None if row["correct"] is None else bool(row["correct"])
    judged = judge_answer(trace.final_answer, expected, question=str(row.get("question") or trace.question))
    return None if judged.outcome is Outcome.UNDECIDED else judged.outcome is Outcome.RIGHT


def live_runs(results: Path) -> list[Labelled]:
    """Each run of ``results.jsonl`` once: the last row of a question that carries its trace, labelled by the
    current judge where the row keeps the expected answer (else as recorded). A last line cut short (the eval
    stopped mid-write; its resume mends the file) is left out, and so is a run whose answer is undecided (neither
    right nor wrong, so no label to score a verifier against)."""
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
    labelled = []
    for key, row in rows.items():
        trace = StructuredTrace.model_validate(row["trace"])
        right = _outcome(row, trace)
        if right is not None:
            recorded = row["correct"]
            moved = recorded is None or bool(recorded) != right
            labelled.append(Labelled(key, trace, wrong=not right, question_id=key, relabelled=moved))
    return labelled


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
    verifier failed on the run (counted apart, never scored; how the journal keeps it: :class:`Journal`)."""

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
    finishes, failures too (with what they cost; a later session measures a failed run again and its row, appended,
    is the one read). A resume with other settings is refused; a last line cut by a stop is cut off the file."""

    def __init__(self, path: Path | None, settings: dict[str, Any], *, appends: bool = True) -> None:
        self.path = path
        self.settings = settings
        self.appends = appends and path is not None
        """Measurements are appended to the file (not when only reported from)."""
        self.cut_at: int | None = None
        """Report each check as the stopping rule of this lead would have drawn it (from a journal of fixed counts)."""
        self.done: dict[tuple[str, str], Measured] = {}
        self._failed_here: set[tuple[str, str]] = set()
        if path is None:
            return
        if self.appends:  # a journal only reported from is left as it is (its measurement may be running)
            if path.is_file():
                _cut_unfinished_line(path)
            if not path.is_file() or not path.stat().st_size:  # new, or its header line cut: start it
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
                if number == len(lines) and not self.appends:  # being written as it is read
                    continue
                raise SystemExit(f"{path}:{number}: not a JSON line; the journal is damaged") from None
            self.done[(row["key"], row["verifier"])] = Measured.of(row)

    def get(self, key: str, verifier: str, measure: Callable[[], Measured]) -> Measured:
        done = self.done.get((key, verifier))
        if done is not None and (not done.failed or not self.appends or (key, verifier) in self._failed_here):
            return done
        measured = measure()
        if measured.failed:
            self._failed_here.add((key, verifier))
        self.done[(key, verifier)] = measured
        if self.path is not None and self.appends:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(measured.row(key, verifier)) + "\n")
        return measured


def _cut_unfinished_line(path: Path) -> None:
    """Cut a last line a stop left unfinished (no newline) off ``path``, so that the next row starts a line."""
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        with path.open("r+b") as file:
            file.truncate(raw.rfind(b"\n") + 1)


def journaled_check(journal: Journal, run: Labelled) -> ConsistencyCheck | None:
    """The run's consistency check as journaled (None when not measured, or when it failed), its resamples voted
    again by the judge as it is now (a journal kept from before the judge changed votes as a new one would), and
    cut where ``journal.cut_at`` stops it (:func:`cut_at_lead`)."""
    done = journal.done.get((run.key, "consistency"))
    check = done.verdict.consistency if done is not None and not done.failed and done.verdict is not None else None
    if check is None:
        return None
    check = revoted(check, question=run.trace.question)
    return cut_at_lead(check, journal.cut_at) if journal.cut_at else check


def cut_at_lead(check: ConsistencyCheck, stop_lead: int) -> ConsistencyCheck:
    """``check`` as the stopping rule ``stop_lead`` would have drawn it: its resamples up to the one at which the rule
    stopped (they are drawn one at a time, in order, so a check of every resample holds each shorter one)."""
    kept = []
    for resample in check.runs:
        kept.append(resample)
        finished = [r for r in kept if r.error is None]
        agreeing = sum(1 for r in finished if r.agrees)
        if sequential_stop(agreeing, len(finished) - agreeing, stop_lead=stop_lead):
            break
    return check.model_copy(update={"runs": tuple(kept), "stop_lead": stop_lead})


def read_journal(path: Path) -> Journal:
    """The journal at ``path`` with the settings it was measured under (to report from, never to measure more)."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    if not lines:
        raise SystemExit(f"{path}: no flagging journal there (measure first, without --journal-only)")
    return Journal(path, json.loads(lines[0]).get("settings"), appends=False)


class _KnownCheck(ConsistencyVerifier):
    """The consistency check already made for this run (its resamples are not run again for the combined
    verdict: the same agent runs, counted once)."""

    def __init__(self, outcome: ConsistencyCheck | str) -> None:
        super().__init__(threshold=_MEASURED_AT, calibration=_NO_CALIBRATION)
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
    stop_lead: int | None = None
    config: ProxyVerifierConfig = field(default_factory=lambda: ProxyVerifierConfig(calibration=_NO_CALIBRATION))

    def measure(self, name: str, run: Labelled) -> Measured:
        if name == "evidence":
            flagged = critical_evidence_verdict(find_evidence(run.trace), "evidence", _NO_CALIBRATION)
            return Measured(flagged or Verdict(verifier="evidence", is_correct=None, confidence=None))
        if name == "proxy":
            return self.journal.get(run.key, name, lambda: self._proxy(run))
        if name == "consistency":
            return self._judged_now(run, self.journal.get(run.key, name, lambda: self._consistency(run)))
        if name == "combined":
            return self._combined(run)
        raise ValueError(name)

    def _proxy(self, run: Labelled) -> Measured:
        assert self.llm is not None
        log = CallLog()
        started = time.perf_counter()
        verdict = PlanAnchoredVerifier(RecordingLLM(self.llm, log), config=self.config).verify(run.trace, expected=None)
        return Measured(verdict, _requests(log), 0, time.perf_counter() - started)

    def _consistency(self, run: Labelled) -> Measured:
        started = time.perf_counter()
        try:
            source = self.runs_for(run)
        except Exception as error:  # the run's agent cannot be rebuilt (a trace that no longer restores): this run
            failed = Verdict(verifier="consistency", is_correct=None, confidence=None, error=f"{NO_RESAMPLER}{error}")
            return Measured(failed, 0, 0, time.perf_counter() - started)
        verifier = ConsistencyVerifier(
            source,
            samples=self.samples,
            temperature=self.temperature,
            stop_lead=self.stop_lead,
            threshold=_MEASURED_AT,
            calibration=_NO_CALIBRATION,
        )
        verdict = verifier.verify(run.trace, expected=None)
        if source is None:  # nothing could re-run this run's agent: a failure of the setup, not a verdict
            verdict = verdict.model_copy(update={"error": f"{NO_RESAMPLER}{verdict.reasoning}"})
        runs = verdict.consistency.agent_runs if verdict.consistency is not None else 0
        return Measured(verdict, 0, runs, time.perf_counter() - started)

    def check_of(self, run: Labelled) -> ConsistencyCheck | None:
        return journaled_check(self.journal, run)

    def _judged_now(self, run: Labelled, measured: Measured) -> Measured:
        """The consistency verdict of the journaled check, its resamples voted by the judge as it is now."""
        check = self.check_of(run)
        if measured.failed or check is None:
            return measured
        verdict = consistency_verdict(run.trace, check, "consistency", _NO_CALIBRATION, threshold=_MEASURED_AT)
        cut = check.agent_runs != measured.agent_runs  # the journal keeps no resample's own seconds
        return Measured(verdict, measured.calls, check.agent_runs, math.nan if cut else measured.seconds)

    def _combined(self, run: Labelled) -> Measured:
        """The combined verifier itself, its consistency check the one measured for ``consistency`` (the same agent
        runs, counted once); its audit, made only where neither the evidence nor the check decides, journaled as its
        own. Where the evidence does not decide and the check failed, it fails too (measured again with the check by
        a later session), as a report from the journal reads it."""
        consistency = self.measure("consistency", run)
        check = self.check_of(run) if not consistency.failed else None
        outcome: ConsistencyCheck | str = check if check is not None else "no consistency check"

        def verdict() -> Measured:
            assert self.llm is not None
            log = CallLog()
            started = time.perf_counter()
            proxy = PlanAnchoredVerifier(RecordingLLM(self.llm, log), config=self.config)
            combined = CombinedVerifier(proxy, _KnownCheck(outcome), calibration=_NO_CALIBRATION)
            judged = combined.verify(run.trace, expected=None)
            return Measured(judged, _requests(log), 0, time.perf_counter() - started)

        critical = critical_evidence_verdict(find_evidence(run.trace), "combined", _NO_CALIBRATION) is not None
        if not critical and consistency.failed:
            why = f"its consistency check failed: {_failure(consistency)}"
            failed = Verdict(verifier="combined", is_correct=None, confidence=None, error=why)
            return Measured(failed, 0, consistency.agent_runs, consistency.seconds)
        decided = check is not None and consistency_basis(check, threshold=_MEASURED_AT) is not None
        # the evidence or the check decides with no model call
        own = verdict() if critical or decided else self.journal.get(run.key, "combined", verdict)
        return Measured(
            own.verdict,
            own.calls,
            0 if critical else consistency.agent_runs,
            own.seconds + (0.0 if critical else consistency.seconds),
        )


def _requests(log: CallLog) -> int:
    """The model requests a verdict made: each recorded call's attempts (a schema repair is a request too)."""
    return sum(call.attempts for call in log.calls)


def score_of(
    name: str, run: Labelled, measured: Measured, check: ConsistencyCheck | None, calibration: ConfidenceCalibration
) -> float | None:
    """The score the verifier ``name`` gives the run online (``reflect_otel.flagging.combined``), on ``calibration``'s
    fitted map where it holds one: the evidence verifier 1 on a critical finding, else its map of the trace's
    features; the consistency verifier its check's map or share of resamples not reproducing the answer; the
    combined verifier 1 on a critical finding, else as the consistency verifier on every feature, else (no check
    decided) its audit's error signal; the proxy its audit's. None where it gives none."""
    verdict = measured.verdict
    if verdict is None or measured.failed:
        return None
    if name == "proxy":
        return verdict.score
    features = run_features(run.trace, check)
    fitted = calibration.score_map(VERIFIER_OF[name])
    if name in ("evidence", "combined") and features.critical_evidence:
        return 1.0
    if name == "evidence":
        return fitted.score(features) if fitted is not None else None
    if check is not None and consistency_basis(check) is not None:
        return fitted.score(features) if fitted is not None else uncalibrated_score(VERIFIER_OF[name], features)
    return verdict.score if name == "combined" else None


def _map_domain(name: str, features: RunFeatures, check: ConsistencyCheck | None) -> bool:
    """Whether the verifier's map scores a run with these features (the runs it is fitted on): the evidence map a
    run without a critical finding; the consistency map a run whose check decided; the combined map both."""
    critical = bool(features.critical_evidence)
    decided = check is not None and consistency_basis(check) is not None
    return {"evidence": not critical, "consistency": decided, "combined": decided and not critical}[name]


@dataclass
class Sample:
    """Per run: its label, its features, whether each scoring verifier's map scores it, and what was measured."""

    runs: list[Labelled]
    features: list[RunFeatures]
    checks: list[ConsistencyCheck | None]

    def domain(self, name: str) -> list[int]:
        """The runs the verifier's map scores (see :func:`_map_domain`)."""
        return [i for i, f in enumerate(self.features) if _map_domain(name, f, self.checks[i])]

    def fit(self, name: str, *, without: Feature | None = None) -> ScoreMap | None:
        """The verifier's map fitted on this sample's runs it scores (``without`` one feature); None, said on
        stderr, when they cannot fit one."""
        kept = self.domain(name)
        features = [f for f in VERIFIER_FEATURES[VERIFIER_OF[name]] if f != without]
        try:
            return fit_score_map(
                [self.features[i] for i in kept], [self.runs[i].wrong for i in kept], features=features
            )
        except ValueError as error:
            print(f"no score map fitted for {name}" + (f" without {without}" if without else "") + f": {error}",
                  file=sys.stderr)  # fmt: skip
            return None


def sample_of(journal: Journal, runs: list[Labelled]) -> Sample:
    checks = [journaled_check(journal, run) for run in runs]
    return Sample(runs, [run_features(r.trace, c) for r, c in zip(runs, checks, strict=True)], checks)


def report(
    name: str, runs: list[Labelled], results: list[Measured], scored: list[Scored], *, threshold: float
) -> tuple[str, Counter[str], Counter[str]]:
    """The verifier's lines (:func:`benchmarks._flag_report.flag_line` at ``threshold``, then its cost per run and
    its verdicts per basis), and per basis the journaled verdicts right and judged (what a calibration holds)."""
    right: Counter[str] = Counter()
    judged: Counter[str] = Counter()
    for run, measured in zip(runs, results, strict=True):
        verdict = measured.verdict
        if verdict is not None and not measured.failed and verdict.basis and verdict.is_correct is not None:
            judged[verdict.basis] += 1
            right[verdict.basis] += verdict.is_correct is (not run.wrong)
    count = len(runs) or 1
    lines = flag_line(name, scored, threshold)
    seconds = sum(m.seconds for m in results) / count
    lines.append(
        f"  per run (each run's last measurement): {sum(m.calls for m in results) / count:.2f} model calls, "
        f"{sum(m.agent_runs for m in results) / count:.2f} agent runs, "
        + ("seconds not measured (checks cut shorter)" if math.isnan(seconds) else f"{seconds:.1f} s")
    )
    needed = [
        m.verdict.consistency.agent_runs
        for m in results
        if m.verdict is not None and m.verdict.consistency is not None and m.agent_runs
    ]
    if needed:
        lines.append(f"  agent runs a checked run needed: {samples_line(needed)}")
    if judged:
        shown = [f"{basis} {right[basis]} of {judged[basis]} right" for basis in BASES if judged[basis]]
        lines.append("  verdicts per basis (at 0.5, uncalibrated): " + "; ".join(shown))
    return "\n".join(lines), right, judged


FAILURES_IN_A_ROW = 5
"""Runs in a row a verifier failed on after which the measurement stops: a dead model server fails every run in
seconds, and a report or calibration made of such failures would say nothing."""


NO_RESAMPLER = "no resampler: "
"""How a consistency failure that no retry mends begins (the run's agent cannot be rebuilt)."""


def _failure(measured: Measured) -> str | None:
    """Why the verifier failed on the run, on one line (None: it did not)."""
    if not measured.failed:
        return None
    verdict = measured.verdict
    return " ".join(((verdict.error or verdict.reasoning) if verdict is not None else "no verdict").split())


def _stop_if_failing(name: str, results: list[Measured]) -> None:
    """Stop (exit 1, nothing more measured, no calibration written) once ``name`` failed on the last
    :data:`FAILURES_IN_A_ROW` runs in a way a retry may mend (a run whose agent cannot be rebuilt fails alike on
    every resume, and is only counted apart); what was measured is journaled, and the same command resumes."""
    why = [_failure(m) for m in results[-FAILURES_IN_A_ROW:]]
    if len(why) < FAILURES_IN_A_ROW or any(w is None or NO_RESAMPLER in w for w in why):
        return
    raise SystemExit(
        f"{name} failed on {FAILURES_IN_A_ROW} runs in a row (the last: {str(why[-1])[:300]}); stopped with no "
        "calibration written. The same command resumes, measuring the failed runs again"
    )


def progress_line(name: str, number: int, total: int, run: Labelled, measured: Measured) -> str:
    """One run measured (or read back from the journal), for a long measurement's log: its verdict and cost, or why
    the verifier failed on it (the report counts failures apart)."""
    verdict, why = measured.verdict, _failure(measured)
    if verdict is None or why is not None:
        outcome = f"the verifier failed: {(why or 'no verdict')[:300]}"
    else:
        outcome = {False: "flagged", True: "not flagged", None: "uncertain (not flagged)"}[verdict.is_correct]
        outcome += f" on {verdict.basis}" if verdict.basis else ""
    return (
        f"[{name} {number}/{total}] {run.key} ({'wrong' if run.wrong else 'right'} run): {outcome}; "
        f"{measured.calls} model calls, {measured.agent_runs} agent runs, {measured.seconds:.1f} s"
    )


def _live_resampler(results: Path, data: Path | None, llm: StructuredLLM | None) -> Callable[[Labelled], Any]:
    """The run's agent (``run_config.json``'s: the table agent, or the SQL agent) rebuilt on each run's question with
    the run's step limit, its replay adapter resampling on ``llm``'s endpoint: the table agent from the trace's
    steps, the SQL agent from its first recorded model request."""
    from reflect_otel.cli.evaluate import sql_agent_runs, table_agent_rebuilt
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
    agent = config.get("agent", "table")
    max_steps = int(config.get("max_steps") or 6)  # runs recorded before it was kept: the default, 6
    if agent == "sql":
        from reflect_otel.demo.sql_agent import chat_client

        client, model = chat_client(llm)  # the agent runs on the configured endpoint, as it did in the eval
        _run, rebuild = sql_agent_runs(client, model, instrumented_provider(), max_steps=max_steps, deterministic=False)
    elif agent == "table":
        rebuild = table_agent_rebuilt(llm, instrumented_provider(), max_steps=max_steps, deterministic=False)
    else:
        raise SystemExit(
            f"--live {results}: the runs were made by the {agent} agent, which this benchmark cannot rebuild"
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


SCORED = ("evidence", "consistency", "combined")
"""The verifiers whose score a map is fitted for."""


def _calibration_sample(calibration: ConfidenceCalibration) -> Sample | None:
    """The sample ``calibration`` was fitted on, read again from its results and journal; None when they are not
    on this machine."""
    sample = calibration.sample
    if sample is None or not sample.journal or not Path(sample.results).is_file() or not Path(sample.journal).is_file():
        return None
    runs = [r for r in live_runs(Path(sample.results)) if (r.question_id or r.key) in set(sample.question_ids)]
    return sample_of(read_journal(Path(sample.journal)), runs)


def _what_features_add(name: str, calibration: ConfidenceCalibration, here: Sample) -> list[str]:
    """The map's features on this sample, alone and left out (each map refitted on the calibration's own sample)."""
    fitted = calibration.score_map(VERIFIER_OF[name])
    if fitted is None:
        return [f"  no score map for {name} in the calibration: scored uncalibrated"]
    fitted_on = _calibration_sample(calibration)
    if fitted_on is None:
        return [f"  score map: {fitted.describe()}; its sample is not on this machine, so no feature is refitted"]
    refit = fitted_on.fit(name)
    lines = [] if refit == fitted else [f"  note: the calibration's {name} map does not refit exactly from its sample"]
    without = {feature: fitted_on.fit(name, without=feature) for feature in fitted.features}
    kept = here.domain(name)
    features = [here.features[i] for i in kept]
    return lines + feature_lines(fitted, without, features, [here.runs[i].wrong for i in kept])


def _cross_validated(name: str, here: Sample, results: list[Measured], folds: int) -> list[Scored] | None:
    """Each run scored as online, its map fitted on the sample's other folds (a design estimate within one sample)."""
    kept = here.domain(name)
    try:
        scores = out_of_fold_scores(
            [here.features[i] for i in kept],
            [here.runs[i].wrong for i in kept],
            features=VERIFIER_FEATURES[VERIFIER_OF[name]],
            folds=folds,
        )
    except ValueError as error:
        print(f"{name}: no cross-validated score ({error})", file=sys.stderr)
        return None
    by_run = dict(zip(kept, scores, strict=True))
    scored = []
    for i, (run, measured) in enumerate(zip(here.runs, results, strict=True)):
        score = by_run.get(i)
        if score is None:
            score = score_of(name, run, measured, here.checks[i], _NO_CALIBRATION) if name != "consistency" else None
        scored.append(Scored(run.wrong, score, measured.failed))
    return scored


def _written_calibration(
    args: argparse.Namespace,
    names: list[str],
    runs: list[Labelled],
    here: Sample,
    results: dict[str, list[Measured]],
    counted: dict[str, tuple[Counter[str], Counter[str]]],
    command: str,
    model: str,
) -> ConfidenceCalibration:
    maps = {VERIFIER_OF[n]: m for n in names if n in SCORED for m in [here.fit(n)] if m is not None}
    fitted = ConfidenceCalibration(scores=maps)
    thresholds = {}
    for name in names:  # the proxy, which has no map, at its own score
        if VERIFIER_OF[name] not in maps and name != "proxy":
            continue
        scores = [
            score_of(name, run, measured, here.checks[i], fitted)
            for i, (run, measured) in enumerate(zip(runs, results[name], strict=True))
        ]
        kept = [(s, r.wrong) for s, r in zip(scores, runs, strict=True) if s is not None]
        chosen = recall_threshold([s for s, _ in kept], [w for _, w in kept], recall=args.recall)
        if chosen is not None:
            thresholds[VERIFIER_OF[name]] = chosen
    right, judged = counted[args.calibrate]
    verdicts = sum(judged.values())  # the runs the verifier judged (a run it failed on is in no count)
    wrong = sum(r.wrong for r in runs)
    journal = args.out / "flagging.jsonl" if args.out is not None else None
    return ConfidenceCalibration(
        verifier=VERIFIER_OF[args.calibrate],
        model=model,
        samples=args.samples,
        stop_lead=args.stop_lead or None,
        temperature=args.temperature,
        threshold=_MEASURED_AT,
        counts={b: (right[b], judged[b]) for b in BASES if judged[b]},
        scores=maps,
        recall_target=args.recall,
        recall_thresholds=thresholds,
        sample=CalibrationSample(
            results=str(args.live or args.bbm),
            journal=str(journal) if journal is not None else "",
            question_ids=tuple(r.question_id or r.key for r in runs),
            wrong=wrong,
        ),
        source=f"{args.calibrate}'s verdicts on {verdicts} of {len(runs)} labelled runs ({wrong} wrong), and the "
        f"score maps fitted on them, {date.today()}: python -m benchmarks.flagging {command}",
    )


def _parser() -> argparse.ArgumentParser:
    current = reflect_settings()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bbm", type=Path, help="dataset folder holding bbm/*.jsonl")
    parser.add_argument("--live", type=Path, help="results.jsonl of eval --benchmark wtq-live")
    parser.add_argument("--data", type=Path, help="--live: the WikiTableQuestions folder (default: the run's own)")
    parser.add_argument("--per-class", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verifiers", default="evidence,proxy,consistency,combined")
    parser.add_argument(
        "--samples", type=int, default=current.flag_samples, help="resamples per run at most (REFLECT_FLAG_SAMPLES)"
    )
    parser.add_argument(
        "--stop-lead",
        type=int,
        default=current.flag_stop_lead,
        help="stop resampling once one side leads by this many (REFLECT_FLAG_STOP_LEAD; 0: run every one)",
    )
    parser.add_argument(
        "--temperature", type=float, default=current.flag_temperature, help="the resamples' temperature"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=current.flag_threshold,
        help="the score that flags a run in each verifier's first line (REFLECT_FLAG_THRESHOLD)",
    )
    parser.add_argument("--recall", type=float, default=0.8, help="the share of wrong runs an operating point flags")
    parser.add_argument("--limit", type=int, help="at most N runs (in file order)")
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for flagging.jsonl (every measurement kept; a second run resumes) and calibration.json "
        "(default with --live: the folder 'flagging' beside the results; with --smoke or --bbm: none)",
    )
    parser.add_argument("--calibrate", default="combined", help="the verifier whose verdicts the calibration counts")
    parser.add_argument(
        "--calibration-out",
        type=Path,
        help="write the calibration (score maps, recall thresholds, precision per basis) here (default: "
        "OUT/calibration.json)",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        help="score with the maps of this calibration, fitted on another sample (its runs are refused here)",
    )
    parser.add_argument(
        "--cross-validate",
        type=int,
        metavar="K",
        help="also score each run by maps fitted on the sample's other K-1 folds (a design estimate, not a result)",
    )
    parser.add_argument(
        "--cut-at-lead",
        type=int,
        metavar="N",
        help="with --journal-only: report each journaled check as the stopping rule N would have drawn it (its first "
        "resamples, up to where one side led by N)",
    )
    parser.add_argument(
        "--journal-only",
        action="store_true",
        help="report from the journal in --out as measured (its settings), starting no model and no agent",
    )
    add_smoke_option(parser)
    return parser


def main() -> None:
    parser = _parser()
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
    if args.cross_validate is not None and args.cross_validate < 2:
        parser.error("--cross-validate K: K must be at least 2")
    if args.out is None and args.live is not None and not args.smoke:
        args.out = args.live.parent / "flagging"
    if args.journal_only and args.out is None:
        parser.error("--journal-only reads the journal in --out; give --out (or --live, whose folder has one)")
    if args.cut_at_lead is not None and (not args.journal_only or args.cut_at_lead < 1):
        parser.error(
            "--cut-at-lead N reports a journal as a stopping rule would have drawn it: with --journal-only, N >= 1"
        )
    calibration_out = args.calibration_out
    if calibration_out is None and args.out is not None and args.calibrate in names and not args.journal_only:
        calibration_out = args.out / "calibration.json"  # reporting alone leaves the measured folder as it was
    if calibration_out is None:  # said before the hours of measuring, not after
        print(f"no calibration will be written: give --out DIR or --calibration-out FILE, with {args.calibrate} "
              "among --verifiers", file=sys.stderr)  # fmt: skip
    runs = bbm_runs(args.bbm, args.per_class, args.seed) if args.bbm else live_runs(args.live)
    runs = runs[: args.limit] if args.limit else runs
    wrong = sum(r.wrong for r in runs)
    moved = sum(r.relabelled for r in runs)
    print(
        f"{len(runs)} runs: {wrong} wrong, {len(runs) - wrong} right"
        + (f" ({moved} labelled otherwise by the current judge than recorded)" if moved else "")
    )
    scoring = _NO_CALIBRATION
    if args.calibration is not None:
        try:
            scoring = ConfidenceCalibration.load(args.calibration)
            scoring.refuse_sample(r.question_id or r.key for r in runs)
        except ConfigError as error:
            raise SystemExit(f"--calibration {args.calibration}: {error}") from None
    needs_model = bool({"proxy", "consistency", "combined"} & set(names))
    llm: StructuredLLM | None = None
    runs_for: Callable[[Labelled], SamplesRuns | None] = _no_resampler
    if args.journal_only:
        journal = read_journal(args.out / "flagging.jsonl")
        settings = journal.settings
        args.samples, args.temperature = settings.get("samples", args.samples), settings.get("temperature", 0.7)
        args.stop_lead = settings.get("stop_lead", 0)  # a journal without one ran every resample asked
        llm = NoModel("--journal-only: nothing is measured")
        print(f"reporting from {journal.path} as measured: {settings}")
        if args.cut_at_lead:
            journal.cut_at = args.stop_lead = args.cut_at_lead
            print(f"each check cut where one side first led by {args.cut_at_lead} (of at most {args.samples})")
    else:
        llm = (scripted_llm() if args.smoke else make_llm()) if needs_model else None
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
            **({"stop_lead": args.stop_lead} if args.stop_lead else {}),  # a journal without one ran every resample
            "temperature": args.temperature,
            "model": llm.model_name if llm is not None else None,
            "smoke": args.smoke,
        }
        journal = Journal(args.out / "flagging.jsonl" if args.out is not None else None, settings)
        if args.out is not None:  # the commit and sessions that measured the journal's rows
            write_run_config(args.out, {"benchmark": "flagging", **settings}, defining=tuple(settings))
    bench = Bench(llm, runs_for, journal, args.samples, args.temperature, stop_lead=args.stop_lead or None)
    data = f"--bbm {args.bbm} --per-class {args.per_class} --seed {args.seed}" if args.bbm else f"--live {args.live}"
    command = (
        f"{data} --verifiers {','.join(names)} --calibrate {args.calibrate} --samples {args.samples} --stop-lead "
        f"{args.stop_lead or 0} --temperature {args.temperature}"
        + (" --journal-only" if args.journal_only else "")
        + (f" --cut-at-lead {args.cut_at_lead}" if args.cut_at_lead else "")
    )
    if scoring is not _NO_CALIBRATION:
        print(f"scores: the maps of {args.calibration}, fitted on {scoring.sample.results if scoring.sample else '?'}")
    else:
        print("scores: uncalibrated (no --calibration)")
    counted: dict[str, tuple[Counter[str], Counter[str]]] = {}
    measured: dict[str, list[Measured]] = {}
    for name in names:
        results = []
        for number, run in enumerate(runs, start=1):
            results.append(bench.measure(name, run))
            print(progress_line(name, number, len(runs), run, results[-1]), file=sys.stderr, flush=True)
            if not args.journal_only:
                _stop_if_failing(name, results)
        measured[name] = results
        here = sample_of(journal, runs)
        scored = [
            Scored(run.wrong, score_of(name, run, m, here.checks[i], scoring), m.failed)
            for i, (run, m) in enumerate(zip(runs, results, strict=True))
        ]
        text, right, judged = report(name, runs, results, scored, threshold=args.threshold)
        counted[name] = (right, judged)
        print(text, flush=True)
        print(
            "\n".join(
                operating_lines(
                    scored,
                    recall=args.recall,
                    calibrated=scoring.recall_thresholds.get(VERIFIER_OF[name]),
                    calibration_name="the calibration",
                )
            ),
            flush=True,
        )
        if args.calibration is not None and name in SCORED:
            print("\n".join(_what_features_add(name, scoring, here)), flush=True)
        cross = _cross_validated(name, here, results, args.cross_validate) if args.cross_validate else None
        if cross is not None and name in SCORED:
            print(f"  cross-validated in {args.cross_validate} folds within this sample (a design estimate):")
            print("\n".join("  " + line for line in flag_line(name, cross, args.threshold)[:3]))
            print("\n".join("  " + line for line in operating_lines(cross, recall=args.recall, calibrated=None,
                                                                    calibration_name="")))  # fmt: skip
    if calibration_out is None or args.calibrate not in names:
        print("no calibration written")
    else:
        written = _written_calibration(
            args, names, runs, sample_of(journal, runs), measured, counted, command, llm.model_name if llm else ""
        )
        unfinished = calibration_out.with_name(calibration_out.name + ".tmp")  # a stop never leaves half a file
        unfinished.write_text(written.model_dump_json(indent=2) + "\n", encoding="utf-8")
        os.replace(unfinished, calibration_out)
        print(f"wrote {calibration_out} (use it with REFLECT_PROXY_CALIBRATION={calibration_out})")
    print(f"flagging_runs={len(runs)}")


if __name__ == "__main__":
    main()
