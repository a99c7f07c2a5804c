"""The HTML report: self-contained, escaped, and rendered by a real headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from reflect_otel.cli import main
from reflect_otel.exporters.duckdb_store import DuckDBStore
from reflect_otel.exporters.report import render_report
from tests.test_pipeline import five_step_trace
from tests.test_store import _record


def _trace_with_script():  # type: ignore[no-untyped-def]
    trace = five_step_trace()
    hostile = trace.steps[0].model_copy(update={"tool_result": "<script>alert('x')</script><img src=http://evil/>"})
    return trace.model_copy(update={"steps": (hostile, *trace.steps[1:])})


def test_report_shows_the_attribution_and_escapes_trace_content() -> None:
    record = _record()
    page = render_report(_trace_with_script(), record)
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "http://evil" in page and "<img" not in page  # shown as text, never loaded
    assert 'class="badge verified"' in page and 'id="step-2"' in page
    assert 'class="step decisive" id="step-2"' in page
    assert "Original continuation" in page and "Corrected continuation" in page and "The answer is 42" in page
    assert "IMPORTANT - CORRECTION CONTEXT" in page and "<th>stage</th>" in page
    assert "default-src 'none'" in page  # nothing external may load
    assert "https://" not in page.replace("http://evil/", "")


def test_report_command_and_chromium_screenshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s.duckdb"
    record = _record()
    with DuckDBStore(store) as s:
        s.write_trace(_trace_with_script())
        s.write_record(record)
    out = tmp_path / "report.html"
    assert main(["report", record.trace_id[:12], "-o", str(out), "--store", str(store)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", "ffff", "-o", str(out), "--store", str(store)]) == 2
    assert "no trace 'ffff'" in capsys.readouterr().err

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (apt-get install chromium); .ci/run installs it")
        pytest.skip("chromium is not installed")
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            out.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_an_unverified_report_shows_each_replay_tried() -> None:
    from reflect_otel.attribution.pipeline import ReflectPipeline
    from reflect_otel.config import ReflectConfig
    from reflect_otel.flagging.verifiers import OracleVerifier
    from reflect_otel.testing import ScriptedReplayAdapter
    from reflect_otel.testing.examples import EXPECTED, scripted_auditor

    trace = five_step_trace().model_copy(update={"final_answer": "The answer is <b>41</b>"})
    stubborn = ScriptedReplayAdapter(  # redoes its step its own way, and answers as the run did
        lambda t, point, injection: [
            {"tool": "multiply", "args": {"a": 6, "b": 7}, "result": "42"},
            {"reasoning": "The answer is <b>41</b>", "is_final_answer": True},
        ],
        deterministic=True,
    )
    pipeline = ReflectPipeline(scripted_auditor(localize=[3]), verifier=OracleVerifier(), config=ReflectConfig())
    record = pipeline.attribute(trace, expected=EXPECTED, replay=stubborn)
    assert record.status.value == "unverified" and len(record.replays) >= 2
    page = render_report(trace, record)
    assert "<h2>Replays tried</h2>" in page and "Corrected continuation" not in page
    assert (
        "steps 1..2 kept, step 3 redone &rarr; answered <b>The answer is &lt;b&gt;41&lt;/b&gt;</b> (still wrong)"
        in page
    )
    assert page.count("<details>") == len(record.replays)
    controls = [a for a in record.replays if a.arm.value == "control"]
    assert page.count("<b>Control:</b> the same prefix, no intervention") == len(controls)
    guided = [a for a in record.replays if a.injection]
    assert guided and page.count("IMPORTANT - CORRECTION CONTEXT") == len(guided)
    assert (
        f"Replay fidelity:</b> replays of this agent reproduced its run {len(controls)} of {len(controls)} times"
        in page
    )


def test_report_of_an_action_shows_what_proved_it() -> None:
    from tests.test_corrections import GOOD_CALL, _attribute, _auditor, _table_agent, filter_trace

    record = _attribute(_auditor(GOOD_CALL), _table_agent())
    page = render_report(filter_trace(), record)
    assert "What proved it:</b> a correction from <b>evidence:listed_values</b>, executed in place of the step" in page
    original = "filter_rows({&quot;column&quot;: &quot;Position&quot;, &quot;op&quot;: &quot;=&quot;, "
    assert f"<pre>{original}&quot;table&quot;: &quot;t0&quot;, &quot;value&quot;: &quot;1&quot;}})</pre>" in page
    assert "&rArr; filter_rows(" in page and "&quot;value&quot;: &quot;1st&quot;" in page
    assert "<h2>Corrections tried</h2>" in page and "<td>action</td>" in page
    assert "intervention flipped 1 of 1, control 0 of 1, sensitivity 0 of 1" in page
    # the proof's three arms from the same prefix, beside the run's own continuation, each with its answer
    assert page.count("<p><b>Answer:</b> No 1st place finishes found.</p>") == 3  # the run, the control, sensitivity
    assert "<h2>Control (no intervention)</h2>" in page and "<p><b>Answer:</b> Bangkok</p>" in page
    assert "<h2>Sensitivity (changed in text only)</h2>" in page
    assert "changed in text only (its arguments in reverse order), the sensitivity arm" in page
    # the run has no other step before its answer: the step decided the answer; its localization is untested
    assert "Step 1 decided the wrong answer" in page and "localization untested" in page
    assert "Injected correction" not in page  # an action injects no text


def test_the_diagnosis_adds_no_second_full_stop_after_an_answer_that_ends_a_sentence() -> None:
    from reflect_otel.exporters.report import render_report
    from reflect_otel.testing.examples import verified_attribution

    trace, record = verified_attribution()
    html = render_report(trace, record.model_copy(update={"original_answer": "No rows found."}))
    assert "The agent answered <b>No rows found.</b> Replayed" in html
    html = render_report(trace, record.model_copy(update={"original_answer": "Paris"}))
    assert "The agent answered <b>Paris</b>. Replayed" in html
