"""wtq-live's table (``metrics.md``), from the figures :func:`~benchmarks.evaluation.live_metrics.live_metrics`
computed: one row per method, then the runs not scored, the claims, the wrong-step targets and what verified each
attribution."""

from __future__ import annotations

from typing import Any

from benchmarks.evaluation.live_rows import LIVE
from reflect_otel.attribution.controls import WrongStepControl
from reflect_otel.flagging._stats import wilson
from reflect_otel.record import AttributionStatus

__all__ = ["live_metrics_markdown", "oracle_line"]


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
