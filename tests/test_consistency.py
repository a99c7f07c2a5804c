"""The consistency check and the combined verdict: the agent's own resamples as the reference-free signal, the
rule's order (evidence, consistency, audit), costs counted, and confidence only where measured."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.attribution._run import AttributionRun
from reflect_otel.attribution.methods import METHODS
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import ReflectConfig
from reflect_otel.errors import ReplayError
from reflect_otel.flagging.calibration import ConfidenceCalibration
from reflect_otel.flagging.combined import CombinedVerifier, flagging_verifier
from reflect_otel.flagging.consistency import (
    ConsistencyVerifier,
    drawn_for_sampling,
    first_divergence,
    majority_answer,
    sequential_stop,
)
from reflect_otel.flagging.flag_score import ScoreMap
from reflect_otel.flagging.proxy_verifier import PlanAnchoredVerifier, ProxyVerifierConfig
from reflect_otel.flagging.verifiers import OracleVerifier, bound_to_runs
from reflect_otel.llm.budget import TokenBudget
from reflect_otel.replay import BudgetedReplay, ReplayRequest, ReplayResult, resampler
from reflect_otel.testing import ScriptedLLM, ScriptedResampler, make_step, make_trace
from reflect_otel.testing.examples import five_step_trace, scripted_agent, scripted_auditor
from reflect_otel.trace import StructuredTrace

QUESTION = "Where was the first-place finish?"
WRONG_FILTER = {"tool": "filter_rows", "args": {"column": "Position", "value": "1"}, "result": "0 rows"}
RIGHT_FILTER = {"tool": "filter_rows", "args": {"column": "Position", "value": "1st"}, "result": "1 row: Bangkok"}


def _run(answer: str, first: Mapping[str, Any] = WRONG_FILTER, trace_id: str = "0" * 31 + "1") -> StructuredTrace:
    steps = [first, {"tool": "final_answer", "args": {"answer": answer}, "is_final_answer": True}]
    return make_trace(QUESTION, steps, final_answer=answer, trace_id=trace_id)


@pytest.fixture(autouse=True)
def _no_calibration_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own REFLECT_PROXY_CALIBRATION must not colour these verdicts."""
    monkeypatch.delenv("REFLECT_PROXY_CALIBRATION", raising=False)


def _answering(*answers: str, tokens: int = 0) -> ScriptedResampler:
    """Resamples that answer ``answers[i]`` in turn: after the right filter when the answer is Bangkok's."""

    def resample(_trace: StructuredTrace, sample: int, _t: float) -> Sequence[Mapping[str, Any]]:
        answer = answers[sample % len(answers)]
        first = dict(RIGHT_FILTER if "Bangkok" in answer else WRONG_FILTER, prompt_tokens=tokens)
        return [first, {"tool": "final_answer", "args": {"answer": answer}}]

    return ScriptedResampler(resample)


def test_the_sample_rate_draws_runs_by_id_the_same_way_every_time() -> None:
    ids = [f"{i:032x}" for i in range(4000)]
    drawn = [drawn_for_sampling(i, 0.25) for i in ids]
    assert 0.22 < sum(drawn) / len(ids) < 0.28
    assert drawn == [drawn_for_sampling(i, 0.25) for i in ids]  # another collector, a retry: the same runs
    assert all(drawn_for_sampling(i, 1.0) for i in ids[:50]) and not any(drawn_for_sampling(i, 0.0) for i in ids[:50])


def test_the_first_step_a_resample_decided_otherwise() -> None:
    original = _run("none")
    assert first_divergence(original, _run("none")) is None
    assert first_divergence(original, _run("Bangkok, Thailand", RIGHT_FILTER)) == 1
    assert first_divergence(original, _run("Bangkok")) == 2  # the same filter, another answer
    shorter = original.model_copy(update={"steps": original.steps[:1]})
    assert first_divergence(original, shorter) == 2


def test_an_answer_the_resamples_do_not_reproduce_is_flagged_and_the_resamples_are_kept() -> None:
    runs = _answering("Bangkok, Thailand", "Bangkok, Thailand", "none")
    verdict = ConsistencyVerifier(runs, samples=3, temperature=0.7).verify(_run("none"), expected=None)
    assert verdict.is_correct is False and verdict.label == "HIGH_ERROR_SIGNAL"
    assert runs.resampled == [0.7, 0.7, 0.7]
    check = verdict.consistency
    assert check is not None and (check.agreeing, check.finished) == (1, 3)
    assert [r.diverged_at for r in check.runs] == [1, 1, None] and check.first_divergence == 1
    assert "1 of 3 resamples reproduced the answer 'none'" in verdict.reasoning
    assert "'Bangkok, Thailand'" in verdict.reasoning and "first diverging at step 1" in verdict.reasoning
    assert verdict.confidence is None  # never measured: no number
    assert majority_answer(check) == "Bangkok, Thailand"


def test_answers_are_compared_under_the_judges_normalisation() -> None:
    """'16.0' is '16', and 'paris' is 'Paris.': a resample that writes the same answer otherwise agrees."""
    numbers = ConsistencyVerifier(_answering("16.0", "16", " 16 "), samples=3).verify(_run("16"), expected=None)
    assert numbers.is_correct is True and numbers.consistency is not None and numbers.consistency.agreeing == 3
    words = ConsistencyVerifier(_answering("paris", "Paris.", "Lyon"), samples=3).verify(_run("Paris"), expected=None)
    assert words.is_correct is True and "consistency_partial" in words.reasoning  # 2 of 3: not flagged alone


def test_answers_equal_in_substance_vote_together() -> None:
    """'22 laps' asserts 22: resamples answering '22' reproduce it, and vote for one consensus with it."""
    question = "how many laps were required?"
    run = make_trace(question, [{"reasoning": "22 laps", "is_final_answer": True}], final_answer="22 laps")
    runs = ScriptedResampler(lambda _t, sample, _temp: [{"reasoning": ("22", "22 laps", "22")[sample % 3]}])
    verdict = ConsistencyVerifier(runs, samples=3).verify(run, expected=None)
    assert verdict.consistency is not None and verdict.consistency.agreeing == 3
    assert (verdict.basis, verdict.is_correct, verdict.score) == ("consistency_agree", True, 0.0)
    other = ScriptedResampler(lambda _t, sample, _temp: [{"reasoning": ("23", "23 laps", "22")[sample % 3]}])
    split = ConsistencyVerifier(other, samples=3).verify(run, expected=None)
    assert split.consistency is not None and majority_answer(split.consistency, question=question) == "23"


def test_an_answer_that_is_no_value_votes_for_nothing() -> None:
    """The agent's advice about its own error, given alike by every resample, is no consensus to judge replays by
    (each still counts among the finished resamples)."""
    advice = "To fix the error, you need to quote the column.\n```sql\nSELECT 1\n```"
    runs = ScriptedResampler(lambda _t, _s, _temp: [{"reasoning": advice}])
    verdict = ConsistencyVerifier(runs, samples=3).verify(_run("none"), expected=None)
    assert verdict.consistency is not None and verdict.consistency.finished == 3
    assert majority_answer(verdict.consistency) is None
    assert verdict.is_correct is False  # none of them reproduced the run's answer


def test_the_sequential_rule_stops_at_a_lead_and_draws_more_on_a_split() -> None:
    assert not sequential_stop(1, 1, stop_lead=2) and sequential_stop(2, 0, stop_lead=2)
    assert sequential_stop(0, 2, stop_lead=2) and sequential_stop(3, 1, stop_lead=2)
    assert not sequential_stop(5, 0, stop_lead=None) and not sequential_stop(5, 0, stop_lead=0)
    # two alike stop it: the agreeing run costs two agent runs
    agreeing = _answering("none")
    verdict = ConsistencyVerifier(agreeing, samples=5, stop_lead=2).verify(_run("none"), expected=None)
    assert len(agreeing.resampled) == 2 and verdict.basis == "consistency_agree"
    assert verdict.consistency is not None and (verdict.consistency.samples, verdict.consistency.stop_lead) == (5, 2)
    # a split draws more: 1-1, 2-1, 2-2, then the fifth decides 3-2 for the answer
    split = _answering("none", "Bangkok, Thailand", "none", "Bangkok, Thailand", "none")
    verdict = ConsistencyVerifier(split, samples=5, stop_lead=2).verify(_run("none"), expected=None)
    assert len(split.resampled) == 5 and verdict.basis == "consistency_partial" and verdict.is_correct is True
    assert verdict.score == pytest.approx(0.4)
    # 1-1 then two disagreeing: stopped at four, flagged
    leaning = _answering("none", "Bangkok, Thailand", "Bangkok, Thailand", "Bangkok, Thailand", "none")
    verdict = ConsistencyVerifier(leaning, samples=5, stop_lead=2).verify(_run("none"), expected=None)
    assert len(leaning.resampled) == 4 and verdict.is_correct is False and verdict.score == pytest.approx(0.75)

    # a failed resample is not counted toward the lead: the check goes on past it
    def one_fails(_t: StructuredTrace, sample: int, _temp: float) -> Sequence[Mapping[str, Any]]:
        if sample == 1:
            raise ReplayError("the agent's endpoint timed out")
        return [WRONG_FILTER, {"tool": "final_answer", "args": {"answer": "none"}}]

    resampler_ = ScriptedResampler(one_fails)
    verdict = ConsistencyVerifier(resampler_, samples=5, stop_lead=2).verify(_run("none"), expected=None)
    assert verdict.consistency is not None and len(verdict.consistency.runs) == 3
    assert verdict.consistency.finished == 2 and verdict.basis == "consistency_agree"


def test_the_threshold_flags_the_score_it_is_reached_by() -> None:
    """1 of 3 resamples reproducing the answer scores 0.67: flagged at 0.5, cleared at 0.8."""
    runs = _answering("Bangkok, Thailand", "Bangkok, Thailand", "none")
    low = ConsistencyVerifier(runs, samples=3, threshold=0.5).verify(_run("none"), expected=None)
    high = ConsistencyVerifier(runs, samples=3, threshold=0.8).verify(_run("none"), expected=None)
    assert low.score == high.score == pytest.approx(2 / 3)
    assert (low.is_correct, low.basis) == (False, "consistency_disagree")
    assert (high.is_correct, high.basis) == (True, "consistency_partial")


def test_a_fitted_score_decides_where_the_calibration_holds_one() -> None:
    """The calibration's map for the verifier scores the run's features; the threshold flags or clears it, and the
    verdict shows the score, not a measured precision."""
    fitted = ScoreMap(
        features=("disagreement",), means=(0.5,), scales=(0.5,), weights=(2.0,), intercept=0.0, ridge=1.0,
        fitted_on=40, wrong=30,
    )  # fmt: skip
    calibration = ConfidenceCalibration(scores={"consistency": fitted})
    runs = _answering("Bangkok, Thailand", "Bangkok, Thailand", "none")
    verdict = ConsistencyVerifier(runs, samples=3, calibration=calibration).verify(_run("none"), expected=None)
    expected = 1 / (1 + math.exp(-2.0 * (2 / 3 - 0.5) / 0.5))
    assert verdict.score == pytest.approx(expected, abs=1e-6) and verdict.basis == "score_high"
    assert verdict.is_correct is False and verdict.confidence is None
    assert "fitted on 40 labelled runs" in verdict.reasoning
    cleared = ConsistencyVerifier(runs, samples=3, threshold=0.9, calibration=calibration)
    assert cleared.verify(_run("none"), expected=None).basis == "score_low"


def test_no_adapter_a_failed_resample_or_a_run_not_drawn_is_uncertain_never_a_verdict() -> None:
    assert ConsistencyVerifier(None).verify(_run("none"), expected=None).is_correct is None

    def failing(_t: StructuredTrace, _s: int, _temp: float) -> Sequence[Mapping[str, Any]]:
        raise ReplayError("replay endpoint answered 503")

    failed = ConsistencyVerifier(ScriptedResampler(failing), samples=2).verify(_run("none"), expected=None)
    assert failed.is_correct is None and "503" in failed.reasoning
    runs = _answering("Bangkok, Thailand")
    skipped = ConsistencyVerifier(runs, sample_rate=0.0).verify(_run("none"), expected=None)
    assert skipped.is_correct is None and "sample rate" in skipped.reasoning and runs.resampled == []


def _audit_llm(category: str = "Aligned") -> ScriptedLLM:
    anchors = {
        "hard": {"entities": [], "filters": [], "target_property": "venue", "operation": "lookup", "output_form": ""},
        "plans": [{"subgoals": ["filter", "read"]}],
    }
    steps = [
        {"macro_step": i, "category": category, "severity": "critical", "anchor": "hard", "rationale": f"step {i}"}
        for i in (1, 2)
    ]
    return ScriptedLLM([anchors, {"steps": steps}])


def _combined(
    llm: ScriptedLLM, runs: ScriptedResampler | None, calibration: ConfidenceCalibration | None = None
) -> CombinedVerifier:
    empty = ConfidenceCalibration()
    proxy = PlanAnchoredVerifier(llm, config=ProxyVerifierConfig(calibration=calibration or empty))
    return CombinedVerifier(proxy, ConsistencyVerifier(samples=3)).with_runs(runs)


def test_combined_evidence_first_then_consistency_then_the_audit() -> None:
    # a critical finding decides with no resample and no model call
    runs = _answering("none")
    looped = make_trace(QUESTION, [WRONG_FILTER, WRONG_FILTER, WRONG_FILTER], final_answer="")
    verdict = _combined(ScriptedLLM([]), runs).verify(looped, expected=None)
    assert verdict.basis == "critical_evidence" and verdict.is_correct is False and runs.resampled == []
    # resamples that disagree decide, with no audit
    llm = ScriptedLLM([])
    verdict = _combined(llm, _answering("Bangkok, Thailand")).verify(_run("none"), expected=None)
    assert (verdict.basis, verdict.is_correct, llm.requests) == ("consistency_disagree", False, [])
    # resamples that all agree clear it, with no audit
    verdict = _combined(llm, _answering("none")).verify(_run("none"), expected=None)
    assert (verdict.basis, verdict.is_correct, llm.requests) == ("consistency_agree", True, [])


def test_a_split_check_is_decided_by_its_score_and_the_audit_only_where_no_check_decided() -> None:
    llm = _audit_llm("Evidence_Contradiction")
    verdict = _combined(llm, _answering("none", "Bangkok, Thailand", "none")).verify(_run("none"), expected=None)
    assert (verdict.basis, verdict.is_correct, verdict.score) == ("consistency_partial", True, pytest.approx(1 / 3))
    assert llm.requests == [] and verdict.consistency is not None and verdict.consistency.agreeing == 2
    # without an adapter, the audit alone decides
    verdict = _combined(_audit_llm(), None).verify(_run("none"), expected=None)
    assert verdict.basis == "audit_low_clean" and verdict.is_correct is True and verdict.consistency is None

    # too few resamples finished: the audit decides, shown the one that did as data
    def refused(_t: StructuredTrace, sample: int, _temp: float) -> list[dict[str, Any]]:
        if sample:
            raise ReplayError("the agent's endpoint is down")
        return [RIGHT_FILTER, {"tool": "final_answer", "args": {"answer": "Bangkok, Thailand"}}]

    llm = _audit_llm("Evidence_Contradiction")
    verdict = _combined(llm, ScriptedResampler(refused)).verify(_run("none"), expected=None)
    assert verdict.basis == "audit_high" and verdict.is_correct is False and verdict.verifier == "combined"
    audit = llm.requests[-1].text
    evidence = audit[audit.index("BEGIN EVIDENCE") : audit.index("END EVIDENCE")]
    assert "0 of 1 resamples reproduced the answer 'none'" in evidence
    assert "Resample 1: answered 'Bangkok, Thailand' (different); it first decided otherwise at step 1" in evidence


def test_the_combined_confidence_is_the_measured_precision_of_the_deciding_basis() -> None:
    calibration = ConfidenceCalibration(
        verifier="combined",
        model="scripted-llm",
        samples=3,
        temperature=0.7,
        counts={"consistency_disagree": (17, 20), "audit_high": (1, 4)},
        source="test runs",
    )
    verdict = _combined(ScriptedLLM([]), _answering("Bangkok, Thailand"), calibration).verify(
        _run("none"), expected=None
    )
    assert verdict.confidence == pytest.approx(0.85) and verdict.measured is not None
    assert (verdict.measured.low, verdict.measured.high) == pytest.approx((0.6396, 0.9476), abs=1e-3)
    agreed = _combined(ScriptedLLM([]), _answering("none"), calibration).verify(_run("none"), expected=None)
    assert agreed.confidence is None and agreed.measured is None  # consistency_agree never measured
    # measured with 3 resamples: says nothing of a check drawing 5, nor of another verifier's verdicts
    proxy = PlanAnchoredVerifier(ScriptedLLM([]), config=ProxyVerifierConfig(calibration=calibration))
    five = CombinedVerifier(proxy, ConsistencyVerifier(samples=5)).with_runs(_answering("Bangkok, Thailand"))
    assert five.verify(_run("none"), expected=None).confidence is None
    alone = ConsistencyVerifier(_answering("Bangkok, Thailand"), samples=3, calibration=calibration)
    assert alone.verify(_run("none"), expected=None).confidence is None


def test_a_combined_audit_takes_the_proxys_precision() -> None:
    """The combined verifier audits only runs no check decided (no adapter, or too few resamples finished): the
    proxy's own audits, measured as the proxy's, never a precision measured for the combined verifier's."""
    combined = ConfidenceCalibration(
        verifier="combined", model="scripted-llm", samples=3, temperature=0.7, counts={"audit_high": (6, 8)}
    )
    unchecked = _combined(_audit_llm("Evidence_Contradiction"), None, combined).verify(_run("none"), expected=None)
    assert unchecked.basis == "audit_high" and unchecked.confidence is None and unchecked.measured is None
    assert "no replay adapter" in unchecked.reasoning
    proxy = ConfidenceCalibration(verifier="plan_anchored", model="scripted-llm", counts={"audit_high": (6, 8)})
    measured = _combined(_audit_llm("Evidence_Contradiction"), None, proxy).verify(_run("none"), expected=None)
    assert measured.confidence == pytest.approx(0.75)


def _online_combined(finder: Any, budget: TokenBudget) -> tuple[AttributionService, ScriptedLLM]:
    """Online triage with the combined verifier, flagged runs attributed by first-step; its model answers nothing
    (no test here needs an audit: the evidence or a unanimous check decides)."""
    llm = ScriptedLLM(respond=lambda _r: {})
    service = AttributionService(
        llm,
        METHODS["first-step"],
        verifier=OracleVerifier(),
        proxy=flagging_verifier("combined", llm),
        config=ReflectConfig(),
        replay_finder=finder,
        budget=budget,
        triage=True,
    )
    return service, llm


def _looped(trace_id: str) -> StructuredTrace:
    """A run that repeats one filter and never answers: a critical evidence finding."""
    return make_trace(QUESTION, [WRONG_FILTER, WRONG_FILTER, WRONG_FILTER], final_answer="", trace_id=trace_id)


def test_the_service_resamples_through_the_found_adapter_and_counts_the_agents_tokens() -> None:
    """Online triage with the combined verifier: the wrong run is flagged through its adapter's resamples and
    attributed; the right one is left alone; each resample's tokens (the agent's own model) count against the
    hourly budget."""
    budget = TokenBudget(per_trace=10**6, per_hour=10**6)
    adapters = {"wrong": _answering("Bangkok, Thailand", tokens=100), "right": _answering("Bangkok", tokens=100)}

    def find(trace: StructuredTrace, _llm: object) -> ScriptedResampler:
        return adapters["wrong" if trace.final_answer == "none" else "right"]

    service, llm = _online_combined(find, budget)
    flagged = service.process(_run("none", trace_id="a" * 32))
    assert flagged.flagged and flagged.record is not None and flagged.verdict is not None
    assert flagged.verdict.basis == "consistency_disagree"
    # two resamples alike stop the check (REFLECT_FLAG_STOP_LEAD): 100 tokens each, none on our model
    assert budget.spent_last_hour() == 200
    right = service.process(_run("Bangkok", RIGHT_FILTER, trace_id="b" * 32))
    assert not right.flagged and right.record is None and right.verdict is not None
    assert right.verdict.basis == "consistency_agree" and budget.spent_last_hour() == 400
    assert llm.requests == []


def test_flagging_verifiers_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REFLECT_FLAG_SAMPLES", "7")
    monkeypatch.setenv("REFLECT_FLAG_SAMPLE_RATE", "0.5")
    monkeypatch.setenv("REFLECT_FLAG_STOP_LEAD", "3")
    monkeypatch.setenv("REFLECT_FLAG_THRESHOLD", "0.7")
    made = flagging_verifier("consistency", ScriptedLLM([]))
    assert isinstance(made, ConsistencyVerifier)
    assert (made.samples, made.sample_rate, made.stop_lead, made.threshold) == (7, 0.5, 3, 0.7)
    monkeypatch.setenv("REFLECT_FLAG_STOP_LEAD", "0")  # every resample asked is run
    assert flagging_verifier("consistency", ScriptedLLM([])).stop_lead is None  # type: ignore[attr-defined]
    assert {flagging_verifier(n, ScriptedLLM([])).name for n in ("proxy", "evidence", "combined")} == {
        "plan_anchored",
        "evidence",
        "combined",
    }
    with pytest.raises(ValueError, match="choose from"):
        flagging_verifier("oracle", ScriptedLLM([]))


def test_reflects_localizer_sees_where_the_resamples_departed_from_the_run() -> None:
    """The check that flagged a run is localization evidence: REFLECT's prompts about the original run show the
    resamples (inside the evidence block), not its replays'."""
    run = _run("none")
    flagged = ConsistencyVerifier(_answering("Bangkok, Thailand"), samples=2).verify(run, expected=None)
    attribution = AttributionRun("reflect", ScriptedLLM([]), run, {}, OracleVerifier(), flagged)
    context = attribution.prompt_context(run, None, include_expected=False, domain_context="", config=ReflectConfig())
    assert "Resample 1: answered 'Bangkok, Thailand' (different); it first decided otherwise at step 1" in (
        context.evidence
    )
    replayed = run.model_copy(update={"trace_id": "f" * 32})
    other = attribution.prompt_context(
        replayed, None, include_expected=False, domain_context="", config=ReflectConfig()
    )
    assert "Resample" not in other.evidence


class _ResamplingAgent:
    """The five-step example's agent (:func:`scripted_agent`), which resampled from the start multiplies and
    answers 42 (its consensus) where its greedy run added and answered 41."""

    def __init__(self) -> None:
        self.agent = scripted_agent()
        self.deterministic = True
        self.resampled = 0

    def replay(self, request: ReplayRequest) -> ReplayResult:
        return self.agent.replay(request)

    def propose(self, request: ReplayRequest, *, samples: int = 1) -> Any:
        return self.agent.propose(request, samples=samples)

    def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
        trace = request.trace
        self.resampled += samples
        runs = []
        for n in range(samples):
            steps = (*trace.steps[:2], make_step(3, tool="multiply", args={"a": 6, "b": 7}, result="42"))
            steps += (make_step(4, reasoning="The answer is 42", is_final_answer=True, completion_tokens=50),)
            rerun = trace.model_copy(
                update={"trace_id": f"{n:032x}", "steps": steps, "final_answer": "The answer is 42"}
            )
            runs.append(
                ReplayResult(trace=rerun, rollback_point=0, final_answer="The answer is 42", prefix_verified=True)
            )
        return tuple(runs)


def test_reflect_proxy_judges_the_run_and_its_replays_by_the_agents_own_consensus() -> None:
    """No expected answer anywhere: the run is flagged because its resamples agree on another answer (no audit),
    and a replay counts as corrected when it gives that consensus answer; the control, answering 41 again, does
    not, so the step is verified under control without the answer ever being known."""
    agent = _ResamplingAgent()
    auditor = scripted_auditor()
    method = METHODS["reflect-proxy"].build(auditor, OracleVerifier(), ReflectConfig(rounds=1))
    record = method.attribute(five_step_trace(), expected=None, replay=agent)
    localize = next(r for r in auditor.requests if r.stage == "localize")
    assert "Resample 1: answered '42' (different); it first decided otherwise at step 3" in localize.text
    assert agent.resampled == 2  # checked once (two alike stop it); replays are judged against it, not resampled
    assert record.original_verdict is not None and record.original_verdict.basis == "consistency_disagree"
    assert record.status.value == "verified" and record.corrected_answer == "The answer is 42"
    judged = [r.verdict for r in record.replays if r.verdict is not None]
    assert judged and {v.basis for v in judged} == {"consistency_majority"}
    assert record.effect is not None and record.effect.control.flips == 0


def test_reflect_proxys_own_check_counts_the_agents_resample_tokens_against_the_hour() -> None:
    """Without triage (``attribute --method reflect-proxy``) the method checks the run itself: the resamples of an
    agent on its own model spend the hourly budget as the triage's do."""
    budget = TokenBudget(per_trace=10**6, per_hour=10**6)
    agent = _ResamplingAgent()
    service = AttributionService(
        scripted_auditor(),
        METHODS["reflect-proxy"],
        verifier=OracleVerifier(),
        config=ReflectConfig(rounds=1),
        budget=budget,
    )
    outcome = service.process(five_step_trace(), replay=agent)
    assert outcome.record is not None and outcome.record.original_verdict is not None
    assert outcome.record.original_verdict.basis == "consistency_disagree" and agent.resampled == 2
    # the hour holds the auditor's tokens (the record's) and the two resamples' 50 each, counted once
    assert budget.spent_last_hour() == outcome.record.total_tokens + 2 * 50


def test_a_run_without_an_answer_is_not_cleared_by_resamples_without_one() -> None:
    """Three resamples that also never answer 'agree' with a run that never answered: that is no evidence the run
    was right (the evidence checks flag such runs), so the check says nothing."""
    silent = make_trace(QUESTION, [WRONG_FILTER], final_answer=None)
    runs = ScriptedResampler(lambda _t, _s, _temp: [WRONG_FILTER])
    verdict = ConsistencyVerifier(runs, samples=3).verify(silent, expected=None)
    assert verdict.is_correct is None and "no answer to compare" in verdict.reasoning


def test_each_resample_is_asked_alone_so_one_that_fails_keeps_the_others_and_their_tokens() -> None:
    """One run per request: an endpoint answering more runs than asked is held to one, and a failed resample (a
    refusal, an empty answer, or any exception of a user's adapter) costs only itself."""

    class Endpoint:
        def __init__(self, replies: list[object]) -> None:
            self.source = _answering("Bangkok, Thailand", tokens=40)
            self.replies = replies
            self.asked: list[int] = []

        def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
            self.asked.append(samples)
            reply = self.replies[len(self.asked) - 1]
            if isinstance(reply, Exception):
                raise reply
            return self.source.resample(request, samples=int(str(reply)))

    many = Endpoint([20, 20, 20])
    judged = ConsistencyVerifier(many, samples=3).verify(_run("none"), expected=None)
    assert many.asked == [1, 1, 1] and judged.consistency is not None and len(judged.consistency.runs) == 3

    broken = Endpoint([1, TypeError("dict() argument must be a mapping"), ReplayError("agent refused")])
    verdict = ConsistencyVerifier(broken, samples=3).verify(_run("none"), expected=None)
    check = verdict.consistency
    assert check is not None and (check.finished, check.agent_tokens) == (1, 40)
    assert [r.error for r in check.runs[1:]] == [
        "the adapter failed: TypeError: dict() argument must be a mapping",
        "agent refused",
    ]
    # one finished run of three is no consensus: the check decides nothing and says why
    assert verdict.is_correct is None and verdict.label == "UNCERTAIN"
    assert "too few resamples finished to decide (1 of 3)" in verdict.reasoning
    assert majority_answer(check) is None

    empty = Endpoint([1, 0, 1])
    two = ConsistencyVerifier(empty, samples=3).verify(_run("none"), expected=None)
    assert (
        two.consistency is not None
        and two.consistency.runs[1].error == "the adapter returned no run for the resample asked"
    )
    assert two.is_correct is False and two.basis == "consistency_disagree"  # 2 of 3 finished, neither agrees


def test_a_long_consensus_answer_judges_a_replay_that_gives_it() -> None:
    """Answers are kept (and voted on) within a bound far above what a prompt shows: a replay giving the agent's
    long consensus answer is right, not cut short into a mismatch."""
    long = "Bangkok, Thailand; " + "the venue of the race, " * 40
    runs = _answering(long)
    verdict = ConsistencyVerifier(runs, samples=3).verify(_run("none"), expected=None)
    assert verdict.consistency is not None and majority_answer(verdict.consistency) == long.strip()
    assert len(verdict.reasoning) < len(long) * 3  # each answer shown cut, not whole
    judge = ConsistencyVerifier(samples=3).with_original(_run("none"), verdict)
    replayed = judge.verify(_run(long, RIGHT_FILTER, trace_id="0" * 31 + "2"), expected=None)
    assert replayed.is_correct is True and replayed.basis == "consistency_majority"


def test_a_spent_hourly_budget_stops_resampling_and_skips_cost_nothing_more() -> None:
    budget = TokenBudget(per_trace=10**6, per_hour=100)
    budget.spend(100)
    adapter = _answering("Bangkok, Thailand", tokens=100)
    audit = _audit_llm("Evidence_Contradiction")  # the run is flagged by the audit, no resample drawn
    service = AttributionService(
        audit,
        METHODS["first-step"],
        verifier=OracleVerifier(),
        proxy=CombinedVerifier(PlanAnchoredVerifier(audit), ConsistencyVerifier(samples=3)),
        replay_finder=lambda _t, _l: adapter,
        budget=budget,
        triage=True,
    )
    outcome = service.process(_run("none"))
    assert adapter.resampled == [] and outcome.budget_skipped
    assert outcome.verdict is not None and "hourly token budget" in outcome.verdict.reasoning


def test_resamples_within_a_replay_budget_count_as_replays() -> None:
    """reflect-proxy's check of a failure it attributes spends that failure's replay budget, as every method's
    replays do: no method gets agent runs the others do not."""
    budgeted = BudgetedReplay(_answering("none"), 4)
    source = resampler(budgeted)
    assert source is budgeted
    source.resample(ReplayRequest.resampling(_run("none"), 0.7), samples=3)
    assert budgeted.remaining == 1
    with pytest.raises(ReplayError, match="leaves 1"):
        source.resample(ReplayRequest.resampling(_run("none"), 0.7), samples=3)


def test_store_stats_show_each_verifiers_measured_precision_with_its_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The proxy's and the combined verifier's verdicts on one basis are counted apart, each with the precision
    (interval and count) it carried."""
    from reflect_otel.cli import main
    from reflect_otel.exporters.duckdb_store import DuckDBStore

    calibration = ConfidenceCalibration(
        verifier="combined", model="scripted-llm", samples=3, temperature=0.7, counts={"consistency_disagree": (17, 20)}
    )
    flagged = _combined(ScriptedLLM([]), _answering("Bangkok, Thailand"), calibration).verify(
        _run("none"), expected=None
    )
    audited = _combined(_audit_llm(), None).verify(_run("none", trace_id="0" * 31 + "2"), expected=None)
    proxy = PlanAnchoredVerifier(_audit_llm()).verify(_run("none", trace_id="0" * 31 + "3"), expected=None)
    path = tmp_path / "stats.duckdb"
    with DuckDBStore(path) as store:
        for number, verdict in enumerate((flagged, audited, proxy), start=1):
            trace = _run("none", trace_id="0" * 31 + str(number))
            store.write_trace(trace)
            store.write_verdict(trace.trace_id, verdict)
    assert main(["stats", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "combined verdicts on consistency_disagree: 1 (1 flagged; precision 0.85, 95% [0.64, 0.95] measured on 20 "
        "labelled runs, 3 agent resamples)" in out
    )
    assert "combined verdicts on audit_low_clean: 1 (0 flagged; precision not measured)" in out
    assert "plan_anchored verdicts on audit_low_clean: 1 (0 flagged; precision not measured)" in out
    # the store keeps each verdict's score: the share a threshold flags, at REFLECT_FLAG_THRESHOLD or --threshold
    assert "combined: 1 of 2 scored runs (50%) reach the flagging threshold 0.5" in out
    assert "plan_anchored: 0 of 1 scored runs (0%) reach the flagging threshold 0.5" in out
    assert main(["stats", "--store", str(path), "--threshold", "0.01"]) == 0
    assert "combined: 2 of 2 scored runs (100%) reach the flagging threshold 0.01" in capsys.readouterr().out


def test_a_check_that_can_no_longer_decide_runs_no_more_resamples_and_counts_as_failed() -> None:
    """Two of three failed: the third would cost an agent run and decide nothing. Such a check is a failure (a
    benchmark counts it apart), not a verdict."""

    def down(_t: StructuredTrace, _sample: int, _temp: float) -> list[dict[str, Any]]:
        raise ReplayError("the agent's endpoint is down")

    runs = ScriptedResampler(down)
    verdict = ConsistencyVerifier(runs, samples=3).verify(_run("none"), expected=None)
    assert len(runs.resampled) == 2 and verdict.consistency is not None and len(verdict.consistency.runs) == 3
    assert verdict.is_correct is None and verdict.error == "the agent's endpoint is down"
    assert verdict.reasoning == "too few resamples finished to decide (0 of 3): the agent's endpoint is down"


def test_a_run_without_an_answer_still_has_its_resamples_consensus_for_judging_replays() -> None:
    silent = make_trace(QUESTION, [WRONG_FILTER], final_answer=None)
    verdict = ConsistencyVerifier(_answering("Bangkok, Thailand"), samples=3).verify(silent, expected=None)
    assert verdict.consistency is not None and majority_answer(verdict.consistency) == "Bangkok, Thailand"


def test_without_an_answer_a_replay_is_proved_right_only_by_the_agents_consensus() -> None:
    """reflect-proxy's judge of replays. On seed 2475 an audit finding no deviation in a replay was taken as "right":
    it verified a wrong answer (14 for 36) and judged both arms right on four failures, so they were not attributable.
    Now only the agent's consensus proves a replay right; the audit's "right" leaves it not judged, its "wrong"
    (a critical finding) stands; and a run the evidence flagged is resampled too, so its replays have a consensus."""
    calibration = ConfidenceCalibration()

    def judge(runs: ScriptedResampler, audit: ScriptedLLM) -> CombinedVerifier:
        proxy = PlanAnchoredVerifier(audit, config=ProxyVerifierConfig(calibration=calibration))
        return CombinedVerifier(proxy, ConsistencyVerifier(samples=3), check_after_evidence=True).with_runs(runs)

    looped = _looped("0" * 31 + "1")
    consensus = _answering("Bangkok, Thailand")
    flagged = judge(consensus, ScriptedLLM([])).verify(looped, expected=None)
    assert flagged.basis == "critical_evidence" and flagged.is_correct is False  # the evidence still decides
    assert len(consensus.resampled) == 3 and flagged.consistency is not None
    replays = judge(consensus, ScriptedLLM([])).with_original(looped, flagged)
    fixed = replays.verify(_run("Bangkok, Thailand", RIGHT_FILTER, trace_id="0" * 31 + "2"), expected=None)
    assert fixed.is_correct is True and fixed.basis == "consistency_majority"
    assert replays.verify(_run("Hanoi", trace_id="0" * 31 + "3"), expected=None).is_correct is False

    split = _answering("Bangkok", "Hanoi", "Lima")  # no two resamples agree: no consensus
    audited = judge(split, _audit_llm("Aligned"))
    original = _run("none")
    verdict = audited.verify(original, expected=None)
    assert verdict.basis == "consistency_disagree" and verdict.consistency is not None
    assert majority_answer(verdict.consistency) is None
    replays = audited.with_original(original, verdict)
    clean = replays.verify(_run("Bangkok, Thailand", RIGHT_FILTER, trace_id="0" * 31 + "2"), expected=None)
    assert clean.is_correct is None and clean.label == "UNCERTAIN" and clean.confidence is None
    assert clean.basis is None  # it decided nothing
    assert clean.reasoning.startswith("not judged: the agent's resamples agreed on no answer")
    assert "no deviations" in clean.reasoning and "no replay adapter" not in clean.reasoning  # what the audit said
    assert replays.unprovable is not None
    relooped = looped.model_copy(update={"trace_id": "0" * 31 + "4"})
    assert replays.verify(relooped, expected=None).is_correct is False  # a critical finding still says wrong

    # resamples agreeing with the run's own answer (the evidence flagged it): no consensus to prove a replay by
    repeated = _answering("none", "none", "Bangkok, Thailand")
    agreeing = judge(repeated, _audit_llm("Aligned"))
    stuck = _run("none", trace_id="0" * 31 + "5").model_copy(update={"steps": looped.steps, "final_answer": "none"})
    judged = agreeing.verify(stuck, expected=None)
    assert judged.basis == "critical_evidence" and judged.consistency is not None
    same = agreeing.with_original(stuck, judged)
    assert same.unprovable is not None and "agreed with the run's own answer" in same.unprovable
    other = same.verify(_run("Bangkok, Thailand", RIGHT_FILTER, trace_id="0" * 31 + "6"), expected=None)
    assert other.is_correct is None and other.reasoning.startswith("not judged: the agent's resamples agreed with")

    # flagging alone (as the flagging benchmark measures it) spends no agent run on a run the evidence flagged
    alone = _answering("Bangkok, Thailand")
    assert _combined(ScriptedLLM([]), alone).verify(looped, expected=None).basis == "critical_evidence"
    assert alone.resampled == []


def test_online_a_run_the_evidence_flagged_is_resampled_for_its_replays_and_the_resamples_are_paid_for() -> None:
    """Online, a flagged run is attributed: 'combined' resamples a run the evidence flagged as well, so its
    replays can be proved right by the agent's consensus, and the resamples count against the hourly budget."""
    budget = TokenBudget(per_trace=10**6, per_hour=10**6)
    agent = _answering("Bangkok, Thailand", tokens=100)
    service, llm = _online_combined(lambda _t, _l: agent, budget)
    looped = _looped("c" * 32)
    outcome = service.process(looped)
    assert outcome.flagged and outcome.verdict is not None and outcome.verdict.basis == "critical_evidence"
    check = outcome.verdict.consistency
    assert check is not None and majority_answer(check) == "Bangkok, Thailand"
    assert len(agent.resampled) == 2 and budget.spent_last_hour() == 200 and llm.requests == []


def test_a_run_whose_resamples_prove_no_replay_right_is_localized_without_spending_replays() -> None:
    """Without an expected answer, resamples that agree on no answer leave nothing to prove a replay right by:
    reflect-proxy localizes the step and says why, and replays nothing (they could only come back not judged)."""

    class Split(_ResamplingAgent):
        def __init__(self) -> None:
            super().__init__()
            self.replays = 0

        def replay(self, request: ReplayRequest) -> ReplayResult:
            self.replays += 1
            return super().replay(request)

        def resample(self, request: ReplayRequest, *, samples: int) -> tuple[ReplayResult, ...]:
            runs = super().resample(request, samples=samples)
            answer = f"The answer is {40 + 3 * self.resampled}"  # another answer each time
            return tuple(r.model_copy(update={"final_answer": answer}) for r in runs)

    agent = Split()
    method = METHODS["reflect-proxy"].build(scripted_auditor(), OracleVerifier(), ReflectConfig(rounds=1))
    record = method.attribute(five_step_trace(), expected=None, replay=agent)
    assert agent.resampled == 2 and agent.replays == 0 and record.replays == ()
    assert record.original_verdict is not None and record.original_verdict.basis == "consistency_disagree"
    assert record.status.value == "unverified" and record.mode.value == "localization_only"
    assert record.step_index is not None
    assert record.reason == (
        "localization only: the agent's resamples agreed on no answer, so none can judge a replay right"
    )


def test_online_the_sample_rate_and_a_spent_hour_hold_for_a_run_the_evidence_flagged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looped = _looped("d" * 32)
    monkeypatch.setenv("REFLECT_FLAG_SAMPLE_RATE", "0")
    undrawn = _answering("Bangkok, Thailand")
    verdict = bound_to_runs(flagging_verifier("combined", ScriptedLLM([])), undrawn).verify(looped, expected=None)
    assert verdict.basis == "critical_evidence" and verdict.consistency is None and undrawn.resampled == []
    monkeypatch.delenv("REFLECT_FLAG_SAMPLE_RATE")
    budget = TokenBudget(per_trace=10**6, per_hour=100)
    budget.spend(100)
    agent = _answering("Bangkok, Thailand", tokens=100)
    service, _llm = _online_combined(lambda _t, _l: agent, budget)
    outcome = service.process(looped)
    assert outcome.verdict is not None and outcome.verdict.basis == "critical_evidence"
    assert agent.resampled == [] and outcome.budget_skipped
