"""``reflect-otel eval`` and ``eval-compare`` run the harness of a source checkout (``benchmarks/evaluation``), which
the installed package does not ship: found from the current folder or the editable install's repository, and one
line saying what to do (exit 2) where there is none."""

from __future__ import annotations

from pathlib import Path

import pytest

import reflect_otel
from benchmarks.evaluation import loaders, runner
from reflect_otel.cli import evaluate as command
from reflect_otel.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _checkout(folder: Path) -> Path:
    (folder / "benchmarks" / "evaluation").mkdir(parents=True)
    (folder / "benchmarks" / "evaluation" / "command.py").write_text("")
    (folder / "pyproject.toml").write_text("")
    return folder


def _installed_elsewhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The package as a non-editable install sees it: its files in site-packages, no checkout beside them."""
    site = tmp_path / "site-packages" / "reflect_otel"
    site.mkdir(parents=True)
    monkeypatch.setattr(reflect_otel, "__file__", str(site / "__init__.py"))


def test_the_checkout_is_found_from_the_current_folder_or_one_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed_elsewhere(monkeypatch, tmp_path)
    repo = _checkout(tmp_path / "repo")
    (repo / "docs").mkdir()
    assert command.find_checkout(repo) == repo.resolve()
    assert command.find_checkout(repo / "docs") == repo.resolve()
    assert command.find_checkout(tmp_path) is None


def test_an_editable_install_finds_its_own_repository_from_anywhere(tmp_path: Path) -> None:
    assert command.find_checkout(tmp_path) == ROOT


@pytest.mark.parametrize("argv", [["eval-compare", "runs"], ["eval", "--benchmark", "bbm", "--data", ".", "-o", "x"]])
def test_outside_a_checkout_the_command_says_what_to_do_in_one_line(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _installed_elsewhere(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "run 'reflect-otel eval' from a clone of the reflect-otel repository" in err


def test_the_commands_flags_name_the_datasets_the_harness_loads() -> None:
    assert command.DATASETS == loaders.BENCHMARKS
    assert tuple(runner.REPLAYABLE) == command.REPLAYABLE_DATASETS


def test_from_the_checkout_eval_compare_reads_a_results_folder(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["eval-compare", "benchmarks/results/wtq-live-sql-seed4917"]) == 0
    assert "wtq-live / reflect" in capsys.readouterr().out
