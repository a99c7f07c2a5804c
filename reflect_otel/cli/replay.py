"""``reflect-otel replay TRACE --step N (--call CALL | --text TEXT | --resample K)``: a stored run replayed from one
step with your change, under the controlled rule of every attribution (:mod:`reflect_otel.attribution.manual`), the three arms
printed side by side and the record stored as method ``manual``.

The run's agent is re-run through the replay adapter it has: an HTTP replay endpoint named in ``--replay-config``
(an agent in another process), the demo's agents rebuilt on their bundled question (the LangGraph table agent and
the SQL tool loop, on the configured model or the embedded one), or an installed adapter that claims the run (the
chain-of-thought adapter)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reflect_otel.attribution.manual import ManualEdit, arm_replays, check_edit, conclusion, manual_method
from reflect_otel.cli._online import replay_endpoints
from reflect_otel.cli._options import (
    add_agent_determinism_option,
    add_export_option,
    add_replay_config_option,
    agent_is_deterministic,
    paragraph,
    pipeline_config,
    positive_int,
)
from reflect_otel.cli._progress import Progress, search_logs_to
from reflect_otel.errors import ConfigError, InputError
from reflect_otel.record import AttributionRecord, AttributionStatus, ReplayArm, ReplayAttempt
from reflect_otel.replay import ReplayAdapter, find_replay_adapter, is_deterministic
from reflect_otel.store import check_store_target, open_exporter, open_store, store_target
from reflect_otel.trace import EXPECTED_ANSWER_FIELD, Step, StepAction, StructuredTrace

if TYPE_CHECKING:
    from reflect_otel.attribution.service import AttributionService
    from reflect_otel.config import ReflectConfig
    from reflect_otel.demo.wtq import WTQQuestion
    from reflect_otel.llm.base import StructuredLLM

__all__ = ["add_replay_command", "replay_command"]

DEMO_AGENTS = ("table_qa", "sql_agent")
"""The root span names the demo's agents run under (``reflect-otel demo``, ``demo --agent sql``)."""


_DESCRIPTION = paragraph(
    """
Replay a run from the store from step N with your change of that step, through the replay adapter the run has (an
HTTP replay endpoint named in --replay-config, the demo's agents rebuilt on their bundled question, the
chain-of-thought adapter), under the rule attribution uses: from the same prefix, the intervention (your change,
which must change what the step produced), the control (the step left alone) and, before a flip is credited, the
sensitivity arm (the step changed in text only). Prints the steps each arm took, their answers and what the rule
concludes, and stores the record as method 'manual' ('reflect-otel report TRACE --method manual' shows it).
"""
)
"""What ``reflect-otel replay --help`` says the command does."""


def add_replay_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replay", help="replay a stored run from one step with your change, under control", description=_DESCRIPTION
    )
    _add_change_options(parser)
    _add_run_options(parser)
    parser.set_defaults(handler=replay_command)


def _add_change_options(parser: argparse.ArgumentParser) -> None:
    """The run, the step, and the change: a call, a thought, or the agent's own decision resampled."""
    parser.add_argument("trace_id", help="the run's trace id in the store (a unique prefix is enough)")
    parser.add_argument("--step", type=positive_int, required=True, help="the step to change (as report numbers it)")
    change = parser.add_mutually_exclusive_group(required=True)
    change.add_argument(
        "--call",
        help='a tool call executed in place of the step, written as the report prints one: tool({"arg": value}), '
        'e.g. \'search_books({"text": "orchard"})\'',
    )
    change.add_argument("--text", help="a thought put in the step's place (a chain of thought)")
    change.add_argument(
        "--resample",
        type=positive_int,
        metavar="K",
        help="the agent's own decision at the step, asked K times with no hint; each distinct one executed",
    )


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """How the test is judged and paid for, how the agent is re-run, and where the record goes."""
    parser.add_argument(
        "--expected",
        help="the correct answer (default: the one stored with the run, then its root span's, then the bundled "
        "question's for a demo run)",
    )
    add_replay_config_option(
        parser, help="TOML file mapping each agent's service.name to its HTTP replay endpoint (as for 'attribute')"
    )
    parser.add_argument(
        "--max-replays",
        type=positive_int,
        help="replays this test may make, the control and the sensitivity arm included (default "
        "REFLECT_MAX_REPLAYS, 12); one too small for a test is refused before anything runs",
    )
    parser.add_argument(
        "--verify-samples",
        type=int,
        metavar="N",
        help="replays per arm when the agent's replays are sampled (default REFLECT_VERIFY_SAMPLES, 3)",
    )
    parser.add_argument(
        "--max-steps", type=positive_int, default=6, help="a demo agent's step limit, as the demo ran it (default 6)"
    )
    add_agent_determinism_option(parser)
    parser.add_argument("--store", help="DuckDB file or PostgreSQL URL (default: REFLECT_STORE, then ./reflect.duckdb)")
    add_export_option(parser, help="also send the record to otlp or phoenix, as 'attribute --export' does; repeatable")


@dataclass(frozen=True, slots=True)
class _Agent:
    """The run's agent, ready to replay: its adapter, what it was given besides the question, the expected answer
    it knows (a bundled question's), and what it is, in words."""

    adapter: ReplayAdapter
    context: str
    expected: str | None
    what: str


def replay_command(args: argparse.Namespace) -> int:
    edit = ManualEdit.of(args.step, call=args.call, text=args.text, resample=args.resample)  # before any work
    for name in dict.fromkeys(args.export):
        open_exporter(name).shutdown()  # an unknown exporter fails here, naming the installed ones
    config = pipeline_config(args)
    max_replays = args.max_replays or config.max_replays
    trace, stored_expected = _stored_run(args.store, args.trace_id)
    check_edit(trace, edit)
    progress = Progress(time.monotonic())
    agent = _agent(trace, args, progress)
    per_arm = _replays_per_arm(agent, trace, config.verify_samples, max_replays)
    expected = args.expected or stored_expected or trace.metadata.get(EXPECTED_ANSWER_FIELD) or agent.expected
    if not expected:
        raise ConfigError(
            f"run {trace.trace_id} has no expected answer stored, so no replay can be judged right: give --expected"
        )
    service = _service(args, edit, trace, config, max_replays)
    progress.say(
        f"replaying {trace.trace_id[:12]} ({agent.what}) with {edit.describe()}: the intervention, the control and "
        f"(before a flip is credited) the sensitivity arm, {per_arm} replay(s) each"
        + (f", at most {max_replays} in all" if max_replays else "")
    )
    try:
        with search_logs_to(_SearchLines(progress)):
            outcome = service.process(trace, expected=expected, replay=agent.adapter, domain_context=agent.context)
    finally:
        service.shutdown()
    record = outcome.record
    assert record is not None  # without triage every trace gets a record
    for name, message in outcome.export_failures:
        print(f"export to {name} failed: {message}", file=sys.stderr)
    print(render_arms(trace, record, expected=expected))
    print(
        f"\nStored as a record of method manual in {store_target(args.store)}. Next:\n"
        f"  reflect-otel report {trace.trace_id[:12]} --method manual -o report.html"
        + (f" --store {args.store}" if args.store else "")
    )
    return 1 if outcome.export_failures else 0


def _replays_per_arm(agent: _Agent, trace: StructuredTrace, verify_samples: int, max_replays: int | None) -> int:
    """Replays per arm (one when the agent's replays are deterministic); a ``--max-replays`` too small for one
    controlled test is refused before anything runs."""
    deterministic = is_deterministic(agent.adapter, trace)
    per_arm = 1 if deterministic else verify_samples
    if max_replays is not None and max_replays < 3 * per_arm:
        raise ConfigError(
            f"--max-replays {max_replays} cannot pay for one controlled test of this run, which needs {3 * per_arm} "
            f"replays (an intervention, a control and a sensitivity arm, {per_arm} each: this agent's replays are "
            f"{'deterministic' if deterministic else 'sampled'}); give --max-replays {3 * per_arm} or more"
        )
    return per_arm


def _service(
    args: argparse.Namespace, edit: ManualEdit, trace: StructuredTrace, config: ReflectConfig, max_replays: int | None
) -> AttributionService:
    """The service that tests ``edit`` under the controlled rule and stores (and exports) its record."""
    from reflect_otel.attribution.service import AttributionService
    from reflect_otel.llm.factory import NoModel

    return AttributionService(
        NoModel(),  # the manual method asks no model: the oracle judges the replays
        manual_method(edit),
        verifier=_verifier(trace),
        config=config,
        store=open_store(args.store),
        exporters={name: open_exporter(name) for name in dict.fromkeys(args.export)},
        max_replays=max_replays,
    )


def _stored_run(explicit: str | None, prefix: str) -> tuple[StructuredTrace, str | None]:
    """The stored run whose trace id starts with ``prefix``, and the expected answer stored with it (its job's)."""
    from reflect_otel.cli.store import (
        connect_store_read_only,
        find_stored_trace,
        stored_expected_answer,
        stored_model,
    )

    check_store_target(explicit, reading=True)
    db = connect_store_read_only(explicit)
    try:
        trace_id, trace_json = find_stored_trace(db, prefix, noun="run", where=store_target(explicit))
        expected = stored_expected_answer(db, trace_id)
    finally:
        db.close()
    return stored_model(StructuredTrace, trace_json), (str(expected) if expected is not None else None)


def _verifier(trace: StructuredTrace) -> Any:
    """The judge of the run's replays: BIG-Bench-Mistake answers for its traces, else the oracle."""
    from reflect_otel.datasets.bbm import BBMVerifier
    from reflect_otel.flagging.verifiers import OracleVerifier

    return BBMVerifier() if trace.metadata.get("dataset") == "bbm" else OracleVerifier()


def _agent(trace: StructuredTrace, args: argparse.Namespace, progress: Progress) -> _Agent:
    """The adapter that re-runs the run's agent: its HTTP endpoint when ``--replay-config`` names one, else a demo
    agent rebuilt on its bundled question, else an installed adapter that claims the run."""
    from reflect_otel.config import LLMConfig
    from reflect_otel.llm.factory import LazyLLM, NoModel, make_llm

    endpoints = replay_endpoints(args.replay_config)
    if endpoints is not None:
        adapter = endpoints(trace, NoModel())
        if adapter is not None:
            return _Agent(adapter, "", None, f"the replay endpoint of service {trace.source.service}")
    question = _demo_question(trace)
    if question is not None:
        progress.say("starting the model (the demo agent runs on it)")
        return _demo_agent(trace, question, make_llm(LLMConfig.from_env()), args)
    llm = LazyLLM(lambda: make_llm(LLMConfig.from_env()))  # started only if the adapter's agent runs on it
    found = find_replay_adapter(trace, llm)
    if found is not None:
        return _Agent(found, _dataset_context(trace), None, f"{type(found).__name__}")
    where = f"service {trace.source.service!r}" if trace.source.service else "its service (none recorded)"
    raise ConfigError(
        f"no replay adapter can re-run run {trace.trace_id[:12]} (agent {trace.agent!r}, {where}): give "
        "--replay-config FILE naming its HTTP replay endpoint (see 'collect --help'), or replay it in Python with "
        "reflect_otel.replay_from(trace, step, ..., replay=your_adapter)"
    )


def _dataset_context(trace: StructuredTrace) -> str:
    """The BIG-Bench-Mistake task a dataset trace came from (its chain of thought must be told the task)."""
    from reflect_otel.datasets import BBM_TASKS

    task = trace.metadata.get("task", "") if trace.metadata.get("dataset") == "bbm" else ""
    return f"{task}: {BBM_TASKS[task]}" if task in BBM_TASKS else ""


def _demo_question(trace: StructuredTrace) -> WTQQuestion | None:
    """The bundled question a run of a demo agent answered (by its agent's name and its question), or None."""
    if trace.agent not in DEMO_AGENTS:
        return None
    from reflect_otel.demo.wtq import load_questions

    asked = " ".join(trace.question.split()).casefold()
    return next((q for q in load_questions() if " ".join(q.question.split()).casefold() == asked), None)


def _demo_agent(trace: StructuredTrace, question: WTQQuestion, llm: StructuredLLM, args: argparse.Namespace) -> _Agent:
    from reflect_otel.cli._demo_runs import sql_agent_runs, table_agent_rebuilt
    from reflect_otel.online.setup import instrumented_provider

    provider = instrumented_provider()
    deterministic = agent_is_deterministic(args, llm)
    if trace.agent == "sql_agent":
        from reflect_otel.demo.sql_agent import chat_client

        client, model = chat_client(llm)
        _run, rebuild = sql_agent_runs(client, model, provider, max_steps=args.max_steps, deterministic=deterministic)
        what = f"the demo's SQL agent on {question.id}"
    else:
        rebuild = table_agent_rebuilt(llm, provider, max_steps=args.max_steps, deterministic=deterministic)
        what = f"the demo's table agent on {question.id}"
    try:
        run = rebuild(question, trace)
    except Exception as error:  # the table agent checks that the run's calls still give its results
        raise InputError(f"the {what} cannot be rebuilt from run {trace.trace_id[:12]}: {error}") from None
    return _Agent(run.replay, run.context, question.expected, what)


class _SearchLines(logging.Handler):
    def __init__(self, progress: Progress) -> None:
        super().__init__(logging.INFO)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno != logging.INFO:
            logging.getLogger().handle(record)
        elif not record.getMessage().startswith("round "):  # "step N localized": the step you chose, here
            self.progress.say(record.getMessage())


_ARMS = (
    (ReplayArm.INTERVENTION, "intervention", "your change"),
    (ReplayArm.CONTROL, "control", "the step left alone"),
    (ReplayArm.SENSITIVITY, "sensitivity", "the step changed in text only"),
)
_SHOWN = 160


def render_arms(trace: StructuredTrace, record: AttributionRecord, *, expected: str | None) -> str:
    """A manual record's arms side by side, for a terminal: per arm the steps it took from the changed step on and
    its answer, judged; then what the rule concluded."""
    arms = arm_replays(record)
    step = int(record.config.get("manual_edit", {}).get("step") or record.step_index or 1)
    original = trace.steps[step - 1] if 1 <= step <= len(trace.steps) else None
    lines = [
        "",
        f"Run {trace.trace_id[:12]}: {_cut(trace.question)}",
        f"  answered {_answer(trace.final_answer)}" + (f"; expected {_answer(expected)}" if expected else ""),
    ]
    if original is not None:
        lines.append(f"  step {step} did: {_did(original)}")
    width = max(len(name) for _, name, _ in _ARMS)
    for arm, name, meaning in _ARMS:
        attempts = arms.get(arm, [])
        lines.append("")
        if not attempts:
            why = (
                "not run: the rule runs it only before a flip is credited"
                if arm is ReplayArm.SENSITIVITY
                else "not run"
            )
            lines.append(f"  {name.ljust(width)}  ({meaning}) {why}")
            continue
        if arm is ReplayArm.SENSITIVITY and record.effect is not None and record.effect.sensitivity_note:
            meaning = f"{meaning}: {record.effect.sensitivity_note}"
        for number, attempt in enumerate(attempts, start=1):
            label = name if len(attempts) == 1 else f"{name} {number}"
            lines.append(f"  {label.ljust(width + 2)}({meaning}){_change(attempt)}")
            lines += _taken(attempt, width)
    test = record.localization_test
    extra = arms.get(ReplayArm.LOCALIZATION, [])
    if test is not None and extra:
        lines += ["", f"  localization test (step {test.step_index}): {test.outcome.value}: {_cut(test.reason, 300)}"]
    status = record.status.value.replace("_", " ")
    said = conclusion(record) if record.status is AttributionStatus.VERIFIED else record.reason
    lines += ["", f"The rule: {status}. {said[:1].upper()}{said[1:]}"]
    return "\n".join(lines)


def _taken(attempt: ReplayAttempt, width: int) -> list[str]:
    pad = " " * (width + 4)
    if attempt.error is not None:
        return [f"{pad}failed: {_cut(attempt.error, 300)}"]
    shown = [f"{pad}step {s.index}: {_did(s)}" for s in attempt.continuation if not s.is_final_answer]
    judged = "right" if attempt.flipped else "wrong"
    shown.append(f"{pad}answer: {_answer(attempt.final_answer)} ({judged})")
    return shown


def _change(attempt: ReplayAttempt) -> str:
    if attempt.arm is not ReplayArm.INTERVENTION or attempt.change is None:
        return ""
    return f": {attempt.change.text}"


def _did(step: Step) -> str:
    action = StepAction.of_step(step).render()
    if step.tool_name is None:
        return repr(_cut(action))
    result = " ".join((step.tool_result or "").split())
    return f"{_cut(action)} -> {_cut(result, 100)!r}" if step.tool_result is not None else _cut(action)


def _answer(text: str | None) -> str:
    return repr(_cut(text, 200)) if text is not None else "nothing"


def _cut(text: str | None, limit: int = _SHOWN) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
