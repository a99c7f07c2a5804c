"""Whether the local server's prompt cache changes its replies, and what aligned prompt batches cost. In process
(no server), on the local model, the same prompts are completed greedily the way the embedded server completes
them (``create_completion`` with a RAM prompt cache), each: fresh (an empty context and cache), after a cached
prefix of unaligned length, after the model's own reply to the prompt's beginning (the agent loop: the next prompt
holds the last reply), again after itself (the whole prompt cached), and from a saved state restored by the cache
after an unrelated prompt. Compared with the fresh completion: the prompt's final logits (bitwise) and the greedy
continuation, counted as "identical k of n", for llama-cpp-python as it comes (``n_batch`` 512, its server's
default), as it comes at ``--batch``, and with :func:`reflect_otel.llm._llama_server.align_prompt_batches` at
``--batch``. First, prompt evaluation throughput at several ``n_batch`` values against 512, in the same process
(medians of ``--repeats``).
Needs ``pip install 'reflect-otel[local]'``; ``--model`` picks the model (default: the registry's). Runs on
``--threads`` threads (1 by default: a measurement may share the machine). Last line:
``aligned_identical_share=N`` (identical final logits over all cached cases, with the fix), or with
``--no-determinism`` ``aligned_batch_throughput_ratio=N`` (prompt tokens per CPU second at ``--batch`` over 512's;
the wall-time ratio on the line before).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from reflect_otel.llm._llama_server import ALIGNED_BATCH, _last_logits_only, align_prompt_batches
from reflect_otel.llm.models import resolve_local_model

DEFAULT_BATCH = 512
"""llama-cpp-python's server default ``n_batch`` (and ``n_ubatch``), what the embedded server ran with before."""
SMOKE_MODEL = "smollm2-135m-instruct"
TEXTS = Path(__file__).resolve().parents[1] / "docs"
CASES = ("cached prefix", "own reply", "same prompt again", "restored state")


class Completion(NamedTuple):
    logits: np.ndarray[Any, np.dtype[np.single]]
    """The prompt's last token's logits, as the sampler saw them."""
    text: str
    evaluated: int
    """Prompt tokens this request evaluated (the rest came from the context or the cache)."""


def _classes() -> tuple[type[Any], type[Any]]:
    """llama-cpp-python's ``Llama`` as the server had it before (only the state's logits trimmed) and as it has it
    now (prompt batches aligned): subclasses, so that both live in one process."""
    from llama_cpp import Llama

    class Before(Llama):  # type: ignore[misc]
        pass

    class Aligned(Llama):  # type: ignore[misc]
        pass

    for cls in (Before, Aligned):
        cls.save_state = _last_logits_only(Llama.save_state)
    align_prompt_batches(Aligned)
    return Before, Aligned


@contextmanager
def _loaded(cls: type[Any], path: Path, batch: int, threads: int, n_ctx: int) -> Iterator[Any]:
    """One model at a time: closed before the next is loaded."""
    llama = cls(
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )
    try:
        yield llama
    finally:
        llama.close()
        del llama
        gc.collect()


def _complete(llama: Any, prompt: list[int], max_tokens: int) -> Completion:
    """A greedy completion as the server runs one, the logits of the prompt's last token recorded on the way."""
    from llama_cpp import LogitsProcessorList

    seen: list[np.ndarray[Any, np.dtype[np.single]]] = []
    evaluated: list[int] = []

    def record(_ids: Any, scores: np.ndarray[Any, np.dtype[np.single]]) -> np.ndarray[Any, np.dtype[np.single]]:
        if not seen:
            seen.append(scores.copy())
        return scores

    def counted(tokens: Any, *, eval_: Any = llama.eval) -> None:
        evaluated.append(len(tokens))  # the first call is the prompt's rest, then one call a generated token
        eval_(tokens)

    llama.eval = counted
    try:
        result = llama.create_completion(
            prompt, max_tokens=max_tokens, temperature=0.0, logits_processor=LogitsProcessorList([record])
        )
    finally:
        del llama.eval
    return Completion(seen[0], result["choices"][0]["text"], evaluated[0] if evaluated else 0)


def _fresh(llama: Any) -> None:
    """An empty context and an empty cache, as on a server just started."""
    from llama_cpp import LlamaRAMCache

    llama.reset()
    llama._ctx.kv_cache_seq_rm(-1, 0, -1)
    llama.set_cache(LlamaRAMCache(capacity_bytes=1 << 30))


def _prompts(llama: Any, count: int, length: int) -> list[list[int]]:
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(TEXTS.glob("*.md")))
    tokens = llama.tokenize(text.encode("utf-8"), add_bos=False)
    step = max(length, (len(tokens) - length) // max(count, 1))
    prompts = [tokens[i : i + length] for i in range(0, len(tokens) - length, step)][:count]
    if len(prompts) < count:
        raise SystemExit(f"the texts in {TEXTS} give {len(prompts)} prompts of {length} tokens, not {count}")
    return prompts


def _cases(llama: Any, prompt: list[int], reply_tokens: int, unrelated: list[int]) -> dict[str, tuple[Completion, ...]]:
    """Per case, the completion of one prompt beside its fresh completion. The prompt is an agent loop's: a
    beginning, the model's own reply to it, the rest."""
    split = len(prompt) // 2 + 7  # unaligned for any power of two from 8 up
    _fresh(llama)
    _complete(llama, prompt[:split], reply_tokens)
    reply = llama.input_ids[split : llama.n_tokens].tolist()  # the reply's tokens held in the context
    looped = prompt[:split] + reply + prompt[split:]
    _fresh(llama)
    reference = _complete(llama, looped, reply_tokens)
    cases: dict[str, tuple[Completion, ...]] = {}
    _fresh(llama)
    _complete(llama, looped[:split], 1)  # the beginning evaluated as a prompt (the sampled token is not)
    cases["cached prefix"] = (reference, _complete(llama, looped, reply_tokens))
    _fresh(llama)
    _complete(llama, prompt[:split], reply_tokens)  # the reply's KV computed one token at a time
    cases["own reply"] = (reference, _complete(llama, looped, reply_tokens))
    cases["same prompt again"] = (reference, _complete(llama, looped, reply_tokens))
    _fresh(llama)
    _complete(llama, looped[: split + 3], reply_tokens)  # saved in the cache
    _complete(llama, unrelated, 1)  # the context moves on; the next request restores the saved state
    cases["restored state"] = (reference, _complete(llama, looped, reply_tokens))
    return cases


class Rate(NamedTuple):
    wall: float
    """Prompt tokens per second of wall time."""
    cpu: float
    """Prompt tokens per second of this process's CPU time: on a shared machine (``nice``), what the evaluation
    costs, apart from the share of the CPU it was given."""


def _throughput(cls: type[Any], path: Path, batch: int, prompts: list[list[int]], threads: int, n_ctx: int) -> Rate:
    """Prompt tokens per second evaluated fresh at ``batch``."""
    with _loaded(cls, path, batch, threads, n_ctx) as llama:
        llama.eval(prompts[0][:8])  # warm the weights into memory
        started, cpu_started = time.perf_counter(), time.process_time()
        for prompt in prompts:
            llama.reset()
            llama.eval(prompt)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    tokens = sum(len(p) for p in prompts)
    return Rate(tokens / seconds, tokens / cpu_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", help="a registry name, a .gguf path or hf:...; default: the registry's default")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=240)
    parser.add_argument("--reply-tokens", type=int, default=8)
    parser.add_argument("--batch", type=int, default=ALIGNED_BATCH, help="n_batch with the fix")
    parser.add_argument("--throughput-batches", default="16,32,64,128", help="n_batch values timed against 512")
    parser.add_argument("--repeats", type=int, default=3, help="timings per n_batch; 0: no timing")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-determinism", action="store_true", help="the throughput alone")
    parser.add_argument("--smoke", action="store_true", help="SmolLM2-135M, two short prompts: checks it runs")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.prompts, args.prompt_tokens, args.reply_tokens = SMOKE_MODEL, 2, 40, 3
        args.batch, args.throughput_batches, args.repeats = 8, "8", 1
    model = resolve_local_model(args.model)
    n_ctx = 2 * args.prompt_tokens + 8 * args.reply_tokens + 64
    before, aligned = _classes()
    with _loaded(before, model.path, DEFAULT_BATCH, args.threads, n_ctx) as llama:
        prompts = _prompts(llama, args.prompts + 1, args.prompt_tokens)
    unrelated, prompts = prompts[-1][: args.prompt_tokens // 4], prompts[:-1]
    print(f"model={model.name} prompts={len(prompts)} of {args.prompt_tokens} tokens threads={args.threads}")

    if args.repeats > 0:
        _report_throughput(before, model.path, args, prompts, n_ctx)
    if args.no_determinism:
        return
    shares: dict[str, float] = {}
    configurations = (
        ("before", before, DEFAULT_BATCH),
        ("unaligned", before, args.batch),
        ("aligned", aligned, args.batch),
    )
    for label, cls, batch in configurations:
        logits = dict.fromkeys(CASES, 0)
        replies = dict.fromkeys(CASES, 0)
        evaluated = dict.fromkeys(CASES, 0)
        with _loaded(cls, model.path, batch, args.threads, n_ctx) as llama:
            for prompt in prompts:
                for case, (fresh, done) in _cases(llama, prompt, args.reply_tokens, unrelated).items():
                    logits[case] += bool(np.array_equal(done.logits, fresh.logits))
                    replies[case] += done.text == fresh.text
                    evaluated[case] += done.evaluated
        n = len(prompts)
        print(f"{label} (n_batch {batch}): identical to the fresh completion, of {n}; prompt tokens evaluated")
        print(f"  {'case':<18} {'logits':>6} {'reply':>6} {'evaluated':>9}")
        for case in CASES:
            print(f"  {case:<18} {logits[case]:>6} {replies[case]:>6} {evaluated[case]:>9}", flush=True)
        shares[label] = sum(logits.values()) / (n * len(CASES))
    print(f"before_identical_share={shares['before']:.2f}")
    print(f"unaligned_identical_share={shares['unaligned']:.2f}")
    print(f"aligned_identical_share={shares['aligned']:.2f}")


def _report_throughput(
    cls: type[Any], path: Path, args: argparse.Namespace, prompts: list[list[int]], n_ctx: int
) -> None:
    batches = [int(b) for b in args.throughput_batches.split(",") if b]
    timed: dict[int, list[Rate]] = {b: [] for b in (DEFAULT_BATCH, *batches)}
    for _ in range(args.repeats):  # interleaved, so that load from elsewhere falls on every size alike
        for batch in timed:
            timed[batch].append(_throughput(cls, path, batch, prompts, args.threads, n_ctx))
    wall = {b: statistics.median(r.wall for r in rates) for b, rates in timed.items()}
    cpu = {b: statistics.median(r.cpu for r in rates) for b, rates in timed.items()}
    print(
        f"prompt evaluation, fresh, median of {args.repeats}: tokens/s of wall and of CPU time, ratios to n_batch "
        f"{DEFAULT_BATCH}"
    )
    for batch in sorted(timed):
        print(
            f"  n_batch {batch:>4}  wall {wall[batch]:8.1f} tok/s {wall[batch] / wall[DEFAULT_BATCH]:5.2f}"
            f"  cpu {cpu[batch]:8.1f} tok/s {cpu[batch] / cpu[DEFAULT_BATCH]:5.2f}",
            flush=True,
        )
    if args.batch in timed:
        print(f"aligned_batch_wall_throughput_ratio={wall[args.batch] / wall[DEFAULT_BATCH]:.2f}")
        print(f"aligned_batch_throughput_ratio={cpu[args.batch] / cpu[DEFAULT_BATCH]:.2f}")


if __name__ == "__main__":
    main()
