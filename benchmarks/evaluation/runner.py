"""The evaluation runner: one benchmark, one method, resumable (one JSON line per finished trace, appended as it
finishes; a re-run skips what is done), with ``run_config.json``, ``metrics.json`` and ``metrics.md``."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.evaluation.loaders import EvalItem, load_benchmark
from benchmarks.evaluation.metrics import Prediction, compute_metrics, metrics_markdown
from benchmarks.evaluation.rows_file import RowsFile
from benchmarks.evaluation.run_config import (
    REGIME,
    RUN_CONFIG,
    VERIFICATION,
    code_line,
    read_json_object,
    write_run_config,
)
from reflect_otel import prompts
from reflect_otel.attribution.methods import METHODS
from reflect_otel.attribution.service import AttributionService
from reflect_otel.config import ReflectConfig
from reflect_otel.datasets.bbm import BBMVerifier
from reflect_otel.errors import InputError, LLMError
from reflect_otel.flagging.verifiers import OracleVerifier
from reflect_otel.llm.base import StructuredLLM
from reflect_otel.record import AttributionMode, AttributionRecord, AttributionStatus, ReplayArm
from reflect_otel.replay import find_replay_adapter

__all__ = ["REPLAYABLE", "EvalOptions", "em_by_status_line", "read_done", "run_eval"]

RESULTS = "results.jsonl"
REPLAYABLE = {"bbm": "replay through the chain-of-thought adapter"}


@dataclass
class EvalOptions:
    benchmark: str
    method: str
    data: Path
    out: Path
    limit: int | None = None
    seed: int | None = None
    judge_explanations: bool = False
    config: ReflectConfig = field(default_factory=ReflectConfig)
    max_replays: int | None = None
    """Replays each method may run per trace (the same budget for every method compared); None: no cap."""
    exclude: tuple[str, ...] = ()
    """Trace ids never to run (the traces an earlier sample was read on), left out before the shuffle."""


def read_done(path: Path, *, key: str = "trace_id", mend: bool = True) -> dict[str, dict[str, Any]]:
    """The finished rows of a results file, by ``key``; a last line cut short by a crash is dropped, and with
    ``mend`` cut from the file so that appends stay valid (only the run that appends may mend: a reader of a run in
    progress would cut the line it is writing)."""
    if not path.is_file():
        return {}
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        raw = raw[: raw.rfind(b"\n") + 1]
        if mend:
            path.write_bytes(raw)
    done = {}
    for line in raw.decode("utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and key in row:
            done[str(row[key])] = row
    return done


def _as_json(value: Any) -> Any:
    """An option as its run configuration writes it (and a resume reads it back): paths as text, tuples as lists."""
    return str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value


def _judge(llm: StructuredLLM, record: AttributionRecord, item: EvalItem, max_chars: int) -> float | None:
    if not item.descriptions or not record.explanation or record.step_index not in item.gold_steps:
        return None
    try:
        out = llm.complete(
            prompts.explanation_similarity(record.explanation, " / ".join(item.descriptions), max_chars),
            prompts.SimilarityOutput,
            stage="judge",
        )
    except LLMError:
        return None
    return out.value.similarity


def _agent_cost(record: AttributionRecord) -> dict[str, int | None]:
    """The replayed agent's calls on our model, apart from the attributor's; None when it made none there."""
    cost = record.agent_replay_cost
    if cost is None:
        return {"agent_calls": None, "agent_tokens": None}
    return {"agent_calls": cost.calls, "agent_tokens": cost.prompt_tokens + cost.completion_tokens}


def run_eval(
    options: EvalOptions,
    llm: StructuredLLM,
    *,
    progress: Callable[[int, int, float | None, int], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) and return the metrics. ``progress(done, total, running EM or None, failed so far)``."""
    if options.method not in METHODS:
        raise InputError(f"unknown method {options.method!r}; choose one of {', '.join(METHODS)}")
    items = _items(options)
    options.out.mkdir(parents=True, exist_ok=True)
    results = options.out / RESULTS
    done = read_done(results)
    _write_dataset_config(options, llm, len(items))
    service = AttributionService(
        llm,
        METHODS[options.method],
        verifier=BBMVerifier() if options.benchmark == "bbm" else OracleVerifier(),
        config=options.config,
        # only where the benchmark's agent can be re-run; the others are localization-only
        replay_finder=find_replay_adapter if options.benchmark in REPLAYABLE else None,
        max_replays=options.max_replays,
    )
    with RowsFile(results) as out:
        for number, item in enumerate(items, start=1):
            if item.trace.trace_id in done:
                continue
            started = time.perf_counter()
            record = service.process(item.trace, expected=item.expected, domain_context=item.domain_context).record
            assert record is not None  # without triage every trace is attributed
            row = _dataset_row(options, llm, item, record, round(time.perf_counter() - started, 3))
            out.append(row)
            done[item.trace.trace_id] = row
            if progress is not None:
                scored = [r for r in done.values() if not r.get("failed")]
                em = sum(1 for r in scored if r["predicted"] in r["gold"]) / len(scored) if scored else None
                progress(number, len(items), em, len(done) - len(scored))
    return _write_dataset_metrics(options, done)


def _items(options: EvalOptions) -> list[EvalItem]:
    """The benchmark's failing traces, less those excluded, shuffled by the seed and cut at the limit."""
    items = [i for i in load_benchmark(options.benchmark, options.data) if i.trace.trace_id not in options.exclude]
    if options.seed is not None:
        random.Random(options.seed).shuffle(items)
    items = items[: options.limit] if options.limit else items
    if not items:
        raise InputError(f"no failing traces with a gold step in {options.data} for {options.benchmark}")
    return items


def _write_dataset_config(options: EvalOptions, llm: StructuredLLM, traces: int) -> None:
    config = {k: _as_json(v) for k, v in asdict(options).items() if k != "config"}
    write_run_config(
        options.out,
        config
        | {
            "reflect_config": options.config.model_dump(mode="json"),
            "model": llm.model_name,
            "traces": traces,
            # the benchmark's, not the method's: whether its records replayed is in metrics.md's mode line
            "replay_environment": REPLAYABLE.get(options.benchmark, "none: localization-only"),
            "verification": VERIFICATION,
            "regime": REGIME,
        },
        defining=(
            "benchmark", "method", "seed", "judge_explanations", "model", "reflect_config", "max_replays",
            "verification", "exclude",
        ),
        absent_means={"verification": "uncontrolled", "exclude": []},
    )  # fmt: skip


def _dataset_row(
    options: EvalOptions, llm: StructuredLLM, item: EvalItem, record: AttributionRecord, seconds: float
) -> dict[str, Any]:
    """One trace's results row: the step predicted against the gold ones, the verdict, and what it cost."""
    return {
        "trace_id": item.trace.trace_id,
        "benchmark": item.benchmark,
        "method": options.method,
        "predicted": record.step_index,
        "gold": sorted(item.gold_steps),
        "earliest_high": item.earliest_high,
        "status": record.status.value,
        "mode": record.mode.value,
        "corrected": any(a.flipped for a in record.replays if a.arm is ReplayArm.INTERVENTION),
        "fidelity": [record.fidelity.reproduced, record.fidelity.controls] if record.fidelity else None,
        "llm_calls": record.auditor_calls,
        "tokens": record.auditor_tokens,
        **_agent_cost(record),
        "seconds": seconds,
        "explanation_similarity": _judge(llm, record, item, options.config.max_field_chars)
        if options.judge_explanations
        else None,
        "errors": [e.stage for e in record.errors],
        "failed": record.failed,
        "record": record.model_dump(mode="json"),
    }


def _write_dataset_metrics(options: EvalOptions, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    metrics = metrics_from_rows(list(done.values()))
    (options.out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    label = f"{options.benchmark} / {options.method}"
    fidelity = metrics["fidelity"]
    controlled = (
        f"verified (controlled) {metrics['verified']}, not attributable {metrics['not_attributable']}; replay "
        f"fidelity: {fidelity['reproduced']} of {fidelity['controls']} control replays reproduced the run's answer"
    )
    code = code_line(read_json_object(options.out / RUN_CONFIG))
    (options.out / "metrics.md").write_text(
        f"{metrics_markdown([(label, metrics)])}\nmode: {_mode(options, done)}\n{controlled}\n"
        f"{em_by_status_line(metrics['exact_match_by_status'])}\n{code}\n"
    )
    return metrics


def em_by_status_line(by_status: dict[str, dict[str, int]]) -> str:
    """EM of the verified records against the others', with counts (issue 41: verified EM against unverified EM
    under the controlled rule); the unverified ones split by status."""

    def share(hits: int, n: int) -> str:
        return f"{hits} of {n}" + (f" ({hits / n * 100:.1f}%)" if n else "")

    verified = by_status.get(AttributionStatus.VERIFIED.value, {"hits": 0, "n": 0})
    others = {s: c for s, c in sorted(by_status.items()) if s != AttributionStatus.VERIFIED.value}
    hits, n = sum(c["hits"] for c in others.values()), sum(c["n"] for c in others.values())
    parts = "; ".join(f"{s.replace('_', ' ')} {c['hits']} of {c['n']}" for s, c in others.items())
    return (
        f"EM under the controlled rule (scored records naming a gold step): verified {share(**verified)}, "
        f"unverified {share(hits, n)}" + (f" ({parts})" if parts else "")
    )


def _mode(options: EvalOptions, rows: dict[str, dict[str, Any]]) -> str:
    """How the records were made, from the records: a method that never replays is localization-only even on a
    benchmark that can replay."""
    if any(r.get("mode") == AttributionMode.REPLAY.value for r in rows.values()):
        return REPLAYABLE.get(options.benchmark, "replay")
    if options.benchmark in REPLAYABLE:
        return f"localization-only: {options.method} does not replay"
    return "localization-only: no environment to replay"


def metrics_from_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    predictions = [
        Prediction(
            trace_id=r["trace_id"],
            predicted=r["predicted"],
            gold=frozenset(r["gold"]),
            status=r["status"],
            corrected=r["corrected"],
            llm_calls=r["llm_calls"],
            tokens=r["tokens"],
            agent_calls=r.get("agent_calls"),
            agent_tokens=r.get("agent_tokens"),
            seconds=r["seconds"],
            earliest_high=r.get("earliest_high"),
            failed=bool(r.get("failed")),
        )
        for r in rows
    ]
    metrics = compute_metrics(predictions)
    judged = [r["explanation_similarity"] for r in rows if r.get("explanation_similarity") is not None]
    if judged:
        from benchmarks.evaluation.metrics import mean_se

        metrics["explanation_similarity"] = mean_se(judged)  # step-conditioned: only matched predictions
        metrics["explanation_high"] = mean_se([1.0 if s >= 0.7 else 0.0 for s in judged])
        metrics["explanation_similarity_coverage"] = {"mean": sum(judged) / len(rows), "n": len(rows)}
    metrics["verified"] = sum(1 for r in rows if r["status"] == AttributionStatus.VERIFIED.value)
    metrics["not_attributable"] = sum(1 for r in rows if r["status"] == AttributionStatus.NOT_ATTRIBUTABLE.value)
    fidelity = [r["fidelity"] for r in rows if r.get("fidelity")]
    metrics["fidelity"] = {"reproduced": sum(f[0] for f in fidelity), "controls": sum(f[1] for f in fidelity)}
    by_status: dict[str, dict[str, int]] = {}
    for r in rows:
        if not r.get("failed"):
            counts = by_status.setdefault(str(r["status"]), {"hits": 0, "n": 0})
            counts["hits"] += r["predicted"] in r["gold"]
            counts["n"] += 1
    metrics["exact_match_by_status"] = by_status
    return metrics
