"""Which labelled runs the judge's answer extraction changes: each run of an ``eval --benchmark wtq-live`` folder
judged again by :func:`reflect_otel.flagging.judge.judge_answer` (right / wrong / undecided) beside the label its row was
written with (``correct``), for reading every changed run by hand. No model is called; the results files are only
read.

Per folder: the runs (the last row of a question wins), the count of each change (wrong->right, wrong->undecided,
right->wrong, right->undecided, and any other), the judgement totals before and after, then each changed run:
question id, question, expected, answer, old, new, and how the value was read.

    python -m benchmarks.answer_extraction_check benchmarks/results/wtq-live-runs-seed2475 \\
        benchmarks/results/wtq-live-controlled-seed48
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import add_smoke_option
from benchmarks.evaluation.live import RESULTS
from benchmarks.evaluation.runner import read_done
from reflect_otel.flagging.judge import Judgement, judge_answer

_OLD = {True: "right", False: "wrong", None: "undecided"}
CHANGES = ("wrong->right", "wrong->undecided", "right->wrong", "right->undecided")


@dataclass(frozen=True, slots=True)
class Rejudged:
    """One run: its row, the label the row was written with, and the judgement now."""

    row: dict[str, Any]
    old: str
    judgement: Judgement

    @property
    def new(self) -> str:
        return self.judgement.outcome.value

    @property
    def change(self) -> str | None:
        return None if self.old == self.new else f"{self.old}->{self.new}"


def rejudge(folder: Path) -> list[Rejudged]:
    """Each run of ``folder``'s results file (the last row of a question), judged again."""
    rows = read_done(folder / RESULTS, key="question_id", mend=False)
    return [
        Rejudged(
            row,
            _OLD[row.get("correct")],
            judge_answer(str(row.get("answer") or ""), str(row["expected"]), question=str(row.get("question") or "")),
        )
        for row in rows.values()
    ]


def report(folder: Path, runs: list[Rejudged]) -> str:
    """The folder's counts and its changed runs, as text."""
    changes = Counter(r.change for r in runs if r.change)
    before = Counter(r.old for r in runs)
    after = Counter(r.new for r in runs)
    totals = "; ".join(
        f"{name} {before[name]} -> {after[name]}"
        for name in ("right", "wrong", "undecided")
        if before[name] or after[name]
    )
    lines = [
        f"## {folder}: {len(runs)} runs; {sum(changes.values())} change judgement",
        "  "
        + ", ".join(f"{name} {changes[name]}" for name in CHANGES)
        + "".join(f", {name} {count}" for name, count in changes.items() if name not in CHANGES),
        f"  judged (as written -> now): {totals}",
    ]
    for run in runs:
        if run.change is None:
            continue
        row, judged = run.row, run.judgement
        asserted = repr(judged.value) if judged.value is not None else "candidates " + repr(list(judged.candidates))
        lines += [
            f"- {row['question_id']}: {row.get('question')!r}",
            f"    expected {row['expected']!r}; answer {row.get('answer')!r}",
            f"    {run.old} -> {run.new}: asserts {asserted} ({judged.how})",
        ]
    return "\n".join(lines)


_SMOKE_ROWS = (
    {"question_id": "nt-a", "question": "how many laps did he drive?", "expected": "22", "answer": "22 laps",
     "correct": False},
    {"question_id": "nt-b", "question": "which year came first?", "expected": "2008", "answer": "either 2004 or 2008",
     "correct": False},
    {"question_id": "nt-c", "question": "who won?", "expected": "Zembla", "answer": "Zembla", "correct": True},
)  # fmt: skip


def _smoke_folder() -> Path:
    """A folder of three made-up rows (no measurement): one right in substance, one undecided, one right."""
    folder = Path(tempfile.mkdtemp(prefix="answer-extraction-smoke-"))
    (folder / RESULTS).write_text("".join(json.dumps(row) + "\n" for row in _SMOKE_ROWS))
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", type=Path, help="wtq-live results folders (each with results.jsonl)")
    add_smoke_option(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.folders = [_smoke_folder()]
    if not args.folders:
        parser.error("name at least one results folder (or --smoke)")
    missing = [str(f) for f in args.folders if not (f / RESULTS).is_file()]
    if missing:
        parser.error(f"no {RESULTS} in {', '.join(missing)}")
    rejudged = {folder: rejudge(folder) for folder in args.folders}
    print("\n\n".join(report(folder, runs) for folder, runs in rejudged.items()))
    changed = sum(1 for runs in rejudged.values() for run in runs if run.old != run.new)
    print(f"changed={changed}")  # the figure a smoke run checks the script by
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
