"""Evaluation on public benchmarks: loaders, the resumable runner, metrics with standard errors, comparisons."""

from __future__ import annotations

from benchmarks.evaluation.loaders import BENCHMARKS, EvalItem, load_benchmark
from benchmarks.evaluation.metrics import Prediction, compute_metrics

__all__ = ["BENCHMARKS", "EvalItem", "Prediction", "compute_metrics", "load_benchmark"]
