"""Several evaluation runs side by side: a markdown table and an SVG chart of EM and Off-1 with error bars."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from reflect_otel.errors import InputError
from reflect_otel.evaluation.metrics import metrics_markdown
from reflect_otel.evaluation.run_config import read_json_object

__all__ = ["chart_svg", "load_runs"]


def load_runs(folders: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    runs = []
    for folder in folders:
        metrics_path, config_path = folder / "metrics.json", folder / "run_config.json"
        if not metrics_path.is_file() or not config_path.is_file():
            raise InputError(
                f"{folder}: not an evaluation run (no metrics.json / run_config.json); run 'reflect-otel eval' first"
            )
        config = read_json_object(config_path)
        runs.append((f"{config.get('benchmark')} / {config.get('method')}", read_json_object(metrics_path)))
    return runs


def compare_markdown(runs: list[tuple[str, dict[str, Any]]]) -> str:
    return metrics_markdown(runs)


def chart_svg(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """Grouped bars (EM, Off-1) per run, in percent, with one-standard-error bars. Self-contained SVG."""
    width, height, left, bottom, top = 120 + 110 * len(runs), 360, 50, 80, 30
    plot_h = height - bottom - top
    colours = {"exact_match": "#3b6fd8", "off_by_one": "#e08a2c"}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="18" font-size="13">Exact match and off-by-one (%, with standard error)</text>',
    ]
    for tick in range(0, 101, 20):
        y = top + plot_h * (1 - tick / 100)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e6ea"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>')
    for i, (label, metrics) in enumerate(runs):
        x0 = left + 20 + i * 110
        for j, key in enumerate(("exact_match", "off_by_one")):
            stat = metrics.get(key, {})
            mean, se = float(stat.get("mean") or 0.0) * 100, float(stat.get("se") or 0.0) * 100
            x, bar_h = x0 + j * 36, plot_h * mean / 100
            parts.append(
                f'<rect x="{x}" y="{top + plot_h - bar_h:.1f}" width="30" height="{bar_h:.1f}" fill="{colours[key]}"/>'
            )
            low, high = max(0.0, mean - se), min(100.0, mean + se)
            y_low, y_high = top + plot_h * (1 - low / 100), top + plot_h * (1 - high / 100)
            parts.append(f'<line x1="{x + 15}" x2="{x + 15}" y1="{y_low:.1f}" y2="{y_high:.1f}" stroke="#222"/>')
            parts.append(
                f'<text x="{x + 15}" y="{top + plot_h - bar_h - 4:.1f}" text-anchor="middle">{mean:.0f}</text>'
            )
        parts.append(f'<text x="{x0 + 33}" y="{height - bottom + 16}" text-anchor="middle">{html.escape(label)}</text>')
        parts.append(
            f'<text x="{x0 + 33}" y="{height - bottom + 30}" text-anchor="middle" fill="#666">n={metrics.get("traces", 0)}</text>'
        )
    parts.append(
        f'<rect x="{left}" y="{height - 30}" width="10" height="10" fill="{colours["exact_match"]}"/>'
        f'<text x="{left + 14}" y="{height - 21}">EM</text>'
        f'<rect x="{left + 50}" y="{height - 30}" width="10" height="10" fill="{colours["off_by_one"]}"/>'
        f'<text x="{left + 64}" y="{height - 21}">Off-1</text></svg>'
    )
    return "\n".join(parts) + "\n"
