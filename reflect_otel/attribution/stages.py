"""The LLM stages of REFLECT, each one call (plus its repair retry): localize, classify, diagnose, gate, explain.

Each raises :class:`~reflect_otel.errors.LLMError` on failure; the pipeline decides what a failure means.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from reflect_otel import prompts
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.prompts._tool_calls import arguments_of
from reflect_otel.reading.tool_definitions import available_tools
from reflect_otel.record import Classification, Correction, GateDecider, GateVerdict, Localization, RepairPlan, Stage
from reflect_otel.trace import Step, StepAction, StepKind, StructuredTrace, ToolDefinition

__all__ = [
    "PlanAsk",
    "classify",
    "diagnose",
    "gate_by_rules",
    "gate_with_llm",
    "known_tool",
    "localize",
    "null_plan",
    "step_in_range",
]


def step_in_range(count: int, excluded: Collection[int] = ()) -> Callable[[prompts.LocalizationOutput], str | None]:
    def check(out: prompts.LocalizationOutput) -> str | None:
        if not 1 <= out.error_step <= count:
            return f"error_step must be a step number from 1 to {count}, got {out.error_step}"
        if out.error_step in excluded:
            return f"step {out.error_step} was localized and tested already; name another step"
        return None

    return check


def localize(
    llm: StructuredLLM,
    ctx: prompts.PromptContext,
    trace: StructuredTrace,
    *,
    tested: Mapping[int, str] | None = None,
    excluded: Collection[int] = (),
) -> Localization:
    """The earliest decisive error step. ``tested`` maps steps replays tested already to what came of it, shown to
    the localizer; it must not name a step of ``excluded`` (those earlier rounds localized)."""
    tested = tested or {}
    summary = "\n".join(f"step {step}: {outcome}" for step, outcome in sorted(tested.items()))
    out = llm.complete(
        prompts.localization(ctx, trace.steps, summary),
        prompts.LocalizationOutput,
        stage=Stage.LOCALIZE,
        check=step_in_range(len(trace.steps), excluded),
    ).value
    return Localization(
        step_index=out.error_step,
        confidence=out.confidence,
        reasoning=out.reasoning,
        suggested_fix=out.what_should_have_been_done,
    )


def classify(llm: StructuredLLM, ctx: prompts.PromptContext, trace: StructuredTrace, step_index: int) -> Classification:
    out = llm.complete(
        prompts.classification(ctx, trace.steps, step_index), prompts.ClassificationOutput, stage=Stage.CLASSIFY
    ).value
    return Classification(
        error_type=out.error_type,
        confidence=out.confidence,
        explanation=out.explanation,
        suggested_correction=out.suggested_correction,
    )


@dataclass(frozen=True, slots=True)
class PlanAsk:
    """What a diagnosis is asked for: with ``corrected_step``, the erroneous step rewritten, as a call of one of
    ``tools`` (under a schema that admits no other tool) or for a chain of thought a thought; ``candidates`` shown
    to the auditor as options; ``temperature`` to sample it at (a second opinion; None: the configured one)."""

    tools: Sequence[ToolDefinition] = ()
    candidates: Sequence[Correction] = ()
    corrected_step: bool = True
    temperature: float | None = None


def diagnose(
    llm: StructuredLLM,
    ctx: prompts.PromptContext,
    trace: StructuredTrace,
    localization: Localization,
    classification: Classification | None,
    ask: PlanAsk = PlanAsk(),
) -> RepairPlan:
    """The repair plan, as ``ask`` asks for it; without a corrected step, or when the agent has neither tools nor a
    chain of thought, the paper's plan. The plan is the auditor's, answer and all: what of it reaches a replay is
    guarded where it is given (:mod:`reflect_otel.attribution.leaks`), part by part, so a root cause that names the
    answer costs the plan nothing but that root cause."""
    index, tools = localization.step_index, ask.tools
    output = (
        prompts.diagnosis_output(tools, chain_of_thought=not tools and _chain_of_thought(trace))
        if ask.corrected_step
        else prompts.DiagnosisOutput
    )
    reading = prompts.StepReading(
        index,
        classification.error_type.value if classification else "unknown",
        classification.explanation if classification else localization.reasoning,
        classification.suggested_correction if classification else localization.suggested_fix,
    )
    shown = [
        f"Step {c.step_index}: {c.replacement.render()}  (from: {c.finding})" for c in ask.candidates if c.replacement
    ]
    messages = prompts.diagnosis(ctx, trace.steps, reading, output, shown)
    out = llm.complete(messages, output, stage=Stage.DIAGNOSE, temperature=ask.temperature).value
    original = trace.steps[index - 1] if 1 <= index <= len(trace.steps) else None
    return _plan(out, trace, tools, original)


def _plan(out: BaseModel, trace: StructuredTrace, tools: Sequence[ToolDefinition], original: Step | None) -> RepairPlan:
    """The repair plan from the auditor's reply ``out``: its corrected step unless it repeats ``original``, and
    the tool to call next only by a name the agent has."""
    corrected = _corrected_step(out)
    if original is not None and corrected is not None and corrected.same_as(StepAction.of_step(original)):
        corrected = None  # repeats the erroneous step: nothing to test (a retry costs a call and rarely fixes it)
    legacy = out if isinstance(out, prompts.DiagnosisOutput) else None
    written = (legacy.expected_next_tool or "").strip() if legacy else (corrected.tool_name or "" if corrected else "")
    if written.lower() in ("", "null", "none"):
        written = ""
    expected_tool = (known_tool(written, _tool_names(trace, tools)) or "") if written else ""
    if legacy is not None:
        arguments = _arguments(legacy.expected_next_arguments) if expected_tool else None
    else:
        arguments = _arguments(_scalars(corrected.arguments)) if corrected is not None and expected_tool else None
    instruction: str = getattr(out, "correction_instruction", "")
    return RepairPlan(
        root_cause=getattr(out, "root_cause", ""),
        correction_instruction=instruction,
        forbidden_actions=_not_contradicting(
            getattr(out, "forbidden_actions", []), instruction, expected_tool or written
        ),
        expected_next_tool=expected_tool or None,
        written_next_tool=written[:_MAX_NAME_CHARS] if written != expected_tool else None,
        expected_next_arguments=arguments,
        confidence=getattr(out, "confidence", 0.0),
        corrected_step=corrected,
    )


_MAX_NAME_CHARS = 200
_SEPARATORS = re.compile(r"[\s_.-]+")


def _tool_names(trace: StructuredTrace, tools: Sequence[ToolDefinition]) -> set[str]:
    """Every name the agent is known to have a tool by: the tools given, those its trace recorded, those it called."""
    names = {t.name for t in tools} | {t.name for t in available_tools(trace)}
    return names | {s.tool_name for s in trace.steps if s.tool_name}


def known_tool(name: str, tools: Collection[str]) -> str | None:
    """The one tool of ``tools`` that ``name`` (an auditor's free text) names, or None when it names none or several:
    ``name`` itself, else the one tool spelt as it is up to case and separators, else the one tool whose name's
    first words it is (``search`` for ``search_orders``, when no other tool begins ``search``).

    Why no looser rule: the rule gate refuses every proposal that calls another tool than this one, so a wrong guess
    refuses a right proposal (a plan's ``search``, no tool at all, refused ``search_orders``). Case and whole leading
    words, when only one tool matches, leave nothing to guess: that tool is the only one the text can mean. A part
    of a word (``sea``), a word inside a name, or a near spelling could mean a tool the auditor did not, so such a
    name is dropped; dropping costs only the tool rule (the LLM gate still judges the proposal), and the plan records
    the name as written."""
    if name in tools:
        return name
    if not name.strip():
        return None
    wanted = _spelt(name)
    for candidates in (
        [t for t in tools if _spelt(t) == wanted],
        [t for t in tools if _spelt(t).startswith(wanted + "_")],
    ):
        if len(candidates) == 1:
            return candidates[0]
    return None


def _spelt(name: str) -> str:
    """A tool name up to case and word separators (``Search orders``, ``search-orders``: ``search_orders``)."""
    return _SEPARATORS.sub("_", name.strip().casefold())


def _chain_of_thought(trace: StructuredTrace) -> bool:
    return bool(trace.steps) and all(
        s.tool_name is None and s.kind in (StepKind.REASONING, StepKind.FINAL_ANSWER) for s in trace.steps
    )


def _corrected_step(out: BaseModel) -> StepAction | None:
    call = getattr(out, "corrected_call", None)
    if isinstance(call, BaseModel):
        return StepAction(tool_name=str(getattr(call, "tool", "")), arguments=arguments_of(call))
    thought = getattr(out, "corrected_thought", None)
    if not isinstance(thought, str):
        return None
    thought = prompts.without_step_label(thought)  # a text that is no step is refused, with its reason, as a correction
    return StepAction(text=thought) if thought else None


def _scalars(arguments: Mapping[str, object]) -> dict[str, str | int | float | bool]:
    return {k: v for k, v in arguments.items() if isinstance(v, str | int | float | bool)}


_MAX_ARGUMENTS = 20
_PLACEHOLDER = re.compile(r"^<.*>$")
"""A reply that copied the prompt's placeholder (``"<value>"``) instead of a value."""


def _arguments(raw: Mapping[str, str | int | float | bool] | None) -> dict[str, str | int | float | bool] | None:
    """The plan's argument values, bounded (LLM output), without names or values that copy a placeholder."""
    kept = {
        name.strip()[:100]: value[:500] if isinstance(value, str) else value
        for name, value in list((raw or {}).items())[:_MAX_ARGUMENTS]
        if name.strip() and not _PLACEHOLDER.match(name.strip()) and not _PLACEHOLDER.match(str(value).strip())
    }
    return kept or None


_NOTHING = re.compile(r"^(no|none|nothing|n/?a|null)\b")
"""A forbidden "action" that forbids nothing ("No action", "None", "No forbidden actions")."""


def _not_contradicting(forbidden: Sequence[str], instruction: str, expected_tool: str) -> tuple[str, ...]:
    """The forbidden actions without those the plan itself asks for: a bare tool name that is the expected next
    tool or appears in the correction instruction (weak models forbid every tool they know, which would leave
    the replayed agent nothing to do)."""
    asked = instruction.lower()
    kept = []
    for action in (a.strip() for a in forbidden):
        bare = action.lower().rstrip("()")
        if not action or _NOTHING.match(bare) or bare == expected_tool.lower() or (" " not in bare and bare in asked):
            continue
        kept.append(action)
    return tuple(kept)


def null_plan(localization: Localization, classification: Classification | None) -> RepairPlan:
    """The plan without a Diagnostician (ablation, or when diagnosis failed): the localizer's own suggestion."""
    suggestion = classification.suggested_correction if classification else ""
    return RepairPlan(
        root_cause=localization.reasoning,
        correction_instruction=suggestion or localization.suggested_fix,
        confidence=localization.confidence,
    )


def _mentions(text: str, word: str) -> bool:
    return bool(word) and word.lower() in text.lower()


def gate_by_rules(plan: RepairPlan, proposed: Step, replaced: Step | None) -> GateVerdict | None:
    """The cheap checks first: expected next tool, forbidden actions, repeating the original action.
    Returns a verdict when a rule decides it is unfaithful, else None (the LLM gate decides)."""
    if plan.expected_next_tool and proposed.tool_name and proposed.tool_name != plan.expected_next_tool:
        return GateVerdict(
            is_faithful=False,
            violation_type="ignores_instruction",
            violation_reason=f"called {proposed.tool_name}, the plan expected {plan.expected_next_tool}",
            decided_by=GateDecider.RULE,
        )
    differing = _differing_argument(plan, proposed)
    if differing:
        return GateVerdict(
            is_faithful=False,
            violation_type="ignores_instruction",
            violation_reason=differing,
            decided_by=GateDecider.RULE,
        )
    if proposed.tool_name:
        values = [str(v) for v in proposed.tool_args.values() if str(v).strip()]
        for action in plan.forbidden_actions:
            if _mentions(action, proposed.tool_name) and all(_mentions(action, v) for v in values):
                return GateVerdict(
                    is_faithful=False,
                    violation_type="uses_forbidden_action",
                    violation_reason=f"matches the forbidden action: {action}",
                    decided_by=GateDecider.RULE,
                )
    if replaced is not None and StepAction.of_step(proposed).same_as(StepAction.of_step(replaced)):
        return GateVerdict(
            is_faithful=False,
            violation_type="repeats_original_error",
            violation_reason="the regenerated step repeats the original action",
            decided_by=GateDecider.RULE,
        )
    return None


def _differing_argument(plan: RepairPlan, proposed: Step) -> str | None:
    """Why the proposed call is not the plan's call (the expected tool with another value for an argument the plan
    named), else None. Values compare as trimmed, case-folded text: the agent writes ``1`` where the plan wrote
    ``"1"``."""
    if not plan.expected_next_arguments or proposed.tool_name != plan.expected_next_tool:
        return None
    for name, wanted in plan.expected_next_arguments.items():
        if name in proposed.tool_args and _plain(proposed.tool_args[name]) != _plain(wanted):
            return f"{name}={proposed.tool_args[name]!r}, the plan gave {name}={wanted!r}"
    return None


def _plain(value: object) -> str:
    return str(value).strip().casefold()


def gate_with_llm(
    llm: StructuredLLM, ctx: prompts.PromptContext, trace: StructuredTrace, plan: RepairPlan, proposed: Step
) -> GateVerdict:
    out = llm.complete(prompts.gate(ctx, trace.steps, plan, proposed), prompts.GateOutput, stage=Stage.GATE).value
    return GateVerdict(
        is_faithful=out.is_faithful,
        violation_type=None if out.is_faithful else out.violation_type,
        violation_reason=None if out.is_faithful else out.violation_reason,
        decided_by=GateDecider.LLM,
    )
