"""The attribution service's triage and skip of runs the oracle judged right or undecided (a real oracle, the
last-step floor as the method: it calls no model)."""

from __future__ import annotations

from reflect_otel.attribution.methods import method_spec
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import ReflectConfig
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.record import AttributionStatus
from reflect_otel.testing import ScriptedLLM, make_trace
from reflect_otel.trace import StructuredTrace

QUESTION = "in what year were there the most births?"


def _run(answer: str) -> StructuredTrace:
    return make_trace(
        QUESTION, [{"tool": "count", "args": {"by": "year"}, "result": "2004: 9, 2008: 9"}], final_answer=answer
    )


def _service(
    *, skip_correct: bool = False, triage: bool = False, config: ReflectConfig | None = None
) -> AttributionService:
    return AttributionService(
        ScriptedLLM(),
        method_spec("last-step"),
        verifier=OracleVerifier(),
        config=config or ReflectConfig(),
        skip_correct=skip_correct,
        triage=triage,
    )


def test_an_undecided_run_is_neither_attributed_as_a_failure_nor_taken_for_right() -> None:
    skipping = _service(skip_correct=True)
    hedged = skipping.process(_run("It was either 2004 or 2008"), expected="2008")
    assert hedged.verdict is not None and hedged.verdict.is_correct is None and hedged.verdict.label == "undecided"
    assert not hedged.flagged and hedged.record is not None and hedged.record.status is AttributionStatus.SKIPPED
    assert "judged undecided" in hedged.record.reason
    wrong = skipping.process(_run("It was 2004"), expected="2008")
    assert wrong.flagged and wrong.record is not None and wrong.record.status is not AttributionStatus.SKIPPED
    right = skipping.process(_run("2008 births"), expected="2008")  # right in substance: skipped as right
    assert right.record is not None and "judged right" in right.record.reason

    # online, even where runs the verifier cannot judge are attributed
    triage = _service(triage=True, config=ReflectConfig(attribute_uncertain=True))
    assert not triage.process(_run("It was either 2004 or 2008"), expected="2008").flagged
    assert triage.process(_run("It was 2004"), expected="2008").flagged
