"""Entry points as pip installs them: a tiny distribution (a module and its ``.dist-info`` with
``entry_points.txt``) in a folder put on ``sys.path``. A plugin that raises anything while loading is skipped with a
warning naming it, its package and the fix; the built-in plugins and the tool go on."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reflect_otel import plugins
from reflect_otel.replay import find_replay_adapter
from reflect_otel.replay_adapters.reasoning import ReasoningReplayAdapter
from reflect_otel.testing import ScriptedLLM, make_trace


def _install(folder: Path, module: str, source: str, entry_points: str) -> None:
    """Write ``module`` and the ``.dist-info`` of a distribution ``broken-plugins`` declaring ``entry_points``."""
    (folder / f"{module}.py").write_text(source, encoding="utf-8")
    info = folder / "broken_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugins\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")


@pytest.fixture
def broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A replay adapter and a command whose module raises at import (not an ImportError: a plugin's own bug)."""
    _install(
        tmp_path,
        "broken_plugin_module",
        'raise RuntimeError("the plugin cannot start: no config")\n',
        "[reflect_otel.replay_adapters]\n"
        "a_broken = broken_plugin_module:factory\n"
        "[reflect_otel.commands]\n"
        "broken-command = broken_plugin_module:register\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_warned", set(), raising=False)  # each test sees the warning once
    return tmp_path


def test_a_replay_adapter_that_raises_while_loading_is_skipped_and_named(
    broken: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert "a_broken" in plugins.names(plugins.REPLAY_ADAPTERS)  # installed, first by name
    trace = make_trace("What is 2 + 3 * 4?", [{"reasoning": "2 + 3 = 5."}, {"reasoning": "So the answer is 20"}])
    with caplog.at_level(logging.WARNING, logger="reflect_otel.plugins"):
        adapter = find_replay_adapter(trace, ScriptedLLM())
        again = find_replay_adapter(trace, ScriptedLLM())
    assert isinstance(adapter, ReasoningReplayAdapter) and isinstance(again, ReasoningReplayAdapter)  # the others go on
    (warning,) = [r.getMessage() for r in caplog.records]  # once per process, not once per trace
    assert warning == (
        "replay adapter plugin 'a_broken' (broken_plugin_module:factory) of package 'broken-plugins' could not be "
        "loaded (RuntimeError: the plugin cannot start: no config); skipped. To use it, fix it, or uninstall it: "
        "pip uninstall broken-plugins"
    )


def test_a_command_that_raises_while_loading_leaves_the_cli_working(broken: Path) -> None:
    """The command line as a user runs it, the broken distribution on its path: help works, the command is listed
    as unavailable with the reason, and the warning on stderr says the fix."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "reflect_otel", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "broken-command" in done.stdout and "(unavailable: command plugin 'broken-command'" in done.stdout
    assert "RuntimeError: the plugin cannot start: no config" in done.stderr
    assert "pip uninstall broken-plugins" in done.stderr
