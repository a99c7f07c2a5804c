"""The core never imports an edge package; edges install under ``reflect_otel.`` only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDGES = ("collectors", "exporters", "replay_adapters")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_core_imports_no_edge_package() -> None:
    offenders = []
    for path in sorted((ROOT / "reflect_otel").rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] in EDGES or (parts[0] == "reflect_otel" and len(parts) > 1 and parts[1] in EDGES):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def test_edges_import_as_reflect_otel_subpackages() -> None:
    import reflect_otel.collectors
    import reflect_otel.exporters
    import reflect_otel.replay_adapters

    for module in (reflect_otel.collectors, reflect_otel.exporters, reflect_otel.replay_adapters):
        assert module.__file__ is not None
        assert Path(module.__file__).resolve().parent.name in EDGES
    for path in sorted(ROOT.glob("*/**/*.py")):
        if path.parts[len(ROOT.parts)] in EDGES:
            for name in _imports(path):
                assert name.split(".")[0] not in EDGES, f"{path} imports top-level {name}"
