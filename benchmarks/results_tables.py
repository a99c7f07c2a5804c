"""The tables of a measurement in progress, from the rows its runs have written so far (``metrics.json`` is written
only when a run ends): the wtq-live methods on the failed runs all of them have done, and the BIG-Bench-Mistake methods both on each
one's own traces and on the traces every one of them has done (the same sample, for a fair comparison while the
runs are at different counts). No model is called. Last line: ``common_traces=N``. Under the wtq-live table, each
method's seconds over the runs measured alone, where the folder has a ``contention.tsv`` (the windows when anything
else ran on the machine; format in ``benchmarks/_contention.py``), then what each evidence rule did for each method
(fired / tried / verified). The results files are only read, never mended, so it may run beside the measurement
writing them.

    python -m benchmarks.results_tables --wtq benchmarks/results/wtq-live-six-methods-seed24-t0.2 \\
        --bbm benchmarks/results/bbm-qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks import _contention as contention
from benchmarks._common import RESULTS, add_smoke_option
from benchmarks.evaluation.live_metrics import live_metrics
from benchmarks.evaluation.live_rows import parse_live_row
from benchmarks.evaluation.live_table import live_metrics_markdown
from benchmarks.evaluation.metrics import metrics_markdown
from benchmarks.evaluation.run_config import code_line
from benchmarks.evaluation.runner import em_by_status_line, metrics_from_rows, read_done
from reflect_otel.attribution.corrections import RULES


def wtq_table(folder: Path) -> str:
    """The failed runs every method has attributed (a run in progress has some methods only)."""
    config = json.loads((folder / "run_config.json").read_text())
    methods = config["methods"]
    rows = [
        row
        for row in read_done(folder / "results.jsonl", key="question_id", mend=False).values()
        if row["correct"] is not False or set(methods) <= set(row["methods"])  # right and undecided runs count too
    ]
    metrics = live_metrics([parse_live_row(str(row["question_id"]), row) for row in rows], methods)
    table = live_metrics_markdown(metrics, config["model"], code=code_line(config))
    rules = evidence_rule_table([r for r in rows if r["correct"] is False], methods)
    return f"{table}\n{_seconds_alone(folder, rows, methods)}\n{rules}"


def _seconds_alone(folder: Path, rows: list[dict[str, Any]], methods: list[str]) -> str:
    windows_file = folder / contention.FILE
    if not windows_file.is_file():
        return f"No {contention.FILE} in the folder: seconds not checked against contention windows.\n"
    try:
        windows = contention.read_windows(windows_file)
    except contention.ContentionFileError as error:  # the table still stands; only the seconds alone are missing
        return f"Seconds measured alone not given: {error}\n"
    return (
        f"Seconds per scored failed run measured alone (the runs overlapping none of the {len(windows)} "
        f"windows of {contention.FILE}, when anything else ran on the machine):\n"
        f"{contention.seconds_alone(rows, methods, windows)}\n"
    )


def _rule_counts(record: dict[str, Any], rule: str) -> tuple[bool, bool, bool]:
    """Whether a record's corrections hold one of source ``evidence:<rule>`` (fired), one not refused that was
    replayed (tried), and whether the record is verified by that rule's correction (verified)."""
    source = f"evidence:{rule}"
    own = [c for c in record.get("corrections") or [] if c.get("source") == source]
    tried = any(not c.get("refused") and (c.get("replays") or 0) > 0 for c in own)
    correction = (record.get("intervention") or {}).get("correction") or {}
    verified = record.get("status") == "verified" and correction.get("source") == source
    return bool(own), tried, verified


def evidence_rule_table(failed: list[dict[str, Any]], methods: list[str]) -> str:
    """Per evidence rule and method, over the failed runs given: on how many failures the rule proposed a correction
    (fired: one of source ``evidence:<rule>`` in the record's corrections, refused or not, counted once per failure),
    tried one (not refused, and replayed), and verified the record (verified, its intervention that rule's
    correction). The built-in rules first, in their order, then any other rule the records name."""
    records = {m: [(r["methods"].get(m) or {}).get("record") or {} for r in failed] for m in methods}
    named = {
        c["source"].removeprefix("evidence:")
        for found in records.values()
        for record in found
        for c in record.get("corrections") or []
        if str(c.get("source", "")).startswith("evidence:")
    }
    built_in = [rule.__name__ for rule in RULES]
    lines = [
        f"Evidence rules over the {len(failed)} failed runs, fired / tried / verified (failures where the rule "
        "proposed a correction, refused or not / replayed one / verified the record with it):",
        "",
        "| rule | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for rule in [*built_in, *sorted(named - set(built_in))]:
        cells = []
        for method in methods:
            counts = [_rule_counts(record, rule) for record in records[method]]
            cells.append(" / ".join(str(sum(c[i] for c in counts)) for i in range(3)))
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bbm_tables(folder: Path) -> tuple[str, int]:
    """The table on each method's own rows, then on the traces all methods have; and that common count."""
    runs = {
        method.name: read_done(method / "results.jsonl", mend=False)
        for method in sorted(p for p in folder.iterdir() if (p / "results.jsonl").is_file())
    }
    common = set.intersection(*(set(rows) for rows in runs.values())) if runs else set()
    own = metrics_markdown([(name, metrics_from_rows(list(rows.values()))) for name, rows in runs.items()])
    shared = metrics_markdown(
        [(name, metrics_from_rows([r for t, r in rows.items() if t in common])) for name, rows in runs.items()]
    )
    by_status = "".join(
        f"- {name}: {em_by_status_line(metrics_from_rows(list(rows.values()))['exact_match_by_status'])}\n"
        + (f"  {by_round}\n" if (by_round := localization_by_round(list(rows.values()))) else "")
        for name, rows in runs.items()
    )
    return (
        f"Each method's own traces:\n\n{own}\n{by_status}\nThe {len(common)} traces every method has done:\n\n{shared}",
        len(common),
    )


def localization_by_round(rows: list[dict[str, Any]]) -> str:
    """EM of each diagnosis round's localization over the records not verified (unverified or not attributable) that
    localized in two or more rounds, beside the record's: an unverified record names its last round's step, and the paper's table of fallback
    records uses the first round's ("Stage-1 hypothesis only"). Empty for a method with one round."""
    unverified = [
        r
        for r in rows
        if r.get("status") != "verified"
        and r.get("gold")
        and len((r.get("record") or {}).get("localizations") or []) > 1
    ]
    if not unverified:
        return ""

    def hits(pick: Any) -> int:
        return sum(1 for r in unverified if pick(r) in set(r["gold"]))

    first = hits(lambda r: r["record"]["localizations"][0].get("step_index"))
    last = hits(lambda r: r["record"]["localizations"][-1].get("step_index"))
    named = hits(lambda r: r.get("predicted"))
    n = len(unverified)
    return (
        f"records not verified (unverified or not attributable) with two or more rounds ({n}): the step named matches gold in {named}, round 1's "
        f"localization in {first}, the last round's in {last}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wtq", type=Path, help="a wtq-live run folder")
    parser.add_argument("--bbm", type=Path, help="a folder of BIG-Bench-Mistake runs, one subfolder per method")
    add_smoke_option(parser)
    args = parser.parse_args()
    if args.smoke:  # the measured runs kept in the repository
        args.wtq = RESULTS / "wtq-live-six-methods-seed24-t0.2"
        args.bbm = RESULTS / "bbm-qwen2.5-coder-1.5b"
    if args.wtq is None and args.bbm is None:
        parser.error("give --wtq, --bbm or both")
    if args.wtq is not None:
        print(wtq_table(args.wtq))
    if args.bbm is not None:
        text, common = bbm_tables(args.bbm)
        print(text)
        print(f"common_traces={common}")


if __name__ == "__main__":
    main()
