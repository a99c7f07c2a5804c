"""Online flagging of the demo agent's live runs, as an application gets it: the LangGraph table-QA agent runs under
``reflect_otel.observe`` with the configured model (the local server by default), in the proxy regime (no expected
answer is given to reflect-otel), and the plan-anchored proxy verifier with the evidence checks judges each run.
Attribution is switched off by a zero hourly token budget, so only flagging is measured (flagged runs are stored
and counted, not attributed).

Per run it prints the answer, whether it was right (judged here against the question's answer, which reflect-otel
never saw: yes, no, or undecided when it names several values without saying which it asserts, never counted
wrong), whether the run ended without an answer, and the stored verdict: its label, confidence and the start of its
reasoning. ``--max-steps`` is the agent's tool-call limit (the demo's default is 6); a smaller one makes
runs stop at the limit, the failure the evidence checks flag without an audit call.

    python -m benchmarks.online_flagging --questions nt-1,nt-13,nt-14 --max-steps 6
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import reflect_otel
from benchmarks._common import add_smoke_option, scripted_llm, smoke_sizes
from reflect_otel.demo.table_agent import TableQAAgent
from reflect_otel.demo.wtq import load_questions
from reflect_otel.exporters.duckdb_store import connect_read_only
from reflect_otel.flagging.judge import judge_answer
from reflect_otel.llm.factory import make_llm

_RIGHT = {True: "yes", False: "no", None: "undecided"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", help="comma-separated bundled question ids, e.g. nt-1,nt-13")
    parser.add_argument("--max-steps", type=int, default=6, help="the agent's tool-call limit (default 6)")
    parser.add_argument("--store", type=Path, help="the DuckDB store to write (default: a temporary file)")
    add_smoke_option(parser)
    args = parser.parse_args(argv)
    smoke_sizes(args, questions="nt-1,nt-13", max_steps=2)  # the agent and the auditor scripted
    if not args.questions:
        parser.error("give --questions (or --smoke)")
    bundled = {q.id: q for q in load_questions()}
    ids = [i.strip() for i in args.questions.split(",") if i.strip()]
    unknown = [i for i in ids if i not in bundled]
    if unknown or args.max_steps < 1:
        parser.error(f"no bundled question {', '.join(unknown)}" if unknown else "--max-steps must be >= 1")
    folder = Path(tempfile.mkdtemp(prefix="reflect-online-flagging-"))
    store = args.store or folder / "flagging.duckdb"
    llm = scripted_llm() if args.smoke else make_llm()
    # the proxy regime, flagging only: an hourly budget of 0 tokens stores and counts flagged runs unattributed
    runtime = reflect_otel.configure(store=str(store), llm=llm, proxy=True, max_tokens_per_hour=0)
    runs: list[tuple[str, str, bool | None, float]] = []  # right: None when the answer was undecided
    try:
        for number, qid in enumerate(ids, start=1):
            question = bundled[qid]
            agent = TableQAAgent(question, llm, max_steps=args.max_steps)
            run = reflect_otel.observe(name="table_qa")(lambda _text, agent=agent, qid=qid: agent.answer(f"flag-{qid}"))
            started = time.perf_counter()
            answer = run(question.question)
            judged = judge_answer(answer, question.expected, question=question.question)
            runs.append((qid, answer, judged.correct, time.perf_counter() - started))
            print(
                f"[{number}/{len(ids)}] {qid}: answered {answer!r} ({runs[-1][3]:.0f} s)", file=sys.stderr, flush=True
            )
            while not runtime.drain(timeout_s=5):  # one model: the verdict before the next run
                pass
    finally:
        reflect_otel.shutdown()
    with connect_read_only(store) as db:
        verdicts = db.execute(
            "SELECT t.question, v.label, v.confidence, v.reasoning FROM traces t JOIN verdicts v USING (trace_id)"
        ).fetchall()
    by_question = {question: (label, confidence, reasoning) for question, label, confidence, reasoning in verdicts}
    print(f"model {llm.model_name}, max steps {args.max_steps}")
    print("| question | answer | right | no answer | verdict | confidence | reasoning (start) |")
    print("|---|---|---|---|---|---|---|")
    flagged_wrong = wrong = flagged = 0
    for qid, answer, right, _seconds in runs:
        label, confidence, reasoning = by_question.get(bundled[qid].question, ("(no verdict stored)", None, ""))
        high = label == "HIGH_ERROR_SIGNAL"
        wrong += right is False
        flagged += high
        flagged_wrong += high and right is False
        shown = " ".join(str(reasoning).split())[:90].replace("|", "/")
        print(
            f"| {qid} | {answer[:40]!r} | {_RIGHT[right]} | {'yes' if not answer else 'no'} | {label} | "
            f"{'-' if confidence is None else f'{confidence:.2f}'} | {shown} |"
        )
    print(f"flagged {flagged} of {len(runs)} runs; {flagged_wrong} of the {wrong} wrong ones")
    print(f"online_flagging_flagged={flagged}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
