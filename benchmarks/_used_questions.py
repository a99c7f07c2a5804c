"""The WikiTableQuestions ids any wtq-live run folder has used (its rows' questions and its ``--exclude``), comma
separated for ``eval --exclude``: a fresh sample never repeats a question an earlier measurement or its design saw.

    python -m benchmarks._used_questions [--results benchmarks/results] [--skip FOLDER ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks._common import RESULTS


def used_questions(results: Path, skip: tuple[str, ...] = ()) -> set[str]:
    used: set[str] = set()
    for folder in sorted(results.glob("wtq-live*")):
        if folder.name in skip or not folder.is_dir():
            continue
        config = folder / "run_config.json"
        if config.is_file():
            excluded = json.loads(config.read_text()).get("exclude") or []
            excluded = excluded.split(",") if isinstance(excluded, str) else excluded  # older runs kept a string
            used |= {str(q).strip() for q in excluded if str(q).strip()}
        rows = folder / "results.jsonl"
        if rows.is_file():
            for line in rows.read_text(encoding="utf-8").splitlines():
                try:
                    used.add(str(json.loads(line)["question_id"]))
                except (ValueError, KeyError, TypeError):
                    continue  # a cut last line of a run in progress
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of run folders")
    parser.add_argument("--skip", nargs="*", default=[], help="run folders (names) not to count")
    args = parser.parse_args()
    print(",".join(sorted(used_questions(args.results, tuple(args.skip)), key=lambda q: (len(q), q))))


if __name__ == "__main__":
    main()
