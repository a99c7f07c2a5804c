"""Evaluation runs side by side: markdown tables and an SVG chart with error bars.

A folder given is read as what it holds: a run of ``reflect-otel eval`` on a dataset (``run_config.json`` with
``metrics.json``, or only ``results.jsonl``, whose metrics are then computed and said to be), a ``wtq-live`` run
(one row per method it applied), a folder of runs (each run one level down), or a localization benchmark's output
(``rows.jsonl`` with ``table.md``, from ``python -m benchmarks.localization``, shown as it is). Nothing is written
into the folders.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from benchmarks.evaluation.live_rows import LIVE, parse_live_row
from benchmarks.evaluation.metrics import metrics_markdown
from benchmarks.evaluation.run_config import read_json_object
from reflect_otel.errors import InputError

__all__ = ["Run", "chart_svg", "compare_markdown", "load_runs"]

Kind = Literal["dataset", "live", "localization", "pending"]


@dataclass(frozen=True, slots=True)
class Run:
    """One row (or, for a localization benchmark, one table) of the comparison."""

    label: str
    kind: Kind
    metrics: dict[str, Any]
    folder: Path
    note: str = ""
    """How the figures were had when not from the run's own metrics.json."""
    table: str = ""
    """A localization benchmark's own table (``table.md``)."""


def load_runs(folders: list[Path]) -> list[Run]:
    """Every run in ``folders`` (see the module's docstring); :class:`InputError` naming a folder that holds none."""
    runs: list[Run] = []
    for folder in folders:
        found = _runs_in(folder)
        if not found:
            raise InputError(
                f"{folder}: not an evaluation run (no run_config.json in it or in a folder inside it); write one "
                "with 'reflect-otel eval ... -o FOLDER'"
            )
        runs.extend(found)
    if len(set(run.label for run in runs)) == len(runs):
        return runs
    # the same benchmark and method twice (two seeds): every run named by its folder too
    return [Run(f"{run.folder.name}: {run.label}", *_rest(run)) for run in runs]


def _rest(run: Run) -> tuple[Kind, dict[str, Any], Path, str, str]:
    return run.kind, run.metrics, run.folder, run.note, run.table


def _runs_in(folder: Path) -> list[Run]:
    if not folder.exists():
        raise InputError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise InputError(f"{folder}: is a file; name the run's folder (the one holding run_config.json)")
    if (folder / "run_config.json").is_file():
        return _run(folder)
    if (folder / "rows.jsonl").is_file() and (folder / "table.md").is_file():
        table = (folder / "table.md").read_text(encoding="utf-8", errors="replace")
        note = "a localization benchmark's output (python -m benchmarks.localization), shown as it was written"
        return [Run(folder.name, "localization", {}, folder, note, table)]
    inside = sorted(sub for sub in folder.iterdir() if sub.is_dir() and (sub / "run_config.json").is_file())
    runs = [run for sub in inside for run in _run(sub)]
    if not runs and (folder / "README.md").is_file():  # a run written down before it started: nothing to compare yet
        return [Run(folder.name, "pending", {}, folder, "no run in it yet: its README.md says how it will be made")]
    return runs


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut by an interrupted run, as a resume reads it
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _run(folder: Path) -> list[Run]:
    config = read_json_object(folder / "run_config.json")
    metrics_path, results = folder / "metrics.json", folder / "results.jsonl"
    note = ""
    if metrics_path.is_file():
        metrics = read_json_object(metrics_path)
    elif results.is_file():
        metrics = _computed(config, _rows(results))
        note = "no metrics.json: computed now from results.jsonl, each question's last row (the folder's README may read a subset)"
    else:
        raise InputError(f"{folder}: a run with neither metrics.json nor results.jsonl; nothing to compare")
    benchmark = str(config.get("benchmark"))
    if benchmark == LIVE or isinstance(metrics.get("methods"), dict):
        methods = metrics.get("methods") or {}
        if not isinstance(methods, dict):
            raise InputError(f"{metrics_path}: 'methods' is not a JSON object")
        shared = {k: metrics.get(k) for k in ("questions", "agent_correct", "failed_runs")}
        return [
            Run(f"{LIVE} / {name}", "live", {**shared, **stats}, folder, note)
            for name, stats in methods.items()
            if isinstance(stats, dict)
        ]
    if "traces" not in metrics:
        raise InputError(f"{metrics_path}: not the metrics of 'reflect-otel eval' (no 'traces')")
    return [Run(f"{benchmark} / {config.get('method')}", "dataset", metrics, folder, note)]


def _computed(config: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    if config.get("benchmark") == LIVE:
        from benchmarks.evaluation.live_metrics import live_metrics

        latest = {str(row.get("question_id")): row for row in rows}  # a question's row is written again as each
        rows = list(latest.values())  # method finishes (and on resume): its last row holds every method's record
        methods = config.get("methods") or sorted({m for row in rows for m in row.get("methods", {})})
        return live_metrics(
            [parse_live_row(f"line {n}", row) for n, row in enumerate(rows, 1)], [str(m) for m in methods]
        )
    from benchmarks.evaluation.runner import metrics_from_rows

    return metrics_from_rows(rows)


def _stat(value: Any, *, percent: bool = True) -> str:
    if not isinstance(value, dict) or not value.get("n"):
        return "-"
    scale = 100.0 if percent else 1.0
    mean, se = value.get("mean"), value.get("se")
    if not isinstance(mean, int | float) or mean != mean:  # NaN: nothing measured
        return "-"
    spread = f" ± {se * scale:.1f}" if isinstance(se, int | float) and se == se else ""
    return f"{mean * scale:.1f}{'%' if percent else ''}{spread}"


def _live_markdown(runs: list[Run]) -> str:
    lines = [
        "| run | failed runs given | scored | flipped | verified | verified, control gave the run's answer | "
        "not attributable | tokens | seconds |",
        "|" + " --- |" * 9,
    ]
    for run in runs:
        m = run.metrics
        runs_given = m.get("runs", "-")
        scored = m.get("scored", runs_given if not isinstance(runs_given, int) else runs_given - m.get("failed", 0))
        flipped = m.get("flipped", m.get("corrected"))  # 'corrected' in runs written before controlled replay
        lines.append(
            f"| {run.label} | {runs_given} | {scored} | {_stat(flipped)} | {_stat(m.get('verified'))} | "
            f"{_stat(m.get('verified_reproducing'))} | {_stat(m.get('not_attributable'))} | "
            f"{_stat(m.get('tokens'), percent=False)} | {_stat(m.get('seconds'), percent=False)} |"
        )
    return "\n".join(lines) + "\n"


def compare_markdown(runs: list[Run]) -> str:
    """A table for the dataset runs (EM, Off-1 and the rest), one for the live runs (flipped, verified), each
    localization benchmark's own table, and below them the notes on how figures were had."""
    parts = []
    dataset = [run for run in runs if run.kind == "dataset"]
    live = [run for run in runs if run.kind == "live"]
    if dataset:
        parts.append(metrics_markdown([(run.label, run.metrics) for run in dataset]))
    if live:
        parts.append(_live_markdown(live))
    for run in runs:
        if run.kind == "localization":
            parts.append(f"{run.label}:\n\n{run.table.rstrip()}\n")
        if run.kind == "pending":
            parts.append(f"{run.label}: no figures yet\n")
    notes = sorted({f"- {run.folder}: {run.note}" for run in runs if run.note})
    if notes:
        parts.append("\n".join(notes) + "\n")
    return "\n".join(parts)


def chart_svg(runs: list[Run]) -> str:
    """Grouped bars per run, in percent, with one-standard-error bars: EM and Off-1 for the dataset runs, or, when
    none was given, flipped and verified for the live runs. Self-contained SVG."""
    dataset = [run for run in runs if run.kind == "dataset"]
    if dataset:
        shown, keys, title = dataset, (("exact_match", "EM"), ("off_by_one", "Off-1")), "Exact match and off-by-one"
    else:
        shown = [run for run in runs if run.kind == "live"]
        keys, title = (("flipped", "flipped"), ("verified", "verified")), "Failures flipped and verified"
    width, height, left, bottom, top = 120 + 110 * len(shown), 360, 50, 80, 30
    plot_h = height - bottom - top
    colours = ("#3b6fd8", "#e08a2c")
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="18" font-size="13">{title} (%, with standard error)</text>',
    ]
    for tick in range(0, 101, 20):
        y = top + plot_h * (1 - tick / 100)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e6ea"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>')
    for i, run in enumerate(shown):
        x0 = left + 20 + i * 110
        for j, (key, _) in enumerate(keys):
            stat = run.metrics.get(key) or (run.metrics.get("corrected") if key == "flipped" else None) or {}
            mean, se = _number(stat.get("mean")) * 100, _number(stat.get("se")) * 100
            x, bar_h = x0 + j * 36, plot_h * mean / 100
            parts.append(
                f'<rect x="{x}" y="{top + plot_h - bar_h:.1f}" width="30" height="{bar_h:.1f}" fill="{colours[j]}"/>'
            )
            low, high = max(0.0, mean - se), min(100.0, mean + se)
            y_low, y_high = top + plot_h * (1 - low / 100), top + plot_h * (1 - high / 100)
            parts.append(f'<line x1="{x + 15}" x2="{x + 15}" y1="{y_low:.1f}" y2="{y_high:.1f}" stroke="#222"/>')
            parts.append(
                f'<text x="{x + 15}" y="{top + plot_h - bar_h - 4:.1f}" text-anchor="middle">{mean:.0f}</text>'
            )
        count = run.metrics.get("traces", run.metrics.get("runs", 0))
        parts.append(
            f'<text x="{x0 + 33}" y="{height - bottom + 16}" text-anchor="middle">{html.escape(run.label)}</text>'
        )
        parts.append(
            f'<text x="{x0 + 33}" y="{height - bottom + 30}" text-anchor="middle" fill="#666">n={count}</text>'
        )
    (_, first), (_, second) = keys
    parts.append(
        f'<rect x="{left}" y="{height - 30}" width="10" height="10" fill="{colours[0]}"/>'
        f'<text x="{left + 14}" y="{height - 21}">{first}</text>'
        f'<rect x="{left + 70}" y="{height - 30}" width="10" height="10" fill="{colours[1]}"/>'
        f'<text x="{left + 84}" y="{height - 21}">{second}</text></svg>'
    )
    return "\n".join(parts) + "\n"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and value == value else 0.0
