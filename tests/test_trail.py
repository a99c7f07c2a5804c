"""Every TRAIL trace of the development data assembles, and its annotations map to steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflect_otel.datasets.trail import TrailImport, normalise_trail_category, read_trail_file
from reflect_otel.flagging.evidence import FindingKind, Severity, find_evidence
from reflect_otel.trace import StepKind, StructuredTrace


def _trace_files(shared_data: Path) -> list[Path]:
    files = sorted((shared_data / "trail").glob("*/traces/*.json"))
    if not files:
        pytest.skip("no TRAIL traces in shared data")
    return files


@pytest.fixture(scope="module")
def trail(shared_data: Path) -> list[tuple[Path, TrailImport]]:
    """Every TRAIL trace file, read once for the tests that go over all of them."""
    return [(path, read_trail_file(path, max_bytes=256 * 1024 * 1024)) for path in _trace_files(shared_data)]


def test_every_trail_trace_assembles_and_labels_map(trail: list[tuple[Path, TrailImport]]) -> None:
    total = mapped = 0
    for path, imported in trail:
        trace = imported.trace
        assert trace.trace_id == path.stem
        assert trace.steps, path
        assert trace.question, path
        assert trace.source.framework == "smolagents"
        llm_or_tool_ids = {sid for s in trace.steps for sid in s.span_ids}
        for label in trace.labels:
            if label.step_index is not None:
                step = trace.steps[label.step_index - 1]
                assert label.span_id in step.span_ids or label.span_id not in llm_or_tool_ids
        total += imported.labels_total
        mapped += imported.labels_mapped
    assert total > 0
    assert mapped / total >= 0.99, f"{mapped}/{total} annotation locations mapped"


def test_code_agent_steps_and_final_answer(shared_data: Path) -> None:
    path = _trace_files(shared_data)[0]
    trace = read_trail_file(path, max_bytes=256 * 1024 * 1024).trace
    finals = [s for s in trace.steps if s.is_final_answer]
    assert len(finals) == 1
    assert trace.final_answer
    assert any(s.kind is StepKind.REASONING for s in trace.steps)


def test_the_answer_step_is_the_agents_not_the_harness_turn_after_it(shared_data: Path) -> None:
    """GAIA's harness asks the model to restate the agent's answer ("FINAL ANSWER: 33149") after the agent span
    returned it: the run's answer is the agent's output, and its answer step the agent's final_answer call."""
    path = shared_data / "trail" / "gaia" / "traces" / "0035f455b3ff2295167a844f04d85d34.json"
    if not path.is_file():
        pytest.skip(f"{path} not in shared data")
    trace = read_trail_file(path, max_bytes=256 * 1024 * 1024).trace
    (final,) = [s for s in trace.steps if s.is_final_answer]
    assert (final.kind, final.agent, final.tool_name, final.tool_args) == (
        StepKind.FINAL_ANSWER,
        "CodeAgent.run",
        "final_answer",
        {"args": ["33149"]},
    )
    assert trace.final_answer == "33149"
    harness = trace.steps[-1]
    assert (harness.index, harness.kind, harness.agent) == (final.index + 1, StepKind.REASONING, None)
    assert harness.reasoning == "FINAL ANSWER: 33149"


def _gaia_trace(shared_data: Path, trace_id: str) -> StructuredTrace:
    path = shared_data / "trail" / "gaia" / "traces" / f"{trace_id}.json"
    if not path.is_file():
        pytest.skip(f"{path} not in shared data")
    return read_trail_file(path, max_bytes=256 * 1024 * 1024).trace


def test_a_sub_agents_answer_is_handed_back_and_the_managers_last_turn_answers(shared_data: Path) -> None:
    """GAIA's manager (a code agent) asks its search agent, which answers with a final_answer call that no tool span
    recorded; the manager's code then calls final_answer(10). The search agent's call hands its answer back (a
    message: no empty result, no lookup); the manager's turn, with its own tool run, is the run's answer step."""
    trace = _gaia_trace(shared_data, "e7d5dd0d36db95a40a4fbe258edd0aba")
    handed, final, harness = trace.steps[-3:]
    assert (handed.kind, handed.agent, handed.tool_name, handed.tool_result) == (
        StepKind.MESSAGE,
        "ToolCallingAgent.run",
        "final_answer",
        None,
    )
    assert str(handed.tool_args["answer"]).startswith("### 1. Task outcome (short version):")
    assert (final.kind, final.agent, final.tool_name, final.tool_args, final.tool_result) == (
        StepKind.FINAL_ANSWER,
        "CodeAgent.run",
        "final_answer",
        {"args": [10]},
        "",
    )
    assert final.tool_span_id is not None and final.reasoning.startswith("Thought: Based on the data")
    assert (harness.kind, harness.agent, trace.final_answer) == (StepKind.REASONING, None, "10")
    found = find_evidence(trace)
    assert not [f for f in found if f.step_index in (handed.index, final.index)]
    # the failed page_down calls at the end of the search: nothing succeeded after them before the answer
    last_failures = [f for f in found if f.kind is FindingKind.TOOL_ERROR and f.step_index in (14, 15)]
    assert [f.severity for f in last_failures] == [Severity.CRITICAL, Severity.CRITICAL]


def test_an_answer_given_as_an_object_is_the_answer_step(shared_data: Path) -> None:
    """The manager answers final_answer({"01": 15, ...}); the agent's output is that dict as Python writes it."""
    trace = _gaia_trace(shared_data, "62df2a06b647ca730391602dbf62f843")
    (final,) = [s for s in trace.steps if s.is_final_answer]
    assert (final.index, final.tool_name, final.agent) == (3, "final_answer", "CodeAgent.run")
    (answer,) = final.tool_args["args"]
    assert isinstance(answer, dict) and answer["01"] == 15
    assert trace.final_answer is not None and trace.final_answer.startswith("{'01': 15, '02': 12")
    assert not [f for f in find_evidence(trace) if f.kind is FindingKind.EMPTY_RESULT]


def test_every_answer_call_in_trail_is_an_answer_found_by_how_its_agent_ended(
    trail: list[tuple[Path, TrailImport]],
) -> None:
    """No name list: each of smolagents' final_answer calls (the runs' and the sub-agents') is found as the run's
    answer or an agent's answer handed back, never a lookup with an empty result; every run has its answer step."""
    handed_back = 0
    for path, imported in trail:
        trace = imported.trace
        assert sum(s.is_final_answer for s in trace.steps) == 1, path.stem
        calls = [s for s in trace.steps if s.tool_name == "final_answer"]
        assert all(s.kind in (StepKind.FINAL_ANSWER, StepKind.MESSAGE) for s in calls), path.stem
        handed_back += sum(s.kind is StepKind.MESSAGE for s in calls)
        assert not [f for f in find_evidence(trace) if "final_answer(" in f.evidence], path.stem
    assert handed_back >= 10  # 19 sub-agent answers in the development data when written


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("Goal deviation", "Goal Deviation"),
        ("Context Handling Failure", "Context Handling Failures"),
        ("Task Orchestration Error", "Task Orchestration"),
        ("Language-Only", "Language-only"),
        ("tool selection error", "Tool Selection Errors"),
        ("Something New", "Something New"),
    ],
)
def test_trail_category_spellings_normalise(written: str, canonical: str) -> None:
    assert normalise_trail_category(written) == canonical


def test_trailing_comma_and_bad_ids_are_handled(tmp_path: Path) -> None:
    from reflect_otel.errors import InputError

    traces = tmp_path / "traces"
    traces.mkdir()
    (tmp_path / "annotations").mkdir()
    good = traces / ("a" * 32 + ".json")
    good.write_text(
        '{"trace_id": "' + "a" * 32 + '", "spans": [{"span_id": "' + "b" * 16 + '", "parent_span_id": "None",'
        ' "timestamp": "2025-01-01T00:00:00Z", "duration": "PT1.5S", "span_name": "llm", "status_code": "Ok",'
        ' "span_attributes": {"openinference.span.kind": "LLM", "llm.output_messages.0.message.content": "hi"},'
        ' "child_spans": [],},]}'
    )
    (tmp_path / "annotations" / good.name).write_text(
        '{"errors": [{"category": "Goal deviation", "location": "' + "b" * 16 + '", "impact": "high"}]}'
    )
    imported = read_trail_file(good, max_bytes=10_000)
    assert imported.labels_mapped == imported.labels_total == 1
    assert imported.trace.labels[0].impact == "HIGH"
    assert imported.trace.steps[0].end_time_ns - imported.trace.steps[0].start_time_ns == 1_500_000_000
    bad = traces / "bad.json"
    bad.write_text('{"trace_id": "xyz", "spans": [{"child_spans": []}]}')
    with pytest.raises(InputError, match="32 hex digits"):
        read_trail_file(bad, max_bytes=10_000)
    with pytest.raises(InputError, match="byte limit"):
        read_trail_file(good, max_bytes=10)
