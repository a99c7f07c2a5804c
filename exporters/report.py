"""A self-contained HTML report of one attribution: the steps as a timeline with the decisive step (and the
benchmark's labelled steps) marked, what the run was judged against, the injected correction, and the original and corrected continuations side by side. Every piece of trace
content is HTML-escaped (it is untrusted); the page loads nothing from outside."""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Collection, Sequence

from reflect_otel.attribution._describe import confidence_text, error_type_text, labels_text, named_by, verdict_text
from reflect_otel.attribution.manual import MANUAL_METHOD
from reflect_otel.record import (
    AttributionRecord,
    AttributionStatus,
    Correction,
    InterventionKind,
    LocalizationOutcome,
    ReplayArm,
    ReplayAttempt,
)
from reflect_otel.trace import Step, StepAction, StructuredTrace
from reflect_otel.verdict import Verdict

__all__ = ["render_report"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#1d2430;background:#f6f7f9}
h1{font-size:1.4rem;margin:0 0 .3rem} h2{font-size:1.1rem;margin:1.6rem 0 .6rem}
.meta{color:#5a6372;font-size:.9rem} .badge{display:inline-block;padding:.15rem .6rem;border-radius:1rem;
font-weight:600;font-size:.85rem;margin-left:.5rem} .verified{background:#d3f5dd;color:#11632b}
.unverified{background:#fde9c8;color:#7a4a00} .skipped{background:#e4e7ec;color:#394150}
.card{background:#fff;border:1px solid #dde1e7;border-radius:.6rem;padding:1rem;margin:.6rem 0}
.timeline{list-style:none;padding:0;margin:0;border-left:3px solid #cfd5de}
.step{position:relative;margin:0 0 .6rem 1rem;background:#fff;border:1px solid #dde1e7;border-radius:.5rem;padding:.6rem .8rem}
.step::before{content:"";position:absolute;left:-1.45rem;top:.9rem;width:.7rem;height:.7rem;border-radius:50%;background:#9aa4b2}
.decisive{border:2px solid #d93f3f;background:#fff4f4} .decisive::before{background:#d93f3f}
.idx{font-weight:700;margin-right:.5rem} .kind{color:#5a6372;font-size:.8rem;text-transform:uppercase}
pre{white-space:pre-wrap;word-break:break-word;margin:.3rem 0 0;font-size:.85rem;background:#f1f3f6;padding:.4rem;border-radius:.3rem}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:1rem} table{border-collapse:collapse;font-size:.85rem}
td,th{border:1px solid #dde1e7;padding:.25rem .6rem;text-align:left} .flag{color:#d93f3f;font-weight:700}
.label{color:#11632b;font-weight:700}
"""


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _step(step: Step, decisive: bool, labelled: bool = False) -> str:
    parts = [
        f'<li class="step{" decisive" if decisive else ""}" id="step-{step.index}">',
        f'<span class="idx">{step.index}</span><span class="kind">{_e(step.kind.value)}</span>',
    ]
    if decisive:
        parts.append(' <span class="flag">decisive error</span>')
    if labelled:
        parts.append(' <span class="label">labelled by the benchmark</span>')
    if step.tool_name:
        parts.append(
            f"<pre>{_e(step.tool_name)}({_e(json.dumps(step.tool_args, ensure_ascii=False, default=str)[:1000])})</pre>"
        )
    if step.reasoning:
        parts.append(f"<pre>{_e(step.reasoning[:2000])}</pre>")
    if step.tool_result is not None:
        parts.append(f"<pre>&rarr; {_e(step.tool_result[:2000])}</pre>")
    parts.append("</li>")
    return "".join(parts)


def _steps(steps: Sequence[Step], decisive: int | None, labelled: Collection[int] = ()) -> str:
    if not steps:
        return "<p class='meta'>(none)</p>"
    return (
        '<ul class="timeline">' + "".join(_step(s, s.index == decisive, s.index in labelled) for s in steps) + "</ul>"
    )


def _kept(rollback_point: int) -> str:
    return f"steps 1..{rollback_point} kept" if rollback_point > 0 else "no step kept"


def _diagnosis(record: AttributionRecord, kind: str) -> str:
    """The finding in one paragraph, before the evidence."""
    if record.status is AttributionStatus.VERIFIED and record.intervention is not None:
        kept = record.intervention.rollback_point
        correction = record.intervention.correction
        redone = (
            "replaced by the call below"
            if correction is not None and correction.kind is InterventionKind.ACTION
            else "redone as the correction below says"
        )
        headline = (
            f"Step {_e(record.step_index)} caused the wrong answer"
            if record.claim == "localized"
            else f"Step {_e(record.step_index)} decided the wrong answer"
        )
        text = (
            f"<b>{headline}</b> ({_e(kind)}). The agent answered "
            f"<b>{_e(record.original_answer)}</b>{_stop(record.original_answer)} Replayed with {_kept(kept)} and step {_e(record.step_index)} "
            f"{redone}, it answered <b>{_e(record.corrected_answer)}</b>, which verifies as correct.{_control(record)}"
            f"{_localization(record)}{_proof(correction)}"
        )
    elif record.status is AttributionStatus.NOT_ATTRIBUTABLE and record.effect is not None:
        text = (
            f"<b>Not attributable:</b> an intervention at step {_e(record.effect.step_index)} flipped the answer, but "
            f"the flip cannot be credited to the step: {_e(record.reason)}{_stop(record.reason)}{_control(record)}"
        )
    elif record.method == MANUAL_METHOD:
        text = (
            f"<b>Your change of step {_e(record.step_index)}, replayed under control:</b> {_e(record.reason)}"
            f"{_stop(record.reason or 'x')}{_control(record)}"
        )
    elif record.step_index is not None:
        typed = f" ({_e(kind)})" if record.error_type is not None else ""
        text = (
            f"<b>Hypothesis, not verified:</b> {_e(named_by(record))} names step {_e(record.step_index)} as the "
            f"decisive error{typed}. No replay proved it: {_e(record.reason or 'no replay flipped the outcome')}"
            f"{_stop(record.reason or 'x')}"
        )
    else:
        text = f"No step was named: {_e(record.reason or 'see the errors below')}{_stop(record.reason or 'x')}"
    return f'<h2>Diagnosis</h2><div class="card"><p>{text}</p></div>'


def _control(record: AttributionRecord) -> str:
    """What the control and the sensitivity arm did beside the intervention, and the replay fidelity."""
    effect = record.effect
    if effect is None:
        return ""
    answers = ", ".join(repr(a) for a in effect.control.answers[:5]) or "nothing"
    fidelity = f" {_e(record.fidelity.text())}." if record.fidelity else ""
    sensitivity = ""
    if effect.sensitivity is not None:
        said = ", ".join(repr(a) for a in effect.sensitivity.answers[:5]) or "nothing"
        sensitivity = (
            f" With step {_e(effect.step_index)} changed in text only ({_e(effect.sensitivity_note)}), the sensitivity "
            f"arm, it answered {_e(said)}."
        )
    elif effect.sensitivity_note:
        sensitivity = f" No sensitivity arm ran: {_e(effect.sensitivity_note)}."
    intervals = f"intervention [{effect.intervention.low:.2f}, {effect.intervention.high:.2f}], control [{effect.control.low:.2f}, {effect.control.high:.2f}]"
    if effect.sensitivity is not None:
        intervals += f", sensitivity [{effect.sensitivity.low:.2f}, {effect.sensitivity.high:.2f}]"
    return (
        f" Replayed from the same prefix with no intervention (the control), it answered {_e(answers)}.{sensitivity} "
        f"<b>{_e(effect.text())}</b> (Wilson 95%: {intervals}).{fidelity}"
    )


def _localization(record: AttributionRecord) -> str:
    """What the localization test found: whether the same correction source flips the run at another step."""
    test = record.localization_test
    if test is None:
        return ""
    if test.outcome is LocalizationOutcome.LOCALIZED:
        return f" <b>Localized:</b> {_e(test.reason)}."
    if test.outcome is LocalizationOutcome.NOT_LOCALIZED:
        return f" <b>Decisive, not localized:</b> {_e(test.reason)}: the run turns on more than this step."
    return f" <b>Decisive; localization untested:</b> {_e(test.reason)}{_stop(test.reason)}"


def _call(correction: Correction) -> str:
    original = correction.original.render() if correction.original else ""
    if correction.kind is InterventionKind.GUIDANCE:
        return f"<pre>{_e(original[:600])}</pre><p class='meta'>guidance: {_e(correction.finding[:600])}</p>"
    replacement = correction.replacement.render() if correction.replacement else ""
    return f"<pre>{_e(original[:600])}</pre><pre>&rArr; {_e(replacement[:600])}</pre>"


def _proof(correction: Correction | None) -> str:
    """What proved it: the correction's source and kind, and the call it replaced with which."""
    if correction is None:
        return ""
    how = "executed in place of the step" if correction.kind is InterventionKind.ACTION else "injected as guidance"
    return (
        f"</p><p><b>What proved it:</b> a correction from <b>{_e(correction.source)}</b>, {how}"
        f"{' (' + _e(correction.finding[:300]) + ')' if correction.kind is InterventionKind.ACTION else ''}:"
        f"{_call(correction)}"
    )


def _corrections(record: AttributionRecord) -> str:
    """Every correction considered: source, kind, the step and call it replaced, replays, and the outcome."""
    if not record.corrections:
        return ""
    rows = []
    for c in record.corrections:
        if c.refused:
            outcome = f"refused: {_e(c.refused)}"
        else:
            outcome = "flipped" if c.flipped else ("did not flip" if c.replays else "not tried (stopped at a flip)")
        rows.append(
            f"<tr><td>{_e(c.source)}</td><td>{_e(c.kind.value)}</td><td>{c.step_index}</td><td>{_call(c)}</td>"
            f"<td>{c.replays}</td><td>{outcome}</td></tr>"
        )
    return (
        "<h2>Corrections tried</h2><table><tr><th>source</th><th>kind</th><th>step</th><th>original &rArr; "
        f"replacement</th><th>replays</th><th>outcome</th></tr>{''.join(rows)}</table>"
    )


def _replays_tried(record: AttributionRecord) -> str:
    """Each replay of an attribution that did not verify: where it restarted, what it was told, what the agent did
    and answered (folded; no script needed)."""
    items = []
    for attempt in record.replays:
        if attempt.error:
            outcome = f"failed: {_e(attempt.error)}"
        else:
            verdict = "right" if attempt.flipped else "still wrong"
            outcome = f"answered <b>{_e(attempt.final_answer)}</b> ({verdict})"
        gate = attempt.gate
        if gate is not None and not gate.is_faithful:
            outcome += f"; gate: {_e(gate.violation_type)} ({_e(gate.decided_by.value)})"
        correction = attempt.correction
        if attempt.arm is ReplayArm.CONTROL:
            given = "<p><b>Control:</b> the same prefix, no intervention</p>"
        elif attempt.arm is ReplayArm.SENSITIVITY:
            given = "<p><b>Sensitivity:</b> the same prefix, the step changed in text only</p>"
        elif correction is not None and correction.kind is InterventionKind.ACTION and correction.replacement:
            given = f"<p><b>Executed instead ({_e(correction.source)})</b></p><pre>{_e(correction.replacement.render())}</pre>"
        else:
            given = f"<p><b>Injected correction</b></p><pre>{_e(attempt.injection)}</pre>"
        items.append(
            f"<details><summary>Round {attempt.round}: {_kept(attempt.rollback_point)}, step "
            f"{attempt.rollback_point + 1} redone &rarr; {outcome}</summary>"
            f"{given}<p><b>What the agent did</b></p>{_steps(attempt.continuation, None)}</details>"
        )
    return f'<h2>Replays tried</h2><div class="card">{"".join(items)}</div>' if items else ""


def _judged(
    trace: StructuredTrace, record: AttributionRecord | None, verdict: Verdict | None, expected: str | None
) -> str:
    """What the run was judged against (the expected answer, the verifier's verdict) and the benchmark's labels,
    beside the attribution."""
    rows = [f"<p><b>Judged:</b> {_e(verdict_text(verdict, expected))}</p>"]
    compared = labels_text(trace.labels, record.step_index if record else None)
    if compared:
        items = "".join(
            f"<li>{'step ' + _e(label.step_index) if label.step_index is not None else 'no step'}: "
            f"{_e(label.category)}{' (' + _e(label.impact) + ')' if label.impact else ''}"
            f"{': ' + _e(label.description[:600]) if label.description else ''}</li>"
            for label in trace.labels
        )
        rows.append(f"<p><b>The benchmark's labels:</b> {_e(compared)}</p><ul>{items}</ul>")
    return "".join(rows)


def render_report(
    trace: StructuredTrace,
    record: AttributionRecord | None,
    *,
    verdict: Verdict | None = None,
    expected: str | None = None,
) -> str:
    """The report as one HTML string. ``verdict`` is the run's verdict when the record carries none (the store's);
    ``expected`` the expected answer, when known."""
    verdict = (record.original_verdict if record is not None else None) or verdict
    body = [_header(trace, record, verdict, expected)]
    if record is not None:
        body.append(_attribution(record))
    body.append("<h2>Steps</h2>")
    body.append(_run_steps(trace, record))
    body.append(_try_another(trace, record))
    if record is not None and record.cost:
        body.append(_cost(record))
    title = f"reflect-otel: {trace.trace_id}"
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>{''.join(body)}</body></html>"
    )


def _header(
    trace: StructuredTrace, record: AttributionRecord | None, verdict: Verdict | None, expected: str | None
) -> str:
    """The title with the record's status, and the card of the question, the answers and the verdict."""
    status = record.status.value if record else "not attributed"
    badge = f'<span class="badge {_e(status) if record else "skipped"}">{_e(status)}</span>'
    return (
        f"<h1>Trace {_e(trace.trace_id)}{badge}</h1>"
        f'<p class="meta">{_e(trace.source.framework)} &middot; {len(trace.steps)} steps &middot; '
        f"collected by {_e(trace.source.collector)}</p>"
        f'<div class="card"><b>Question</b><pre>{_e(trace.question[:4000])}</pre>'
        f"<b>Final answer</b><pre>{_e(trace.final_answer)}</pre>"
        + (f"<b>Expected answer</b><pre>{_e(expected)}</pre>" if expected is not None else "")
        + _judged(trace, record, verdict, expected)
        + "</div>"
    )


def _attribution(record: AttributionRecord) -> str:
    """The diagnosis, the attribution's card (step, method, confidence, explanation, root cause, note, fidelity),
    the injected correction and the corrections tried."""
    kind = error_type_text(record)
    verified = record.status is AttributionStatus.VERIFIED
    body = [_diagnosis(record, kind)]
    step = (
        f"<b>Decisive step:</b> {_e(record.step_index)} &middot; <b>Error type:</b> {_e(kind)}"
        if record.step_index is not None
        else "<b>Decisive step:</b> none named"
    )
    body.append(
        '<h2>Attribution</h2><div class="card">'
        f"<p>{step} &middot; <b>Method:</b> {_e(record.method)} ({_e(record.mode.value)})</p>"
        f"<p><b>Confidence:</b> {_e(confidence_text(record))}</p>"
    )
    if record.explanation:
        heading = "Explanation" if verified else f"The hypothesis of {named_by(record)} (not verified)"
        body.append(f"<p><b>{_e(heading)}</b></p><pre>{_e(record.explanation)}</pre>")
    if record.root_cause:
        body.append(f"<p><b>Root cause</b></p><pre>{_e(record.root_cause)}</pre>")
    if record.reason:
        body.append(f"<p><b>Note:</b> {_e(record.reason)}</p>")
    if record.fidelity is not None:
        body.append(f"<p><b>Replay fidelity:</b> {_e(record.fidelity.text())} (control replays)</p>")
    body.append("</div>")
    intervention = record.intervention
    if intervention is not None and intervention.injection:
        body.append(
            f"<h2>Injected correction (after step {intervention.rollback_point})</h2>"
            f'<div class="card"><pre>{_e(intervention.injection)}</pre></div>'
        )
    body.append(_corrections(record))
    return "".join(body)


def _run_steps(trace: StructuredTrace, record: AttributionRecord | None) -> str:
    """The run's steps: for a verified record, the kept prefix then the original, control, sensitivity and
    corrected continuations side by side; else the steps and the replays tried."""
    decisive = record.step_index if record else None
    labelled = {label.step_index for label in trace.labels if label.step_index is not None}
    flipped = _deciding(record) if record else None
    if record is None or record.status is not AttributionStatus.VERIFIED or flipped is None:
        return _steps(trace.steps, decisive, labelled) + (_replays_tried(record) if record is not None else "")
    point = flipped.rollback_point
    kept_steps = f"Steps 1..{point} were kept; after them" if point else "No step was kept"
    body = [
        f'<p class="meta">{kept_steps}: the original run and the corrected replay (answer: '
        f"{_e(record.corrected_answer)}).</p>"
    ]
    if point:
        body.append(_steps(trace.steps[:point], decisive, labelled))
    arms = _arm_column(record, ReplayArm.CONTROL, point, "Control (no intervention)") + _arm_column(
        record, ReplayArm.SENSITIVITY, point, "Sensitivity (changed in text only)"
    )
    body.append(
        f'<div class="cols"><div><h2>Original continuation</h2>{_steps(trace.steps[point:], decisive, labelled)}'
        f"<p><b>Answer:</b> {_e(record.original_answer)}</p></div>{arms}"
        f"<div><h2>Corrected continuation</h2>{_steps(flipped.continuation, None)}"
        f"<p><b>Answer:</b> {_e(flipped.final_answer)}</p></div></div>"
    )
    return "".join(body)


def _arm_column(record: AttributionRecord, arm: ReplayArm, point: int, heading: str) -> str:
    """The first replay of ``arm`` from ``point`` that ran, as a column; "" when there is none."""
    replay = next((a for a in record.replays if a.arm is arm and a.rollback_point == point and not a.error), None)
    if replay is None:
        return ""
    return (
        f"<div><h2>{heading}</h2>{_steps(replay.continuation, None)}"
        f"<p><b>Answer:</b> {_e(replay.final_answer)}</p></div>"
    )


def _cost(record: AttributionRecord) -> str:
    rows = "".join(
        f"<tr><td>{_e(c.stage)}</td><td>{c.calls}</td><td>{c.requests}</td><td>{c.prompt_tokens}</td>"
        f"<td>{_e(c.cached_prompt_tokens if c.cached_prompt_tokens is not None else '-')}</td>"
        f"<td>{c.completion_tokens}</td><td>{c.seconds:.2f}</td></tr>"
        for c in record.cost
    )
    return (
        "<h2>Cost</h2><table><tr><th>stage</th><th>calls</th><th>model requests</th><th>prompt tokens</th>"
        "<th>from cache</th>"
        f"<th>completion tokens</th><th>seconds</th></tr>{rows}</table>"
    )


def _try_another(trace: StructuredTrace, record: AttributionRecord | None) -> str:
    """The commands that replay the run from its decisive step (else its last step before the answer) with a change
    of the reader's own, under control: the call to edit (the one that verified, else the step's own), and the
    agent's own decision there resampled."""
    replaceable = [s.index for s in trace.steps if not s.is_final_answer]
    if not replaceable:
        return ""
    named = record.step_index if record is not None else None
    step = named if named in replaceable else replaceable[-1]
    original = trace.steps[step - 1]
    tried = record.verified_by if record is not None else None
    if tried is not None and (tried.step_index != step or tried.replacement is None):
        tried = None
    shown = tried.replacement if tried is not None and tried.replacement is not None else StepAction.of_step(original)
    head = f"reflect-otel replay {trace.trace_id[:12]} --step {step}"
    change = "--call" if shown.tool_name is not None else "--text"
    edited = f"{head} {change} {shlex.quote(shown.render()[:2000])}"
    which = "the call that verified it" if tried is not None else f"step {step} as the run made it"
    return (
        '<h2>Try another change</h2><div class="card"><p>Replay the run from step '
        f"{step} with a change of your own, under the rule every attribution is tested under (from the same prefix: "
        "your change, the control and the sensitivity arm). Edit the call below (it is "
        f"{_e(which)}), or let the agent redo the step itself:</p><pre>{_e(edited)}</pre>"
        f"<pre>{_e(head)} --resample 3</pre><p class='meta'>Add <code>--store</code> as for this report. The record "
        "is stored as method <code>manual</code>; <code>reflect-otel report ... --method manual</code> shows it.</p>"
        "</div>"
    )


def _deciding(record: AttributionRecord) -> ReplayAttempt | None:
    """The intervention replay that verified the record (the first flip of its correction at its point)."""
    intervention = record.intervention
    flips = [a for a in record.replays if a.flipped and a.arm is ReplayArm.INTERVENTION]
    if intervention is not None:
        for attempt in flips:
            if attempt.correction == intervention.correction and attempt.rollback_point == intervention.rollback_point:
                return attempt
    return flips[0] if flips else None


def _stop(text: str | None) -> str:
    """A sentence's full stop after quoted text, unless the text ends a sentence itself."""
    return "" if text and text.rstrip()[-1:] in ".!?" else "."
