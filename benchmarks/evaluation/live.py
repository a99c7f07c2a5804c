"""``eval --benchmark wtq-live``: REFLECT's claim measured live. A demo agent (the LangGraph table-QA agent, or the
OpenAI-tool-loop SQL agent: ``--agent``) answers WikiTableQuestions questions with the configured model; each run
whose answer is wrong is attributed by every chosen method, from the same run, with the same model, before the next
question (the agent's replay state lives in this process). Answers are judged by :func:`reflect_otel.flagging.judge.judge_answer`
(right, wrong or undecided, with the question): a row's ``correct`` is None for an undecided answer (one naming
several values without saying which it asserts), which is neither right nor a failed run, and is counted apart.

Resumable: a JSON line per question when its agent run finishes, and the updated line again after each method (the
last line of a question wins), so a stop loses at most the method running; on resume the stored failure's missing
methods run from its stored trace. A question whose agent run failed (the endpoint, not the answer) writes no line
and is retried on resume. ``--limit`` counts failed runs, ``--runs`` every run, right or wrong; with no method the
runs are only recorded (labelled runs for ``benchmarks.flagging --live``). A method that never sees the expected
answer (``reflect-proxy``) is judged by the oracle afterwards: of its verified records, how many the expected answer
confirms as corrected.

The methods run on a failure in an order drawn from the seed and the question id (:func:`method_order`, recorded in
the row as ``method_order``): the first method to replay a failure may meet a server state (a prompt cache, a warm
process) the later ones do not, and a fixed order would give that to one method every time.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.evaluation import _live_records as reading
from benchmarks.evaluation.live_rows import LIVE, Judgement, LiveRow, MethodRow, read_live_rows
from benchmarks.evaluation.metrics import mean_se
from benchmarks.evaluation.rows_file import RowsFile
from benchmarks.evaluation.run_config import (
    REGIME,
    RUN_CONFIG,
    VERIFICATION,
    code_line,
    read_json_object,
    write_run_config,
)
from reflect_otel.attribution.controls import PlanPool, WrongStepControl
from reflect_otel.attribution.methods import METHODS, method_spec
from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import ReflectConfig
from reflect_otel.demo.runs import AgentRun, RebuildRun, RunAgent
from reflect_otel.demo.wtq import WTQQuestion, load_questions
from reflect_otel.errors import InputError
from reflect_otel.flagging._stats import wilson
from reflect_otel.flagging.judge import judge_answer
from reflect_otel.flagging.verifiers import OracleVerifier, judged_correct
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.record import AttributionRecord, AttributionStatus, ReplayArm
from reflect_otel.replay import ReplayAdapter
from reflect_otel.trace import StructuredTrace

__all__ = [
    "AgentRun",
    "LiveOptions",
    "check_methods",
    "live_metrics",
    "live_metrics_markdown",
    "method_order",
    "run_live_eval",
]

RESULTS = "results.jsonl"
MAX_AGENT_ERRORS_IN_A_ROW = 3


@dataclass
class LiveOptions:
    methods: tuple[str, ...]
    data: Path
    """A WikiTableQuestions folder (``questions.tsv`` and its tables), e.g. ``../shared/data/wtq``."""
    out: Path
    limit: int | None = None
    """Stop after this many failed runs (all of them attributed by every method); a method added to a folder that
    holds more failures is given the first ``limit`` of them."""
    seed: int | None = None
    config: ReflectConfig = field(default_factory=ReflectConfig)
    exclude: tuple[str, ...] = ()
    """Question ids never run (the demo's, when measuring on questions it was not tuned on)."""
    agent: str = "table"
    """Which demo agent answers (recorded in the run's configuration; a run is resumed with the same agent)."""
    max_replays: int | None = None
    """Replays each method may run per failed run, controls included (the same budget for every method compared);
    None: no cap. The agent runs and replays greedily; proposals are sampled at the configuration's
    ``proposal_temperature``, for every method."""
    max_runs: int | None = None
    """Stop after this many agent runs, right or wrong (with ``limit``, at whichever comes first)."""
    max_steps: int = 6
    """The tool calls an agent run may make (recorded: a resume, and a resample of a stored run, use the same)."""
    deterministic_agent: bool | None = None
    """Whether the agent's replays were taken as repeating exactly (one replay per arm decides) or sampled
    (``verify_samples`` per arm): the effective setting the app gave ``run_agent``'s adapters, recorded in the run's
    configuration (a run is resumed with the same one). None: not said."""


Progress = Callable[[str], None]


def _questions(options: LiveOptions) -> list[WTQQuestion]:
    folder = options.data / "wtq" if (options.data / "wtq" / "questions.tsv").is_file() else options.data
    questions = [q for q in load_questions(data=folder) if q.id not in options.exclude]
    if options.seed is not None:
        random.Random(options.seed).shuffle(questions)
    return questions


def _method_row(
    llm: StructuredLLM, method: str, options: LiveOptions, run: AgentRun, expected: str, plans: PlanPool
) -> MethodRow:
    replay: ReplayAdapter = run.replay  # this run's agent, alive in this process
    service = AttributionService(
        llm,
        METHODS[method],
        verifier=OracleVerifier(),
        config=options.config,
        replay_finder=lambda _t, _l: replay,
        max_replays=options.max_replays,
        plans=plans,  # the placebo draws on the plans written for the other failures of this evaluation
    )
    started = time.perf_counter()
    record = service.process(run.trace, expected=expected, domain_context=run.context).record
    assert record is not None  # without triage every trace is attributed
    # a method that never saw the answer, judged by it: does the oracle confirm the answer it verified?
    confirms = (
        judged_correct(record.corrected_answer, expected, question=run.trace.question)
        if record.corrected_answer is not None
        else None
    )
    return _row_of(record, confirms, round(time.perf_counter() - started, 3))


def _row_of(record: AttributionRecord, oracle_confirms: bool | None, seconds: float) -> MethodRow:
    """What a method's record concluded and cost, as its results row keeps it."""
    auditor = record.auditor_cost  # the same calls as llm_calls and tokens below
    cached = [c.cached_prompt_tokens for c in auditor]
    arms = Counter(a.arm for a in record.replays)
    effect, fidelity = record.effect, record.fidelity
    return MethodRow(
        status=record.status.value,
        step=record.step_index,
        flipped=any(a.flipped for a in record.replays if a.arm is ReplayArm.INTERVENTION),
        corrected_answer=record.corrected_answer,
        verified_by=(
            {"source": record.verified_by.source, "kind": record.verified_by.kind.value} if record.verified_by else None
        ),
        effect=(
            {
                "step": effect.step_index,
                "intervention": [effect.intervention.flips, effect.intervention.replays],
                "control": [effect.control.flips, effect.control.replays],
                "p_value": effect.p_value,
            }
            if effect is not None
            else None
        ),
        fidelity=(fidelity.reproduced, fidelity.controls) if fidelity is not None else None,
        replays=len(record.replays),
        control_replays=arms[ReplayArm.CONTROL],
        sensitivity_replays=arms[ReplayArm.SENSITIVITY],
        localization_replays=arms[ReplayArm.LOCALIZATION],
        claim=record.claim,
        localization_test=record.localization_test.outcome.value if record.localization_test else None,
        obstacle=record.obstacle.value if record.obstacle else None,
        proposals=sum(1 for c in record.corrections if c.source.startswith("proposal:")),
        oracle_confirms=oracle_confirms,
        llm_calls=record.auditor_calls,  # the auditor's requests; the agent's (on the same model) apart
        agent_calls=record.agent_calls,  # the agent's requests for this record: its replays and proposals
        tokens=record.auditor_tokens,
        prompt_tokens=sum(c.prompt_tokens for c in auditor),
        cached_prompt_tokens=sum(c or 0 for c in cached) if any(c is not None for c in cached) else None,
        seconds=seconds,
        failed=record.failed,
        errors=tuple(e.stage for e in record.errors),
        record=record.model_dump(mode="json"),
    )


def method_order(methods: Sequence[str], seed: int | None, question_id: str) -> list[str]:
    """``methods`` in the order they run on ``question_id``'s failure: a shuffle drawn from ``seed`` and the id (of
    the methods sorted by name), so a resumed or re-run evaluation runs them in the same order, and no method is
    always first (see the module). With no seed (the questions in file order), the order given."""
    if seed is None:
        return list(methods)
    order = sorted(methods)  # the draw does not depend on how --method listed them
    random.Random(f"{seed}:{question_id}").shuffle(order)
    return order


def check_methods(methods: Sequence[str]) -> None:
    """Raises :class:`InputError` naming the fix unless every method is one wtq-live can compare. No method at all
    records the agent's runs only."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise InputError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if any(not method_spec(m).needs_llm for m in methods):
        raise InputError(
            "wtq-live compares methods that replay with the model (the position floors replay nothing); to record "
            "the agent's runs alone, give no method"
        )


def run_live_eval(
    options: LiveOptions,
    llm: StructuredLLM,
    run_agent: RunAgent,
    *,
    rebuild: RebuildRun | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run (or resume) and return the metrics; writes ``results.jsonl``, ``run_config.json``, ``metrics.json`` and
    ``metrics.md`` in ``options.out``. Resuming with more methods (and ``rebuild``) first gives each added method
    the failed runs already stored, replayed from their traces, so every method is measured on the same failures;
    the updated row is appended (the last row of a question wins)."""
    check_methods(options.methods)
    questions = _questions(options)
    options.out.mkdir(parents=True, exist_ok=True)
    results = options.out / RESULTS
    evaluation = _Evaluation(options, llm, progress or (lambda _text: None), read_live_rows(results))
    _write_live_config(options, llm)
    with RowsFile(results) as out:
        if rebuild is not None:
            evaluation.add_methods(out, {q.id: q for q in questions}, rebuild)
        for question in evaluation.to_run(questions):
            evaluation.run_question(out, question, run_agent)
    return _write_metrics(options, llm.model_name, list(evaluation.done.values()))


def _write_live_config(options: LiveOptions, llm: StructuredLLM) -> None:
    """``run_config.json``, or the check that a resumed run is made the same way (see :func:`write_run_config`)."""
    write_run_config(
        options.out,
        {
            "benchmark": LIVE,
            "agent": options.agent,
            "methods": list(options.methods),
            "data": str(options.data),
            "limit_failed_runs": options.limit,
            "limit_runs": options.max_runs,
            "seed": options.seed,
            "exclude": list(options.exclude),
            "max_replays": options.max_replays,
            "max_steps": options.max_steps,
            "deterministic_agent": options.deterministic_agent,
            # the rule of reflect_otel/attribution/controlled_replay.py: a change of effect, beside a control and a
            # sensitivity arm; runs under an earlier rule ("controlled") are not resumed with this one
            "verification": VERIFICATION,
            # what saw the expected answer: the localizer (the oracle regime), never a text a replay executes
            "regime": REGIME,
            "model": llm.model_name,
            "reflect_config": options.config.model_dump(mode="json"),
        },
        # methods may be added, and the run grown; runs made before controlled verification cannot be resumed by it;
        # a run made before the agent's determinism was recorded is resumed with either (what it was is not known)
        defining=(
            "agent",
            "seed",
            "exclude",
            "max_replays",
            "max_steps",
            "deterministic_agent",
            "verification",
            "model",
            "reflect_config",
        ),
        absent_means={"verification": "uncontrolled", "agent": "table", "max_steps": 6},
    )


def _write_metrics(options: LiveOptions, model: str, rows: list[LiveRow]) -> dict[str, Any]:
    metrics = live_metrics(rows, options.methods)
    (options.out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    code = code_line(read_json_object(options.out / RUN_CONFIG))
    (options.out / "metrics.md").write_text(live_metrics_markdown(metrics, model, code=code))
    return metrics


@dataclass
class _Evaluation:
    """A live evaluation under way: the rows so far (the last of each question), the plans written for their
    failures, and the agent runs that failed in a row."""

    options: LiveOptions
    llm: StructuredLLM
    say: Progress
    done: dict[str, LiveRow]
    plans: PlanPool = field(init=False)
    errors_in_a_row: int = 0

    def __post_init__(self) -> None:
        self.plans = _stored_plans(self.done.values())

    def to_run(self, questions: Iterable[WTQQuestion]) -> Iterator[WTQQuestion]:
        """The questions not yet run, until ``limit`` failed runs or ``max_runs`` runs are stored."""
        limit, max_runs = self.options.limit, self.options.max_runs
        for question in questions:
            if limit is not None and sum(1 for r in self.done.values() if r.failed) >= limit:
                return
            if max_runs is not None and len(self.done) >= max_runs:
                return
            if question.id not in self.done:
                yield question

    def run_question(self, out: RowsFile, question: WTQQuestion, run_agent: RunAgent) -> None:
        """The agent's run on ``question``, stored; when its answer is wrong, each method's attribution of it."""
        self.say(f"{question.id}: {question.question}")
        started = time.perf_counter()
        run = self._agent_run(question, run_agent)
        if run is None:
            return
        row = _run_row(question, run, started)
        outcome = row.judgement.outcome if row.judgement else ""
        self.say(f"{question.id}: answered {run.answer!r} (expected {question.expected!r}): {outcome}")
        self._store(out, row)  # the run first, then each method as it finishes: a stop loses at most one method
        if row.failed:
            order = method_order(self.options.methods, self.options.seed, question.id)
            self._attribute(out, row.model_copy(update={"method_order": ()}), run, question, order)

    def add_methods(self, out: RowsFile, questions: dict[str, WTQQuestion], rebuild: RebuildRun) -> None:
        """Give each method not yet run on a stored failure that failure, replayed from its trace (the first
        ``options.limit`` failures, in the order they were run)."""
        for stored in [r for r in self.done.values() if r.failed][: self.options.limit]:
            order = method_order(self.options.methods, self.options.seed, stored.question_id)
            missing = [m for m in order if m not in stored.methods]
            question = questions.get(stored.question_id)
            if not missing or question is None or stored.trace is None:
                continue
            self.say(f"{question.id}: stored failure; adding {', '.join(missing)}")
            run = rebuild(question, StructuredTrace.model_validate(stored.trace))
            self._attribute(out, stored, run, question, missing)

    def _agent_run(self, question: WTQQuestion, run_agent: RunAgent) -> AgentRun | None:
        """The agent's run, or None when it failed (the endpoint, not the answer: retried on resume); a few failures
        in a row stop the evaluation."""
        try:
            run = run_agent(question)
        except Exception as error:
            self.errors_in_a_row += 1
            self.say(f"{question.id}: the agent run failed ({type(error).__name__}: {error}); not recorded")
            if self.errors_in_a_row >= MAX_AGENT_ERRORS_IN_A_ROW:
                raise InputError(
                    f"{self.errors_in_a_row} agent runs in a row failed; is the model endpoint up? (last: {error})"
                ) from error
            return None
        self.errors_in_a_row = 0
        return run

    def _attribute(
        self, out: RowsFile, row: LiveRow, run: AgentRun, question: WTQQuestion, methods: Sequence[str]
    ) -> None:
        """Each of ``methods`` on the failed run, the row appended after each (a stop loses the method running)."""
        for name in methods:
            row = row.with_method(name, self._attributed(name, run, question))
            self._store(out, row)

    def _attributed(self, name: str, run: AgentRun, question: WTQQuestion) -> MethodRow:
        self.say(f"{question.id}: {name}: attributing")
        row = _method_row(self.llm, name, self.options, run, question.expected, self.plans)
        self.say(
            f"{question.id}: {name}: {row.status} at step {row.step}, "
            f"{'flipped' if row.flipped else 'no flip'} ({row.replays} replays, {row.llm_calls} calls, "
            f"{row.seconds:.0f} s)"
        )
        return row

    def _store(self, out: RowsFile, row: LiveRow) -> None:
        out.append(row.line())  # flushed; the last row of a question wins on resume
        self.done[row.question_id] = row


def _run_row(question: WTQQuestion, run: AgentRun, started: float) -> LiveRow:
    """The agent's run on ``question`` as its results row, its answer judged."""
    judged = judge_answer(run.answer, question.expected, question=question.question)
    return LiveRow(
        question_id=question.id,
        question=question.question,
        expected=question.expected,
        answer=run.answer,
        correct=judged.correct,  # None: undecided, neither right nor a failed run
        judgement=Judgement(outcome=judged.outcome.value, value=judged.value, how=judged.how),
        agent_steps=len(run.trace.steps),
        agent_seconds=round(time.perf_counter() - started, 3),
        methods={},
        trace=run.trace.model_dump(mode="json"),  # right runs too: labelled data for the verifiers
    )


def _stored_plans(rows: Iterable[LiveRow]) -> PlanPool:
    """The plans written for the failures already stored (a resumed evaluation's placebo draws on them too)."""
    plans = PlanPool()
    for row in rows:
        trace = row.trace or {}
        for method in row.methods.values():
            if method.record is not None and trace.get("trace_id"):
                record = AttributionRecord.model_validate(method.record)
                plans.add_plan(str(trace["trace_id"]), str(trace.get("question") or row.question), record)
    return plans


def live_metrics(rows: Sequence[LiveRow], methods: Sequence[str]) -> dict[str, Any]:
    """Per method, over the failed runs it attributed without a stage failure: the share flipped (a replay
    flipped the answer to the expected one) and verified, and calls, tokens and seconds per run; each with its
    standard error. Runs whose stages failed, and runs skipped, are counted apart, never scored, and listed with
    what they cost (``unscored``); runs whose answer was undecided are counted apart too (``agent_undecided``),
    neither right nor failed. Read from the rows as written (see :mod:`benchmarks.evaluation._live_records`)."""
    failures = [r for r in rows if r.failed]
    return {
        "questions": len(rows),
        "agent_correct": sum(1 for r in rows if r.correct is True),
        "agent_undecided": sum(1 for r in rows if r.correct is None),
        "failed_runs": len(failures),
        "methods": {name: _method_metrics(name, failures) for name in methods},
    }


@dataclass(frozen=True, slots=True)
class _Given:
    """The failed runs given to one method, split as its metrics count them."""

    given: list[tuple[LiveRow, MethodRow]]
    """Every failed run the method attributed, with its row for it."""
    ran: list[MethodRow]
    """Those not skipped."""
    scored_rows: list[tuple[LiveRow, MethodRow]]
    """Those not skipped whose stages did not fail."""

    @property
    def scored(self) -> list[MethodRow]:
        return [m for _, m in self.scored_rows]

    @property
    def verified(self) -> list[MethodRow]:
        return [m for m in self.scored if m.status == AttributionStatus.VERIFIED.value]


def _given(name: str, failures: Sequence[LiveRow]) -> _Given:
    given = [(r, r.methods[name]) for r in failures if name in r.methods]
    ran = [m for _, m in given if m.status != AttributionStatus.SKIPPED.value]
    scored = [(r, m) for r, m in given if m.status != AttributionStatus.SKIPPED.value and not m.failed]
    return _Given(given, ran, scored)


def _method_metrics(name: str, failures: Sequence[LiveRow]) -> dict[str, Any]:
    """One method's figures (keys in the order ``metrics.json`` has always written them)."""
    runs = _given(name, failures)
    metrics = {
        **_run_counts(runs),
        **_verification(name, runs),
        **_replay_costs(runs),
        **_listings(name, runs, failures),
    }
    if name == WrongStepControl.method:
        metrics["targets"] = _wrong_step_targets(runs.scored_rows)
    return metrics


def _run_counts(runs: _Given) -> dict[str, Any]:
    scored = runs.scored
    return {
        "runs": len(runs.given),
        "failed": len(runs.ran) - len(scored),
        "skipped": len(runs.given) - len(runs.ran),  # nothing to test (the placebo before any other plan)
        "scored": len(scored),
        "replayed_runs": sum(1 for m in scored if m.replays),  # a method that replays nothing corrects nothing
        # runs where a correction was replayed at all (a run with control replays only tested nothing)
        "tested_runs": sum(1 for m in scored if _intervention_replays(m)),
        "intervention_replays": mean_se([float(_intervention_replays(m)) for m in scored]),
        # runs where a stage's call failed (e.g. a diagnosis the model could not write to the schema) and the
        # method went on without it: scored, but with less than it asked for
        "stage_errors": sum(1 for m in scored if m.errors),
        "flipped": mean_se([1.0 if m.flip else 0.0 for m in scored]),
    }


def _verification(name: str, runs: _Given) -> dict[str, Any]:
    scored, verified = runs.scored, runs.verified
    controlled = any(reading.is_controlled(m) for m in scored)
    return {
        "verified": mean_se([1.0 if m.status == AttributionStatus.VERIFIED.value else 0.0 for m in scored]),
        # the strict reading: verified where every control at the verifying point gave the run's own answer
        # (None: the records hold no controls, verification was not controlled)
        "verified_reproducing": (
            mean_se([1.0 if reading.verified_reproducing(m) else 0.0 for m in scored]) if controlled else None
        ),
        "withholds_expected": method_spec(name).withholds_expected if name in METHODS else False,
        # of the verified records, those whose corrected answer the expected one confirms (rows written before
        # this was recorded: unknown, so not counted)
        "oracle": {
            "confirmed": sum(1 for m in verified if m.oracle_confirms is True),
            "judged": sum(1 for m in verified if m.oracle_confirms is not None),
        },
        "not_attributable": mean_se(
            [1.0 if m.status == AttributionStatus.NOT_ATTRIBUTABLE.value else 0.0 for m in scored]
        ),
        # what a verified record claims (rows made before the claim existed: none counted as localized)
        "localized": sum(1 for m in verified if m.claim == "localized"),
        "localization_tests": {
            outcome: sum(1 for m in verified if m.localization_test == outcome)
            for outcome in ("localized", "not_localized", "untested")
        },
        # why a not-attributable record's flip was not credited
        "obstacles": {
            obstacle: sum(1 for m in scored if m.obstacle == obstacle)
            for obstacle in sorted({str(m.obstacle) for m in scored if m.obstacle})
        },
    }


def _replay_costs(runs: _Given) -> dict[str, Any]:
    scored = runs.scored
    fidelity = [m.fidelity for m in scored if m.fidelity]
    trajectory = [reading.trajectory_fidelity((r.trace or {}).get("steps") or [], m) for r, m in runs.scored_rows]
    return {
        "sensitivity_replays": mean_se([float(m.sensitivity_replays or 0) for m in scored]),
        "localization_replays": mean_se([float(m.localization_replays or 0) for m in scored]),
        "fidelity": {"reproduced": sum(f[0] for f in fidelity), "controls": sum(f[1] for f in fidelity)},
        "trajectory_fidelity": {
            "repeated": sum(t[0] for t in trajectory),
            "controls": sum(t[1] for t in trajectory),
        },
        "replays": mean_se([float(m.replays) for m in scored]),
        "control_replays": mean_se([float(m.control_replays or 0) for m in scored]),
        # the agent's decisions sampled for proposals (each batch's M), and those the records list (de-duplicated)
        "proposals": mean_se([float(reading.proposals_sampled(m)) for m in scored]),
        "proposals_kept": mean_se([float(reading.proposals_kept(m)) for m in scored]),
        # one agent-model request per decision sampled (at least); outside the replay budget
        "agent_proposal_requests": mean_se([float(reading.proposals_sampled(m)) for m in scored]),
        "llm_calls": mean_se([float(m.llm_calls) for m in scored]),  # the auditor's calls
        "model_requests": mean_se([float(reading.model_requests(m)) for m in scored]),  # repair retries too
        # the agent's requests for its replays and proposals, where the rows' code recorded them
        "agent_requests": _known_mean([reading.agent_requests(m) for m in scored]),
        "tokens": mean_se([float(m.tokens) for m in scored]),
        "cached_share": _cached_share(scored),
        "seconds": mean_se([float(m.seconds) for m in scored]),
    }


def _listings(name: str, runs: _Given, failures: Sequence[LiveRow]) -> dict[str, Any]:
    scored = runs.scored
    verified_by = Counter(f"{m.verified_by['source']} ({m.verified_by['kind']})" for m in scored if m.verified_by)
    return {
        "unscored": [_unscored(r, m) for r, m in runs.given if m.status == AttributionStatus.SKIPPED.value or m.failed],
        "verified_steps": [
            {"question_id": r.question_id, "step": r.methods[name].step}
            for r in failures
            if name in r.methods and r.methods[name].status == AttributionStatus.VERIFIED.value
        ],
        "verified_by": dict(verified_by),
        "corrections": dict(Counter(o for m in scored for o in reading.correction_outcomes(m)).most_common()),
    }


def _unscored(row: LiveRow, method: MethodRow) -> dict[str, Any]:
    """A run given to a method and not scored (skipped, or a stage failed), with what it cost all the same."""
    return {
        "question_id": row.question_id,
        "status": method.status,
        "failed": method.failed,
        "reason": str(reading.record_of(method).get("reason") or ""),
        "llm_calls": method.llm_calls,
        "model_requests": reading.model_requests(method),
        "proposals": reading.proposals_sampled(method),
        "replays": method.replays,
        "tokens": method.tokens,
        "seconds": method.seconds,
    }


def _wrong_step_targets(scored: Sequence[tuple[LiveRow, MethodRow]]) -> dict[str, Any]:
    """Per scored wrong-step record, the steps it placed its corrections at (its targets), each with whether
    REFLECT's record for the same question localized it, and whether another round of its own did (a target is
    never its own round's localized step). A wrong step that is a localized one tests a localization, not a wrong
    step."""
    records: list[dict[str, Any]] = []
    every: list[dict[str, Any]] = []
    for row, method in scored:
        reflect = reading.localized_steps(row.methods.get(ReflectPipeline.method))
        own = reading.localized_steps(method)
        targets: list[dict[str, Any]] = [
            {"step": step, "reflect_localized": step in reflect, "own_round_localized": step in own}
            for step in reading.correction_steps(method)
        ]
        verified = method.status == AttributionStatus.VERIFIED.value
        records.append(
            {"question_id": row.question_id, "targets": targets, "verified_step": method.step if verified else None}
        )
        every += targets
    return {
        "targets": len(every),
        "reflect_localized": sum(1 for t in every if t["reflect_localized"]),
        "own_round_localized": sum(1 for t in every if t["own_round_localized"]),
        "localized": sum(1 for t in every if t["reflect_localized"] or t["own_round_localized"]),
        "records": records,
    }


def _claim_lines(methods: dict[str, Any]) -> list[str]:
    """Per method: verified (decisive) and localized records, the localization tests' outcomes, why flips were not
    attributable, and the sensitivity and localization arms' replays."""
    if not any("localization_tests" in m for m in methods.values()):
        return []  # rows made before the sensitivity arm and the localization test
    lines = [
        "",
        "| method | decisive (verified) | localized | localization not shown, untested | not attributable: why | "
        "replays: sensitivity, localization |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in methods.items():
        tests = m.get("localization_tests") or {}
        obstacles = ", ".join(f"{why} {count}" for why, count in (m.get("obstacles") or {}).items()) or "-"
        mean = m["verified"]["mean"]
        verified = round(mean * m.get("scored", m["runs"])) if mean == mean else 0  # NaN: nothing scored
        lines.append(
            f"| {name} | {verified} | {m.get('localized', 0)} | {tests.get('not_localized', 0)}, "
            f"{tests.get('untested', 0)} | {obstacles} | {_cell(m['sensitivity_replays'])}, "
            f"{_cell(m['localization_replays'])} |"
        )
    return lines


def _known_mean(values: Sequence[int | None]) -> dict[str, Any] | None:
    """The mean of the values when every row knows its value; None when any does not (older code's rows)."""
    if not values or any(v is None for v in values):
        return None
    return mean_se([float(v) for v in values if v is not None])


def _intervention_replays(method: MethodRow) -> int:
    others = (method.control_replays, method.sensitivity_replays, method.localization_replays)
    return method.replays - sum(count or 0 for count in others)


def _cached_share(rows: Sequence[MethodRow]) -> float | None:
    """Prompt tokens served from the endpoint's cache over all prompt tokens, where the endpoint says."""
    known = [(r.prompt_tokens, r.cached_prompt_tokens) for r in rows if r.cached_prompt_tokens is not None]
    prompt = sum(p or 0 for p, _ in known if p)
    return round(sum(c or 0 for p, c in known if p) / prompt, 3) if prompt else None


def _cell(stat: dict[str, Any], *, percent: bool = False, digits: int = 1) -> str:
    if not stat["n"]:
        return "-"
    scale = 100.0 if percent else 1.0
    unit = "%" if percent else ""
    return f"{stat['mean'] * scale:.{digits}f}{unit} ± {stat['se'] * scale:.{digits}f}"


def _skipped(method: dict[str, Any]) -> str:
    if not method.get("skipped"):
        return ""
    if method.get("withholds_expected"):  # its own verdict on the run, without the answer, found nothing wrong
        return f" ({method['skipped']} left alone: judged right without the answer, or nothing to test)"
    return f" ({method['skipped']} not run: nothing to test)"


HEADER = (
    "Methods ran on each failure in the order its row's method_order records (drawn from the seed and the question "
    "id; a resume appends the methods it ran). "
    "Percentages and means (± standard error) are per scored run: the failed runs a method attributed, less those "
    "it skipped (nothing to test) or whose stages failed, so a method with runs not scored has a smaller denominator "
    "than the others (said below the table, with what those runs cost). "
    "tested: runs where a correction was replayed (not only controls); flipped: an intervention replay answered "
    "right; verified (decisive): the attribution's rule (reflect_otel/attribution/controlled_replay.py): an intervention that "
    "changed step p's effect (its result, or a thought's content; never the answer turn or a later call of the run "
    "moved earlier) answered right, and the control replay from the same prefix, with no intervention, "
    "did not answer right; where that control gave another answer than the run's, more controls were run there (to "
    "verify_samples) and none answered right (with sampled replays: the intervention flipped more often than the "
    "control, one-sided Fisher exact p <= 0.05); nor did the sensitivity arm (step p changed in text only, from the "
    "same prefix). A verified run's control need not have reproduced the run. localized: verified, and the same "
    "correction source applied at another step of the run changed that step's effect and did not flip the run. "
    "verified, control gave the run's answer: verified, and every control replayed at the verifying rollback point "
    "gave the run's own answer (the strict reading: the path proved fixable is the run's, not another path the "
    "control took); not attributable: the method's rule found the flip explained without its correction; "
    "answer fidelity: control replays that gave the run's answer; trajectory fidelity: control replays that "
    "repeated the run's steps after the prefix (the same tool calls with the same arguments, in order, up to the "
    "run's end; the answer's wording is answer fidelity's); stage errors: scored runs where a call failed or was "
    "refused and the method went on without it; proposals: the agent's decisions sampled for candidate corrections "
    "(each batch's M in its 'proposal k of M', repeats included; a record lists a batch's repeats once); model "
    "requests: auditor: every request to the auditor's model, a repair retry included (its tokens were always "
    "counted); agent (proposals): the requests to the agent's model that sampled those decisions, one per decision "
    "(at least: the table agent asks again when a decision repeats a call, and that is not recorded); proposals "
    "execute nothing, so they are outside the replay budget (--max-replays); agent (all): every request the agent "
    "sent to the model for the record, its replays' and its proposals', where the rows' code recorded them (- "
    "where it did not); tokens: the auditor's."
)


def _strict_cell(method: dict[str, Any]) -> str:
    stat = method.get("verified_reproducing")
    return "-" if stat is None else _cell(stat, percent=True)


def _ratio(stat: dict[str, Any] | None, hit: str) -> str:
    return "-" if not stat else f"{stat[hit]} of {stat['controls']}"


def live_metrics_markdown(metrics: dict[str, Any], model: str, *, code: str | None = None) -> str:
    """The table; ``code`` (:func:`~benchmarks.evaluation.run_config.code_line`) says which code made its rows."""
    lines = [
        f"{LIVE}, model {model}: {metrics['questions']} questions, {metrics['agent_correct']} answered right, "
        f"{_undecided(metrics)}{metrics['failed_runs']} failed runs given to each method. {HEADER}",
        "",
        "| method | runs | scored | skipped or failed | tested | flipped | verified | verified, control gave the "
        "run's answer | not attributable | answer fidelity | trajectory fidelity | replays: intervention, control | "
        "proposals sampled | stage errors | model requests: auditor, agent (proposals), agent (all) | tokens | cached | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if code:
        lines[1:1] = ["", f"{code}."]
    lines += [_method_line(name, m) for name, m in metrics["methods"].items()]
    lines += _unscored_lines(metrics["methods"])
    lines += _claim_lines(metrics["methods"])
    lines += _wrong_step_lines(metrics["methods"].get(WrongStepControl.method))
    lines += _listing_lines(metrics["methods"])
    if not metrics["methods"]:
        lines += ["", "No method: the agent's runs recorded only (labelled runs for `benchmarks.flagging --live`)."]
    return "\n".join(lines) + "\n"


def _method_line(name: str, m: dict[str, Any]) -> str:
    """One method's row of the table."""
    share = m.get("cached_share")
    intervention = m.get("intervention_replays")
    requests = m.get("model_requests") or m["llm_calls"]
    agent = m.get("agent_proposal_requests")
    agent_all = m.get("agent_requests")
    return (
        f"| {name} | {m['runs']} | {m.get('scored', '-')} | {m['failed']}{_skipped(m)} | "
        f"{m.get('tested_runs', '-')} | "
        f"{_cell(m['flipped'], percent=True)} | {_cell(m['verified'], percent=True)} | {_strict_cell(m)} | "
        f"{_cell(m['not_attributable'], percent=True)} | {_ratio(m.get('fidelity'), 'reproduced')} | "
        f"{_ratio(m.get('trajectory_fidelity'), 'repeated')} | "
        f"{'-' if intervention is None else _cell(intervention)}, {_cell(m['control_replays'])} | "
        f"{_cell(m['proposals'])} | {m.get('stage_errors', '-')} | "
        f"{_cell(requests)}, {'-' if agent is None else _cell(agent)}, {'-' if agent_all is None else _cell(agent_all)} | {_cell(m['tokens'], digits=0)} | "
        f"{'-' if share is None else f'{share * 100:.0f}%'} | {_cell(m['seconds'], digits=0)} |"
    )


def _listing_lines(methods: dict[str, Any]) -> list[str]:
    """What verified each attribution, what became of the corrections, the verified steps, and the oracle's
    judgement of the methods that never saw the answer."""
    lines: list[str] = []
    sources = [
        f"- {name}: " + ", ".join(f"{how} {count}" for how, count in m["verified_by"].items())
        for name, m in methods.items()
        if m.get("verified_by")
    ]
    if sources:
        lines += ["", "What verified each verified attribution (correction source and kind):", *sources]
    outcomes = [
        f"- {name}: {sum(m['corrections'].values())} considered: "
        + "; ".join(f"{how} {count}" for how, count in m["corrections"].items())
        for name, m in methods.items()
        if m.get("corrections")
    ]
    if outcomes:
        lines += [
            "",
            "What became of the corrections each method considered over its scored runs (an auditor's or a rule's "
            "correction, or one of the agent's sampled decisions; refusals by their general reason):",
            *outcomes,
        ]
    steps = [
        f"- {name}: " + ", ".join(f"{v['question_id']} step {v['step']}" for v in m["verified_steps"])
        for name, m in methods.items()
        if m.get("verified_steps")
    ]
    if steps:
        lines += ["", "The step each verified attribution names:", *steps]
    oracle = [oracle_line(name, m) for name, m in methods.items() if m.get("withholds_expected")]
    if oracle:
        lines += [
            "",
            "Methods that never saw the expected answer (their flipped and verified columns are their own judgement "
            "of the replays): the verified records the expected answer confirms as corrected.",
            *oracle,
        ]
    return lines


def _undecided(metrics: dict[str, Any]) -> str:
    """The runs whose answer was undecided, where there are any (neither right nor failed)."""
    count = metrics.get("agent_undecided") or 0
    if not count:
        return ""
    return f"{count} undecided (the answer names several values without saying which it asserts: not a failed run), "


def _unscored_lines(methods: dict[str, Any]) -> list[str]:
    """The denominators, where they differ, and the runs given but not scored with what they cost."""
    scored = {name: m.get("scored") for name, m in methods.items()}
    lines: list[str] = []
    if len(set(scored.values())) > 1:
        lines += [
            "",
            "The denominators differ: scored runs "
            + ", ".join(f"{name} {count}" for name, count in scored.items())
            + ". Runs given but not scored (in no percentage or mean above), with what they cost:",
        ]
    elif any(m.get("unscored") for m in methods.values()):
        lines += ["", "Runs given but not scored (in no percentage or mean above), with what they cost:"]
    for name, m in methods.items():
        for run in m.get("unscored") or []:
            how = "skipped" if run["status"] == AttributionStatus.SKIPPED.value else "a stage failed"
            lines.append(
                f"- {name} {run['question_id']}: {how} ({_short(run['reason'])}): {run['llm_calls']} auditor calls "
                f"({run['model_requests']} model requests), {run['proposals']} agent decisions sampled, "
                f"{run['replays']} replays, {run['tokens']} tokens, {run['seconds']:.0f} s"
            )
        if m.get("unscored"):
            verified = len(m.get("verified_steps") or [])
            lines.append(
                f"- {name}: verified {verified} of the {m['runs']} runs given, a run not scored counted as not verified"
            )
    return lines


def _short(reason: str, limit: int = 60) -> str:
    reason = reason.split(":", 1)[0].strip() or "no reason recorded"
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def _wrong_step_lines(method: dict[str, Any] | None) -> list[str]:
    """How many of the wrong-step control's targets were localized steps, and per record which."""
    targets = (method or {}).get("targets")
    if not targets:
        return []
    count = targets["targets"]
    lines = [
        "",
        f"Wrong-step targets that REFLECT also localized: {targets['reflect_localized']} of {count} (another round "
        f"of the wrong-step record localized {targets['own_round_localized']} of {count}; either, "
        f"{targets['localized']} of {count}). A target is a step the wrong-step control placed a correction at "
        "(tried or refused); a target that some round localized tests that localization, not a wrong step:",
    ]
    for record in targets["records"]:
        where = ", ".join(f"step {t['step']} ({_localized_by(t)})" for t in record["targets"]) or "no target"
        verified = f"; verified at step {record['verified_step']}" if record["verified_step"] is not None else ""
        lines.append(f"- {record['question_id']}: {where}{verified}")
    return lines


def _localized_by(target: dict[str, Any]) -> str:
    by = [
        who
        for who, hit in (("REFLECT", target["reflect_localized"]), ("its other round", target["own_round_localized"]))
        if hit
    ]
    return "localized by " + " and ".join(by) if by else "localized by no round"


def oracle_line(name: str, method: dict[str, Any]) -> str:
    """``- NAME oracle_confirmed=K verified=N share=S``, then the Wilson interval: of the verified records of a
    method that never saw the expected answer, the share the expected answer confirms as corrected (the precision a
    user relies on when no answer is known)."""
    oracle = method.get("oracle") or {"confirmed": 0, "judged": 0}
    confirmed, judged = oracle["confirmed"], oracle["judged"]
    if not judged:
        return f"- {name} oracle_confirmed=0 verified=0 share=n/a; given {method['runs']} failures{_skipped(method)}"
    low, high = wilson(confirmed, judged)
    return (
        f"- {name} oracle_confirmed={confirmed} verified={judged} share={confirmed / judged:.2f} "
        f"(95% [{low:.2f}, {high:.2f}]); given {method['runs']} failures{_skipped(method)}"
    )
