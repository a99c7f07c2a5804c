"""Every recorded run in ``golden/`` rebuilds into the very trace it rebuilt into when recorded (see its README)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.collectors.otlp import decode_json_document
from reflect_otel.reading.assembly import assemble_trace

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(path.name.removesuffix(".otlp.json") for path in GOLDEN.glob("*.otlp.json"))


def rebuilt(name: str) -> dict[str, Any]:
    document = json.loads((GOLDEN / f"{name}.otlp.json").read_text(encoding="utf-8"))
    batch = decode_json_document(document)
    assert not batch.rejected
    return assemble_trace(batch.spans, collector="golden").model_dump(mode="json")


def test_there_are_golden_runs() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", CASES)
def test_a_recorded_run_rebuilds_into_its_golden_trace(name: str) -> None:
    expected = json.loads((GOLDEN / f"{name}.trace.json").read_text(encoding="utf-8"))
    assert rebuilt(name) == expected


if __name__ == "__main__":  # python -m tests.assembly.test_golden --update: after a change meant to alter traces
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.assembly.test_golden --update")
    for case in CASES:
        text = json.dumps(rebuilt(case), indent=1, ensure_ascii=False) + "\n"
        (GOLDEN / f"{case}.trace.json").write_text(text, encoding="utf-8")
