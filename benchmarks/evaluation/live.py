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

The figures are :mod:`benchmarks.evaluation.live_metrics`'s, the table :mod:`benchmarks.evaluation.live_table`'s.

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

from benchmarks.evaluation.live_metrics import live_metrics
from benchmarks.evaluation.live_rows import LIVE, Judgement, LiveRow, MethodRow, read_live_rows
from benchmarks.evaluation.live_table import live_metrics_markdown
from benchmarks.evaluation.rows_file import RowsFile
from benchmarks.evaluation.run_config import (
    REGIME,
    RUN_CONFIG,
    VERIFICATION,
    code_line,
    read_json_object,
    write_run_config,
)
from reflect_otel.attribution.controls import PlanPool
from reflect_otel.attribution.methods import METHODS, method_spec
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import ReflectConfig
from reflect_otel.demo.runs import AgentRun, RebuildRun, RunAgent
from reflect_otel.demo.wtq import WTQQuestion, load_questions
from reflect_otel.errors import InputError
from reflect_otel.flagging.judge import judge_answer
from reflect_otel.flagging.verifiers import OracleVerifier, judged_correct
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.record import AttributionRecord, ReplayArm
from reflect_otel.replay import ReplayAdapter
from reflect_otel.trace import StructuredTrace

__all__ = [
    "AgentRun",
    "LiveOptions",
    "check_methods",
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
