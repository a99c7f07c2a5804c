"""Every attribution method in one registry: REFLECT, its proxy-regime variant, and the baselines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Unpack

from reflect_otel.attribution._run import AttributeOptions
from reflect_otel.attribution.baselines import BASELINES
from reflect_otel.attribution.controls import PlaceboControl, PlanPool, WrongStepControl
from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.config import LLMConfig, ReflectConfig
from reflect_otel.errors import ConfigError
from reflect_otel.flagging.combined import proxy_regime_verifier
from reflect_otel.flagging.verifiers import Verifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.llm.factory import NoModel, make_llm
from reflect_otel.record import AttributionRecord
from reflect_otel.trace import StructuredTrace

__all__ = ["ATTRIBUTE_METHODS", "METHODS", "Attributor", "MethodSpec", "llm_for", "method_spec"]


class Attributor(Protocol):
    """Finds the decisive error step of one trace.

    ``attribute`` returns an :class:`AttributionRecord` (status verified, unverified or skipped, with every LLM call
    and replay it made) and never raises: a failed stage is recorded in ``record.errors``. What it may be told
    besides the trace is :class:`~reflect_otel.attribution._run.AttributeOptions`. Not thread-safe: one attribution
    at a time per object.
    """

    method: str

    def attribute(self, trace: StructuredTrace, **options: Unpack[AttributeOptions]) -> AttributionRecord: ...


class BuildMethod(Protocol):
    """``build(llm, verifier, config, plans=None)``: the method's attributor. ``plans`` holds the plans the same
    auditor wrote for other failures (the placebo control draws from it; other methods ignore it)."""

    def __call__(
        self, llm: StructuredLLM, verifier: Verifier, config: ReflectConfig, plans: PlanPool | None = None, /
    ) -> Attributor: ...


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """A method by name: how to build it, and what it needs."""

    name: str
    build: BuildMethod
    needs_llm: bool = True
    """False for the position floors: no endpoint is needed and no local server is started."""
    withholds_expected: bool = False
    """The proxy regime: the expected answer is never used; the plan-anchored verifier judges the replays."""


def _reflect_proxy(
    llm: StructuredLLM, verifier: Verifier, config: ReflectConfig, plans: PlanPool | None = None
) -> Attributor:
    withheld = config.model_copy(update={"include_expected_answer": False})
    return ReflectPipeline(llm, verifier=proxy_regime_verifier(llm), config=withheld)


def _reflect_guidance(
    llm: StructuredLLM, verifier: Verifier, config: ReflectConfig, plans: PlanPool | None = None
) -> Attributor:
    """The paper's REFLECT as written: its plan injected as guidance, no concrete corrections (what they add)."""
    pipeline = ReflectPipeline(llm, verifier=verifier, config=config.model_copy(update={"actions": False}))
    pipeline.method = "reflect-guidance"
    return pipeline


def _baseline(name: str) -> BuildMethod:
    def build(
        llm: StructuredLLM, verifier: Verifier, config: ReflectConfig, plans: PlanPool | None = None
    ) -> Attributor:
        return BASELINES[name](llm, verifier=verifier, config=config)

    return build


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec(
            "reflect", lambda llm, verifier, config, plans=None: ReflectPipeline(llm, verifier=verifier, config=config)
        ),
        MethodSpec("reflect-proxy", _reflect_proxy, withholds_expected=True),
        MethodSpec("reflect-guidance", _reflect_guidance),
        MethodSpec(
            "control-placebo",
            lambda llm, verifier, config, plans=None: PlaceboControl(
                llm, verifier=verifier, config=config, plans=plans
            ),
        ),
        MethodSpec(
            "control-wrong-step",
            lambda llm, verifier, config, plans=None: WrongStepControl(llm, verifier=verifier, config=config),
        ),
        *(
            MethodSpec(name, _baseline(name), needs_llm=cls.needs_llm, withholds_expected=False)
            for name, cls in BASELINES.items()
        ),
    )
}
ATTRIBUTE_METHODS = tuple(name for name, spec in METHODS.items() if not spec.withholds_expected)
"""The methods a user picks to attribute runs (``reflect-proxy`` is an evaluation of REFLECT without answers)."""


def method_spec(name: str) -> MethodSpec:
    """The method called ``name``; :class:`ConfigError` naming the choices otherwise."""
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[name]


def llm_for(spec: MethodSpec, config: LLMConfig | None = None) -> StructuredLLM:
    """The configured model, or :class:`NoModel` for a method that needs none (no local server is started)."""
    return make_llm(config) if spec.needs_llm else NoModel()
