"""The allowed direction between the parts: edges and the app depend on the core, the app wires the edges, and
nothing depends on the app. Edges install under ``reflect_otel.`` only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDGES = ("collectors", "exporters", "replay_adapters")
APP = ("reflect_otel.cli", "reflect_otel.online", "reflect_otel.__main__")
"""The composition root: the command line and the decorator's runtime, which wire built-in edges by import. The
package's ``__init__`` re-exports the decorator, so it is the app too; ``from reflect_otel import x`` names the
module ``x``, not the package."""

ALLOWED = {
    "core": {"core"},
    "collectors": {"core", "collectors"},
    "exporters": {"core", "exporters"},
    "replay_adapters": {"core", "replay_adapters", "collectors"},  # the HTTP adapter decodes OTLP/JSON spans
    "app": {"core", "app", *EDGES},
}


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _part(module: str) -> str | None:
    """Which part a dotted module name belongs to; None for third-party modules."""
    parts = module.split(".")
    if parts[0] != "reflect_otel":
        return None
    if len(parts) > 1 and parts[1] in EDGES:
        return parts[1]
    if module == "reflect_otel" or any(module == app or module.startswith(app + ".") for app in APP):
        return "app"
    return "core"


def _module_of(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[0] in EDGES:
        parts = ["reflect_otel", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> list[Path]:
    return sorted(p for folder in ("reflect_otel", *EDGES) for p in (ROOT / folder).rglob("*.py"))


def test_every_import_goes_in_an_allowed_direction() -> None:
    offenders = []
    for path in _sources():
        source = _part(_module_of(path))
        assert source is not None
        for name in _imports(path):
            if name == "reflect_otel":  # ``from reflect_otel import x``: x is checked as reflect_otel.x
                continue
            target = _part(name)
            if target is not None and target not in ALLOWED[source]:
                offenders.append(f"{path.relative_to(ROOT)} ({source}) imports {name} ({target})")
    assert not offenders, offenders


def test_entry_points_only_for_backends_chosen_by_name() -> None:
    import tomllib

    from reflect_otel import plugins

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = set(project.get("entry-points", {}))
    assert groups <= {
        plugins.LLM_BACKENDS,
        plugins.REPLAY_ADAPTERS,
        plugins.RECORD_EXPORTERS,
        plugins.STORES,
    }
    # no built-in command is registered by name: the CLI imports them; and no correction rule: an installed one runs
    # on every user's traces, so the demo agent's own rule is given to its replay adapter by the demo's wiring
    assert plugins.COMMANDS not in groups and plugins.CORRECTION_RULES not in groups


def test_edges_import_as_reflect_otel_subpackages() -> None:
    import reflect_otel.collectors
    import reflect_otel.exporters
    import reflect_otel.replay_adapters

    for module in (reflect_otel.collectors, reflect_otel.exporters, reflect_otel.replay_adapters):
        assert module.__file__ is not None
        assert Path(module.__file__).resolve().parent.name in EDGES
    for path in _sources():
        for name in _imports(path):
            assert name.split(".")[0] not in EDGES, f"{path} imports top-level {name}"


def test_benchmarks_and_the_package_never_import_tests() -> None:
    for path in [*_sources(), *sorted((ROOT / "benchmarks").rglob("*.py"))]:
        for name in _imports(path):
            assert name.split(".")[0] != "tests", f"{path} imports {name}"


HARNESS_LOOKUP = ROOT / "reflect_otel" / "cli" / "evaluate.py"
"""The one place the package names the checkout's evaluation harness: ``reflect-otel eval`` finds the checkout and
imports ``benchmarks.evaluation`` from it by name at run time (the harness is not installed with the package)."""


def test_the_package_never_imports_benchmarks_but_for_the_eval_commands_lookup() -> None:
    import tomllib

    for path in _sources():
        for name in _imports(path):
            assert name.split(".")[0] != "benchmarks", f"{path} imports {name}"
    naming = [path for path in _sources() if "benchmarks.evaluation" in path.read_text(encoding="utf-8")]
    assert naming == [HARNESS_LOOKUP]
    assert not (ROOT / "reflect_otel" / "evaluation").exists()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    assert not any(package.split(".")[0] == "benchmarks" or "evaluation" in package for package in packages)


DATASET_SIDE = ("reflect_otel.datasets", "reflect_otel.demo")
THE_APP = ("reflect_otel.cli",)
"""The command line: it wires the datasets' readers, verifier and format names into the core's functions."""


def test_only_the_app_and_the_dataset_side_import_a_dataset() -> None:
    """No dataset reader, verifier or demo agent in the core or the edges (the attribution pipeline, the trace file
    reader, collectors, exporters, replay adapters): what they do for one dataset's agent they must do for any
    agent. The app passes a dataset's parts in (the evaluation harness in ``benchmarks/`` may import them too)."""
    offenders = []
    for path in _sources():
        module = _module_of(path)
        if any(module == side or module.startswith(side + ".") for side in (*DATASET_SIDE, *THE_APP)):
            continue
        offenders += [
            f"{module} imports {name}"
            for name in _imports(path)
            if any(name == side or name.startswith(side + ".") for side in DATASET_SIDE)
        ]
    assert not offenders, offenders


def test_no_value_of_the_bundled_questions_is_written_in_the_package_outside_the_demo() -> None:
    """Issue 44: nothing of one dataset in the core. The bundled questions' answers that name things (a capital
    letter), the value nt-1's filter was fixed to and its table's own column names appear only under
    ``reflect_otel/demo/`` (the demo agent and its rules) and in tests, not in code, prompts or docstrings."""
    import csv
    import re

    data = ROOT / "reflect_otel" / "demo" / "data" / "wtq"
    with (data / "questions.tsv").open(encoding="utf-8") as file:
        answers = {v for row in csv.DictReader(file, delimiter="\t") for v in row["targetValue"].split("|")}
    named = {v for v in answers if any(c.isupper() for c in v)}
    designed_on = {"1st", "Position", "Venue", "Competition", "Year"}  # nt-1's filter value, its table's columns
    assert len(named) > 20 and "Bangkok, Thailand" in named  # the sample is read
    # the same columns as a statement names them (``t.position``, any alias): lower case alone is ordinary English,
    # and ``x.year`` is a date's attribute
    qualified = re.compile(r"\b[a-z]\w*\.(?:position|venue|competition)\b")
    sources = [p for p in _sources() if "demo" not in p.relative_to(ROOT).parts]
    for folder in ("reflect_otel", *EDGES):  # the edges install as reflect_otel.*: each is read
        assert any(p.is_relative_to(ROOT / folder) for p in sources), folder
    found = [
        f"{path.relative_to(ROOT)}: {value!r}"
        for path in sources
        for text in [path.read_text(encoding="utf-8")]
        for value in [
            *(v for v in sorted(named | designed_on) if re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", text)),
            *qualified.findall(text),
        ]
    ]
    assert qualified.findall("``results.position`` names it") and not qualified.findall("parsed.year")
    assert found == []
