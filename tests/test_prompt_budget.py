"""A run longer than the model's context is shortened to fit it, the same way for every stage, and only then."""

from __future__ import annotations

import re

from reflect_otel import prompts
from reflect_otel.attribution.pipeline import ReflectPipeline
from reflect_otel.config import LLMConfig, ReflectConfig
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.llm.base import PromptBudget, estimated_tokens, prompt_budget
from reflect_otel.llm.recording import CallLog, RecordingLLM
from reflect_otel.prompts import PromptContext, fit_steps, format_steps
from reflect_otel.testing import ScriptedLLM, make_trace

STEPS_BLOCK = re.compile(r"<<<BEGIN STEPS>>>\n.*?\n<<<END STEPS>>>", re.DOTALL)
REPLY = {
    "localize": [{"error_step": 60, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": "w"}],
    "classify": [{"error_type": "tool_error", "confidence": 0.5, "explanation": "e", "suggested_correction": "s"}],
}


class ContextLLM(ScriptedLLM):
    """A scripted model that says its context, as a configured endpoint does."""

    def __init__(self, context: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.config = LLMConfig(model="scripted", context_tokens=context, max_output_tokens=512)


def _long_trace(steps: int = 120):  # type: ignore[no-untyped-def]
    return make_trace(
        "Which city is larger?",
        [
            {"tool": "search", "args": {"q": f"city {i}"}, "result": f"row {i}: " + "population data " * 30}
            for i in range(1, steps)
        ]
        + [{"reasoning": "Rome is larger", "is_final_answer": True}],
        final_answer="Rome",
    )


def _requests(llm: ScriptedLLM, trace) -> list:  # type: ignore[no-untyped-def, type-arg]
    ReflectPipeline(llm, verifier=OracleVerifier(), config=ReflectConfig()).attribute(trace, expected="Paris")
    return llm.requests


def test_a_run_that_fits_is_shown_whole() -> None:
    trace = _long_trace(6)
    bounded = _requests(ContextLLM(8192, by_stage=REPLY), trace)
    unbounded = _requests(ScriptedLLM(by_stage=REPLY), trace)
    assert [r.text for r in bounded] == [r.text for r in unbounded]
    assert "left out" not in bounded[0].text and "truncated" not in bounded[0].text


def test_a_run_longer_than_the_context_fits_it_and_every_stage_shows_the_same_steps() -> None:
    trace = _long_trace(120)
    whole = format_steps(trace.steps, 500)
    assert estimated_tokens(whole) > 4096  # would not fit
    requests = _requests(ContextLLM(4096, by_stage=REPLY), trace)
    assert [r.stage for r in requests][:2] == ["localize", "classify"]
    for request in requests:
        assert estimated_tokens(request.text) <= 4096 - 512  # room left for the reply
    shown = {STEPS_BLOCK.search(r.text).group(0) for r in requests}  # type: ignore[union-attr]
    assert len(shown) == 1  # one rendering: the stages' shared prefix holds
    (steps_block,) = shown
    assert (
        "Step 1 (tool_call)" in steps_block and "Step 120 (" in steps_block
    )  # start and end kept, numbers as recorded
    assert re.search(
        r"\[steps \d+-\d+ left out: the run is longer than the model's context; 120 steps in all\]", steps_block
    )


def test_fields_are_cut_before_any_step_is_left_out() -> None:
    trace = _long_trace(20)
    whole = format_steps(trace.steps, 500)
    room = len(whole) // 2

    def fits(text: str) -> bool:
        return len(text) <= room

    fitted = fit_steps(trace.steps, 500, fits)
    assert fits(fitted) and "left out" not in fitted
    assert all(f"Step {i} (" in fitted for i in range(1, 21))
    assert "truncated" in fitted
    (chosen,) = [cut for cut in range(40, 501) if format_steps(trace.steps, cut) == fitted]
    assert not fits(format_steps(trace.steps, chosen + 1))  # the largest cut that fits


def test_the_most_steps_that_fit_are_kept_from_both_ends() -> None:
    trace = _long_trace(50)

    def fits(text: str) -> bool:
        return len(text) <= 2000

    fitted = fit_steps(trace.steps, 500, fits)
    assert fits(fitted)
    kept = [int(n) for n in re.findall(r"^Step (\d+) \(", fitted, re.MULTILINE)]
    assert kept[0] == 1 and kept[-1] == 50
    first, last = map(int, re.search(r"\[steps (\d+)-(\d+) left out", fitted).groups())  # type: ignore[union-attr]
    assert kept == [*range(1, first), *range(last + 1, 51)]
    one_more = fit_steps(trace.steps, 500, lambda text: len(text) <= 2000 + 10_000)
    assert len(re.findall(r"^Step \d+ \(", one_more, re.MULTILINE)) > len(kept)


def test_the_budget_is_the_context_less_the_reply_counted_by_the_backend_through_wrappers() -> None:
    inner = ContextLLM(8192)
    inner.count_tokens = lambda text: len(text.split())  # type: ignore[attr-defined]
    budget = prompt_budget(RecordingLLM(inner, CallLog()))
    assert budget is not None and budget.tokens == 8192 - 512
    assert budget.count("three short words") == 3
    assert prompt_budget(ScriptedLLM()) is None  # a backend that does not say its context is not bounded
    estimated = prompt_budget(ContextLLM(4096))
    assert estimated == PromptBudget(4096 - 512) and estimated.count("x" * 30) == 10


def test_the_context_comes_from_the_environment() -> None:
    assert LLMConfig.from_env({"REFLECT_LLM_CONTEXT": "32768"}).context_tokens == 32768
    assert LLMConfig.from_env({}).context_tokens is None


def test_the_self_verifying_judge_fits_the_run_too() -> None:
    trace = _long_trace(120)
    ctx = PromptContext.of(trace, None, include_expected=False, budget=PromptBudget(4096 - 512))
    text = "\n".join(m.content for m in prompts.self_verify(ctx, trace.steps))
    assert estimated_tokens(text) <= 4096 - 512
    assert "left out" in text and "Agent answer:" in text
