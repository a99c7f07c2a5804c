"""Every TRAIL trace of the development data assembles, and its annotations map to steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflect_otel.datasets.trail import normalise_trail_category, read_trail_file
from reflect_otel.trace import StepKind


def _trace_files(shared_data: Path) -> list[Path]:
    files = sorted((shared_data / "trail").glob("*/traces/*.json"))
    if not files:
        pytest.skip("no TRAIL traces in shared data")
    return files


def test_every_trail_trace_assembles_and_labels_map(shared_data: Path) -> None:
    total = mapped = 0
    for path in _trace_files(shared_data):
        imported = read_trail_file(path, max_bytes=256 * 1024 * 1024)
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
