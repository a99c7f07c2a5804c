"""The replay contract. Implementations live in ``replay_adapters/`` (LangGraph, OpenAI tool loop, chain of
thought, remote HTTP); a conformance suite in ``reflect_otel.testing.conformance`` checks each one."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from reflect_otel.llm.base import StructuredLLM

from reflect_otel import plugins
from reflect_otel.config import InjectionRole
from reflect_otel.errors import ReplayError
from reflect_otel.record import Correction
from reflect_otel.trace import Step, StepAction, StructuredTrace

__all__ = [
    "SAMPLING_TEMPERATURE",
    "BudgetedReplay",
    "HasCorrectionRules",
    "InjectionRole",
    "MakesVariants",
    "NormalisesResults",
    "PreviewsSteps",
    "ProposedStep",
    "ProposesSteps",
    "ReplayAdapter",
    "ReplayRequest",
    "ReplayResult",
    "Rule",
    "SamplesRuns",
    "TakesTaskContext",
    "agent_rules",
    "check_rollback_point",
    "find_replay_adapter",
    "is_deterministic",
    "previewer",
    "proposer",
    "replay_with",
    "resampler",
    "result_normaliser",
    "variant_maker",
]


Rule = Callable[[StructuredTrace, Step, str], list[Correction]]
"""A correction rule: ``(trace, step, context) -> corrections of that step``, ``context`` being what the agent was
given besides its question (``observe(context=...)``); each correction's source is ``evidence:<rule name>``."""


class ReplayResult(BaseModel):
    """A replayed run: original steps ``1..rollback_point`` exactly, then the new continuation, renumbered."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trace: StructuredTrace
    rollback_point: int = Field(ge=0)
    final_answer: str | None
    prefix_verified: bool = Field(
        description="True when the first new model call received exactly the original prefix plus the injection."
    )
    adapter_info: dict[str, str] = Field(default_factory=dict, description="Thread or checkpoint ids, and so on.")

    @property
    def continuation(self) -> tuple[Step, ...]:
        """The regenerated steps (after the rollback point)."""
        return self.trace.steps[self.rollback_point :]


class ReplayRequest(BaseModel):
    """One run asked of a replay adapter: keep ``trace``'s steps ``1..rollback_point`` (0 keeps none), put
    ``injection`` (when not empty) into the agent's context as a message of ``injection_role``, execute ``action``
    (when given) as step ``rollback_point + 1``, and let the agent continue, its model calls sampled at
    ``temperature`` (None: as the agent samples them itself; a proposal then asks at 0).

    Built by its named constructors for the common cases: :meth:`intervention` (a correction at a point),
    :meth:`control` (the same point with nothing changed) and :meth:`resampling` (the run again from its start, at a
    temperature)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trace: StructuredTrace
    rollback_point: int = Field(default=0, ge=0)
    injection: str = ""
    injection_role: InjectionRole = InjectionRole.SYSTEM
    action: StepAction | None = None
    temperature: float | None = Field(default=None, ge=0.0)

    @classmethod
    def intervention(
        cls,
        trace: StructuredTrace,
        rollback_point: int,
        injection: str = "",
        *,
        role: InjectionRole = InjectionRole.SYSTEM,
        action: StepAction | None = None,
    ) -> ReplayRequest:
        """A correction at ``rollback_point``: guidance (``injection``), an action, or both."""
        return cls(trace=trace, rollback_point=rollback_point, injection=injection, injection_role=role, action=action)

    @classmethod
    def control(cls, trace: StructuredTrace, rollback_point: int) -> ReplayRequest:
        """The agent continued from ``rollback_point`` with nothing changed: what an intervention is compared with."""
        return cls(trace=trace, rollback_point=rollback_point)

    @classmethod
    def resampling(cls, trace: StructuredTrace, temperature: float) -> ReplayRequest:
        """The run again from its start (no step kept, nothing changed), its model calls sampled at
        ``temperature``."""
        return cls(trace=trace, temperature=temperature)

    @property
    def proposal_temperature(self) -> float:
        """The temperature a proposal samples at: ``temperature``, or 0 when none is given."""
        return 0.0 if self.temperature is None else self.temperature


class ReplayAdapter(Protocol):
    """Re-runs an agent from a preserved prefix with a correction injected.

    ``replay(request)`` (a :class:`ReplayRequest`) keeps the original steps ``1..p`` exactly (``p`` its
    ``rollback_point``; ``p = 0`` keeps none), puts its ``injection`` into the agent's context as a message of its
    ``injection_role`` (a *guidance* intervention, the paper's), and lets the agent continue with the same tools and
    model, its model calls at the request's ``temperature`` when one is given. Tools of the prefix are never executed
    again.

    A request with an ``action`` is an *action* intervention: after the kept steps (and the injection, when not
    empty) the adapter executes the action as step ``p + 1`` itself, for real in the replayed run (a call of one of
    the agent's tools through the agent's own tool executor, or for a chain of thought a replacement thought), never
    answered from the trace, records it as the first regenerated step, and lets the agent continue from its result.
    An irreversible tool is refused as in any continuation. ``prefix_verified`` then means the first new model call
    received the prefix, the injection, the action and its result.

    Raises :class:`~reflect_otel.errors.ReplayError` when ``p`` is out of range, falls inside one LLM turn with
    parallel tool calls (keeping only some results would leave calls unanswered), the action is of a kind the
    adapter cannot execute, or the agent fails. May be called from a worker thread; calls for different traces may
    run concurrently.

    An adapter whose continuations are greedy (the agent's model at temperature 0, as the adapter runs it) says so
    with a ``deterministic = True`` attribute: then one replay per arm decides a controlled test, and the control
    replay of a rollback point is run once and reused (:func:`is_deterministic`; absent means False). One whose
    answer depends on the run (a tool loop on the embedded server is greedy when the run asked its model at
    temperature 0) also has ``deterministic_for(trace) -> bool``, which then decides for that run.

    Adapters written for the keyword form (``replay(trace, *, rollback_point, injection, injection_role=...,
    action=...)``, and likewise ``propose(trace, *, rollback_point, injection, injection_role, samples,
    temperature)`` and ``resample(trace, *, samples, temperature)``) keep working: the core calls every adapter
    through :func:`replay_with`, :func:`proposer` and :func:`resampler`, which recognise a method whose first
    parameter is not ``request`` and that takes ``rollback_point``, ``temperature`` or ``**kwargs``, and call it the
    old way (an action is passed only when there is one; a replay at a temperature is refused, that form having
    none). New adapters take the request; the keyword form may be dropped in a later release.
    """

    def replay(self, request: ReplayRequest) -> ReplayResult: ...


SAMPLING_TEMPERATURE = "reflect_temperature"
"""The key under which an adapter that runs a LangChain/LangGraph agent passes a proposal's sampling temperature in
the run's ``config["configurable"]``. A chat model made configurable on it samples proposals at that temperature
(``model.configurable_fields(temperature=ConfigurableField(id="reflect_temperature"))``); one that is not decides
as it always does."""


class ProposedStep(BaseModel):
    """What the agent would do next, as its model decided it, not executed: a tool call or a thought
    (``action``), or its final answer (``is_final_answer``, the answer in ``action.text``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: StepAction
    is_final_answer: bool = False
    note: str = Field(
        default="",
        max_length=1000,
        description="What the adapter left out of, or changed in, the agent's recorded request to ask for it "
        "(recorded with the correction).",
    )


@runtime_checkable
class ProposesSteps(Protocol):
    """A replay adapter that can also ask the agent what it would do at a rollback point, without doing it.

    ``propose(request, samples=n)`` puts the agent where ``replay(request)`` would (steps ``1..p`` kept, the
    injection in its context; the request's action is not used) and returns the next decision of its model ``n``
    times, each sampled at the request's :attr:`~ReplayRequest.proposal_temperature` (the adapter passes it to the
    agent's model; an agent whose model cannot take it decides as it always does). Nothing is executed and no tool
    runs. Proposals are candidate corrections: each is then executed as an action by ``replay``, where the
    continuation is the agent's own. Raises :class:`~reflect_otel.errors.ReplayError` as ``replay`` does."""

    def propose(self, request: ReplayRequest, *, samples: int = 1) -> tuple[ProposedStep, ...]: ...


@runtime_checkable
class SamplesRuns(Protocol):
    """A replay adapter that can also run the agent again on the run's own input, its every decision sampled.

    ``resample(ReplayRequest.resampling(trace, t), samples=n)`` re-runs the agent from the start (no step kept, no
    injection) ``n`` times, each run's model calls sampled at temperature ``t`` (passed as
    :data:`SAMPLING_TEMPERATURE` to LangChain agents), and returns each run as a :class:`ReplayResult` with
    ``rollback_point`` 0. Self-consistency checks use it (asking for one run at a time, so that a failed run costs
    only itself): an answer the agent's own resamples do not reproduce is suspect. Irreversible tools stop a resample
    as they stop a replay. Raises :class:`~reflect_otel.errors.ReplayError` as ``replay`` does."""

    def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]: ...


def resampler(adapter: ReplayAdapter) -> SamplesRuns | None:
    """``adapter`` as a :class:`SamplesRuns`, or None. A :class:`BudgetedReplay` resamples within its budget (each
    resampled run is a replay of the failure, counted as one); an adapter of the keyword form is called that way."""
    inner = adapter.inner if isinstance(adapter, BudgetedReplay) else adapter
    if getattr(inner, "resamples", True) is False:  # an adapter whose agent may not serve resamples says so
        return None
    if not isinstance(inner, SamplesRuns):
        return None
    if isinstance(adapter, BudgetedReplay):
        return adapter
    return _KeywordForm(inner) if _keyword_form(inner.resample) else inner


def is_deterministic(adapter: ReplayAdapter, trace: StructuredTrace | None = None) -> bool:
    """Whether ``adapter`` runs continuations greedily (see :class:`ReplayAdapter`): of ``trace``, when given and the
    adapter (or a :class:`BudgetedReplay`'s) can say it of one run (``deterministic_for``)."""
    inner = adapter.inner if isinstance(adapter, BudgetedReplay) else adapter
    of_run = getattr(inner, "deterministic_for", None)
    if trace is not None and callable(of_run):
        return of_run(trace) is True
    return getattr(adapter, "deterministic", False) is True


def proposer(adapter: ReplayAdapter) -> ProposesSteps | None:
    """``adapter`` as a :class:`ProposesSteps`, looking through a :class:`BudgetedReplay` (proposals execute
    nothing, so they are not replays to budget); None when it cannot propose. An adapter of the keyword form is
    called that way."""
    inner = adapter.inner if isinstance(adapter, BudgetedReplay) else adapter
    if getattr(inner, "proposes", True) is False:  # an adapter whose agent may not serve proposals says so
        return None
    if not isinstance(inner, ProposesSteps):
        return None
    return _KeywordForm(inner) if _keyword_form(inner.propose) else inner


@runtime_checkable
class TakesTaskContext(Protocol):
    """An adapter that writes the agent's prompt itself from the trace (a chain of thought), rather than resending
    a recorded request: a trace holds the question, not the task the agent was set (BIG-Bench Mistake's
    "complete the brackets"), so without it the replayed agent answers another task. ``with_task_context(text)``
    returns the adapter that also tells its agent ``text``; the service gives a found adapter the run's domain
    context this way."""

    def with_task_context(self, text: str) -> ReplayAdapter: ...


@runtime_checkable
class HasCorrectionRules(Protocol):
    """An adapter for an agent with evidence rules of its own: rules that read that agent's tools and their text
    (:data:`Rule`), too specific for the built-in ones. ``correction_rules`` run beside the
    built-in rules for the runs this adapter replays, and for no other run; one that raises is logged and skipped.
    The table-QA demo's wiring gives its LangGraph adapter the table rule this way."""

    correction_rules: Sequence[Rule]


def agent_rules(adapter: ReplayAdapter | None) -> tuple[Rule, ...]:
    """The correction rules ``adapter``'s agent brings (:class:`HasCorrectionRules`), looking through a
    :class:`BudgetedReplay`; () for an adapter that brings none."""
    inner = adapter.inner if isinstance(adapter, BudgetedReplay) else adapter
    if not isinstance(inner, HasCorrectionRules):
        return ()
    rules = inner.correction_rules
    if not isinstance(rules, list | tuple):
        return ()
    return tuple(rule for rule in rules if callable(rule))


@runtime_checkable
class HasPureTools(Protocol):
    """An adapter whose agent has tools that answer the same call with the same data and change nothing the agent
    can see (reads of fixed data: the table demo's operations). A correction that repeats a call of one of them the
    run's prefix already made, and got a result from, gives the agent nothing new, only another turn, so it is
    refused (:func:`reflect_otel.attribution.corrections.refusal`). A tool not named may have state or changing results (tests
    run after an edit, a search, a page scrolled), where repeating a call is a real correction: never refused."""

    pure_tools: Collection[str]


def pure_tools(adapter: ReplayAdapter | None) -> frozenset[str]:
    """The tools ``adapter`` declares pure (:class:`HasPureTools`), looking through a :class:`BudgetedReplay`; empty
    for an adapter that declares none."""
    inner = adapter.inner if isinstance(adapter, BudgetedReplay) else adapter
    if not isinstance(inner, HasPureTools) or not isinstance(inner.pure_tools, list | tuple | set | frozenset):
        return frozenset()
    return frozenset(name for name in inner.pure_tools if isinstance(name, str))


@runtime_checkable
class NormalisesResults(Protocol):
    """An adapter whose agent's tools say what in their results carries no meaning (row order for a set, a time
    stamp): ``normalise_result(tool_name, result)`` returns the result as compared when deciding whether a replayed
    call changed what the original call produced (:mod:`reflect_otel.attribution.effects`). Without it, JSON key order and
    whitespace are all that is set aside."""

    def normalise_result(self, tool_name: str, result: str) -> str: ...


def result_normaliser(adapter: ReplayAdapter | None) -> Callable[[str, str], str] | None:
    """``adapter``'s :class:`NormalisesResults` method, looking through a :class:`BudgetedReplay`; None without."""
    inner = adapter.inner if isinstance(adapter, BudgetedReplay) else adapter
    return inner.normalise_result if isinstance(inner, NormalisesResults) else None


@runtime_checkable
class PreviewsSteps(Protocol):
    """An adapter that can say what a call would return at a rollback point without running the agent on:
    ``preview(trace, rollback_point=p, action=a)`` brings the agent's state to after step ``p`` and runs ``a``'s
    tool alone, returning its result as the agent would read it; None when it cannot tell (the tool is not one its
    agent declared pure, :class:`HasPureTools`, or it failed). It changes nothing the agent can see and costs no
    model call, so a replacement whose effect equals the original step's (:mod:`reflect_otel.attribution.effects`) is refused
    before a replay is spent on it. Raises nothing."""

    def preview(self, trace: StructuredTrace, *, rollback_point: int, action: StepAction) -> str | None: ...


def previewer(adapter: ReplayAdapter | None) -> PreviewsSteps | None:
    """``adapter`` as a :class:`PreviewsSteps` (looking through a :class:`BudgetedReplay`: a preview is no replay),
    or None."""
    inner = adapter.inner if isinstance(adapter, BudgetedReplay) else adapter
    return inner if isinstance(inner, PreviewsSteps) else None


@runtime_checkable
class MakesVariants(Protocol):
    """An adapter that knows a text-only variant of its agent's steps better than the generic one
    (:func:`reflect_otel.attribution.effects.sensitivity_variant`): ``sensitivity_variant(step)`` returns the step changed in
    text but not in effect (an equivalent spelling its tool resolves identically) with a few words saying how, or
    ``(None, why)`` where it has none."""

    def sensitivity_variant(self, step: Step) -> tuple[StepAction | None, str]: ...


def variant_maker(adapter: ReplayAdapter | None) -> Callable[[Step], tuple[StepAction | None, str]] | None:
    """``adapter``'s :class:`MakesVariants` method, looking through a :class:`BudgetedReplay`; None without."""
    inner = adapter.inner if isinstance(adapter, BudgetedReplay) else adapter
    return inner.sensitivity_variant if isinstance(inner, MakesVariants) else None


class BudgetedReplay:
    """A :class:`ReplayAdapter` that lets at most ``max_replays`` replays through to ``inner``; past that each
    raises :class:`ReplayError` (recorded by the method like any failed replay, never run). Gives every method
    compared the same replay budget per failure: one that needs fewer may stop early, none gets more."""

    def __init__(self, inner: ReplayAdapter, max_replays: int) -> None:
        if max_replays < 1:
            raise ValueError("max_replays must be at least 1")
        self.inner = inner
        self.max_replays = max_replays
        self.used = 0
        self.deterministic = is_deterministic(inner)
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        """Replays still allowed: a method plans with it (a controlled test needs its control too)."""
        with self._lock:
            return self.max_replays - self.used

    def replay(self, request: ReplayRequest) -> ReplayResult:
        with self._lock:
            if self.used >= self.max_replays:
                raise ReplayError(f"the replay budget of this failure ({self.max_replays}) is spent")
            self.used += 1
        return replay_with(self.inner, request)

    def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
        """``inner``'s resamples, each counted against the budget (refused whole when fewer remain)."""
        source = resampler(self.inner)
        if source is None:
            raise ReplayError("this agent's replay adapter cannot resample runs")
        with self._lock:
            if self.used + samples > self.max_replays:
                raise ReplayError(
                    f"the replay budget of this failure ({self.max_replays}) leaves {self.max_replays - self.used}, "
                    f"fewer than the {samples} resamples asked"
                )
            self.used += samples
        return source.resample(request, samples=samples)


def replay_with(adapter: ReplayAdapter, request: ReplayRequest) -> ReplayResult:
    """``adapter.replay(request)``; an adapter of the keyword form (see :class:`ReplayAdapter`) is called that way,
    with ``action`` only when there is one, so that adapters written before actions existed keep working for
    guidance."""
    if _keyword_form(adapter.replay):
        return _KeywordForm(adapter).replay(request)
    return adapter.replay(request)


def _keyword_form(method: Callable[..., Any]) -> bool:
    """Whether ``method`` is an adapter method of the keyword form: its first parameter is not ``request`` and it
    takes ``rollback_point`` or ``temperature`` by name, or any keyword (``**kwargs``)."""
    try:
        parameters = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):  # a builtin or a C callable: taken as the request form
        return False
    names = {p.name for p in parameters}
    first = parameters[0].name if parameters else ""
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in parameters)
    return first != "request" and (any_keyword or bool(names & {"rollback_point", "temperature"}))


class _KeywordForm:
    """An adapter of the keyword form (``replay(trace, *, rollback_point, injection, ...)``), called with a
    :class:`ReplayRequest`: the one place the old calling convention is spoken."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def replay(self, request: ReplayRequest) -> ReplayResult:
        extra: dict[str, Any] = {} if request.action is None else {"action": request.action}
        if request.temperature is not None:  # the keyword form samples only whole runs (``resample``)
            raise ReplayError(f"{type(self.inner).__name__} takes the keyword form, which replays at no temperature")
        result: ReplayResult = self.inner.replay(
            request.trace,
            rollback_point=request.rollback_point,
            injection=request.injection,
            injection_role=request.injection_role,
            **extra,
        )
        return result

    def propose(self, request: ReplayRequest, *, samples: int = 1) -> tuple[ProposedStep, ...]:
        return tuple(
            self.inner.propose(
                request.trace,
                rollback_point=request.rollback_point,
                injection=request.injection,
                injection_role=request.injection_role,
                samples=samples,
                temperature=request.proposal_temperature,
            )
        )

    def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
        return tuple(self.inner.resample(request.trace, samples=samples, temperature=request.proposal_temperature))


def check_rollback_point(trace: StructuredTrace, rollback_point: int) -> None:
    """Raise :class:`ReplayError` unless ``rollback_point`` is in ``0..len(steps)-1`` and does not split one LLM
    turn's parallel tool calls. Adapters call this first."""
    steps = trace.steps
    if not 0 <= rollback_point < len(steps):
        raise ReplayError(
            f"rollback point {rollback_point} is outside 0..{len(steps) - 1} for a {len(steps)}-step trace"
        )
    before, after = (steps[rollback_point - 1], steps[rollback_point]) if rollback_point > 0 else (None, None)
    if (
        before is not None
        and after is not None
        and before.span_id == after.span_id
        and before.tool_call_id is not None
        and after.tool_call_id is not None
    ):
        raise ReplayError(
            f"rollback point {rollback_point} falls inside one LLM turn with parallel tool calls (steps "
            f"{rollback_point} and {rollback_point + 1} were decided together); roll back to the turn's first step - 1 "
            "or to its last step"
        )


def find_replay_adapter(trace: StructuredTrace, llm: StructuredLLM) -> ReplayAdapter | None:
    """The first installed replay adapter (entry-point group ``reflect_otel.replay_adapters``, by name) whose
    factory claims ``trace``; None when none does, and the attribution is localization-only."""
    for _, factory in plugins.loaded(plugins.REPLAY_ADAPTERS):
        adapter: ReplayAdapter | None = factory(trace, llm)
        if adapter is not None:
            return adapter
    return None
