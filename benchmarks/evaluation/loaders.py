"""Benchmarks as :class:`EvalItem` s: a failing trace, its gold error steps (1-based) and what is known about it.

* ``bbm``: BIG-Bench Mistake; ``mistake_index`` is 0-based; failing = ``answer != target``.
* ``trail-gaia`` / ``trail-swe``: TRAIL; gold = every annotated error step; also the earliest error and the
  earliest HIGH-impact error. TRAIL has no gold answer: attribution is localization-only.
* ``who-and-when``: Who&When; ``mistake_step`` is a 0-based index into ``history`` (as a string), one step per
  history message.

Only failing traces with at least one gold step are returned.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from reflect_otel.datasets import read_bbm, read_trail_file, read_who_and_when
from reflect_otel.errors import InputError
from reflect_otel.trace import StructuredTrace

__all__ = ["BENCHMARKS", "EvalItem", "load_benchmark"]

BENCHMARKS = ("bbm", "trail-gaia", "trail-swe", "who-and-when")
MAX_FILE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class EvalItem:
    benchmark: str
    trace: StructuredTrace
    expected: str | None
    gold_steps: frozenset[int]
    earliest_high: int | None = None
    domain_context: str = ""
    descriptions: tuple[str, ...] = ()

    @property
    def earliest(self) -> int:
        return min(self.gold_steps)


def _find(data: Path, *names: str) -> Path:
    for name in names:
        candidate = data / name
        if candidate.is_dir():
            return candidate
    if data.is_dir():
        return data
    raise InputError(f"{data}: no such folder; pass --data pointing at the dataset folder (e.g. ../shared/data)")


def _bbm(data: Path) -> Iterator[EvalItem]:
    from reflect_otel.datasets.bbm import BBMVerifier

    folder = _find(data, "bbm")
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise InputError(f"{folder}: no BIG-Bench-Mistake *.jsonl files")
    verifier = BBMVerifier()
    for path in files:
        for item in read_bbm(path):
            gold = frozenset(label.step_index for label in item.trace.labels if label.step_index)
            if gold and not verifier.verify(item.trace, expected=item.expected).is_correct:
                yield EvalItem("bbm", item.trace, item.expected, gold, domain_context=item.domain_context)


def _trail(data: Path, split: str, name: str) -> Iterator[EvalItem]:
    folder = _find(data, f"trail/{split}", split) / "traces"
    if not folder.is_dir():
        raise InputError(f"{folder}: no TRAIL traces folder")
    for path in sorted(folder.glob("*.json")):
        trace = read_trail_file(path, max_bytes=MAX_FILE_BYTES).trace
        gold = frozenset(label.step_index for label in trace.labels if label.step_index)
        if not gold:
            continue
        high = [label.step_index for label in trace.labels if label.step_index and label.impact == "HIGH"]
        descriptions = tuple(label.description for label in trace.labels if label.description)
        yield EvalItem(name, trace, None, gold, earliest_high=min(high) if high else None, descriptions=descriptions)


def _who_and_when(data: Path) -> Iterator[EvalItem]:
    for log in read_who_and_when(_find(data, "who_and_when"), max_bytes=MAX_FILE_BYTES):
        yield EvalItem(
            "who-and-when",
            log.trace,
            log.expected,
            frozenset({log.mistake_step}),
            descriptions=(log.reason,) if log.reason else (),
        )


def load_benchmark(name: str, data: Path, *, limit: int | None = None) -> list[EvalItem]:
    """The scored items of a benchmark, in a stable order."""
    if name == "bbm":
        items = _bbm(data)
    elif name == "trail-gaia":
        items = _trail(data, "gaia", name)
    elif name == "trail-swe":
        items = _trail(data, "swe_bench", name)
    elif name == "who-and-when":
        items = _who_and_when(data)
    else:
        raise InputError(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")
    out: list[EvalItem] = []
    for item in items:
        out.append(item)
        if limit is not None and len(out) >= limit:
            break
    return out
