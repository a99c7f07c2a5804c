"""``benchmarks/localization.py`` runs every method on a real development trace with a scripted model (the measured
run uses the local model; this keeps the script working as the package changes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reflect_otel.config import ReflectConfig
from reflect_otel.testing import ScriptedLLM, ScriptedRequest

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.mark.skipif(not (DATA / "trail").is_dir(), reason="the development data is not beside the repository")
def test_every_method_gives_a_step_on_a_trail_trace(tmp_path: Path) -> None:
    from benchmarks import localization

    def respond(request: ScriptedRequest) -> Any:
        if request.stage == "aao":
            return {
                "error_step": 2,
                "responsible_agent": None,
                "reason": "r",
                "error_type": "tool_error",
                "confidence": 0.5,
            }
        return {"error_step": 1, "confidence": 0.5, "reasoning": "r", "what_should_have_been_done": "x"}

    (item,) = localization._sample("trail-gaia", DATA, 1, 0)
    out = localization.predictions(item, ScriptedLLM(respond=respond), ReflectConfig())
    assert set(out) == set(localization.METHODS)
    assert (out["localize"]["predicted"], out["aao"]["predicted"]) == (1, 2)
    assert not any(r["failed"] for r in out.values())
    assert out["first-step"]["predicted"] == 1 and out["last-step"]["predicted"] == len(item.trace.steps)
