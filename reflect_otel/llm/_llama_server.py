"""``python -m reflect_otel.llm._llama_server ARGS``: llama-cpp-python's server (same arguments), with its prompt
cache holding to ``--cache_size`` in real bytes, and native tool calling through the chat format ``reflect-tools``
(:mod:`reflect_otel.llm._tool_calls`).

llama-cpp-python's RAM cache counts a saved state by its KV cells alone, but each state also copies the logits of
its prompt tokens (vocabulary x 4 bytes a token: 0.6 MB a token of Qwen2.5, against 29 kB a token of KV).
Counted its way, the cache either grows far past its budget (unbounded, it took the server to 23 GB and the OOM
killer) or, divided down to be safe, keeps only a state or two, and the auditor's shared trace prefix is evicted
by the agent's replays in between. Counting every byte lets the budget mean what it says.

Those logits are never read: we start the server with ``--logits_all false`` (its default computes the output
layer for every prompt token, for logprobs nobody asks for), and a state then keeps the last token's logits alone,
so the budget holds KV cells, many more states of them (``python -m benchmarks.local_server`` measures it).

Prompts are evaluated in batches aligned to absolute positions, so that a prompt's reply does not depend on what
the cache held (:func:`align_prompt_batches`). llama.cpp's CPU kernels give a token's KV cells and the last
token's logits bits that depend on how the prompt was split into batches: a batch of one token takes another
kernel than a batch of many, and a batch's size and the token's place in it change the sums. llama-cpp-python
splits a prompt into ``n_batch`` pieces from wherever its reused prefix ends, evaluates the last token alone when
the whole prompt was cached, and reuses the KV of generated tokens (computed one at a time) as if they had been
prompt tokens. So the same prompt, fresh or after a cached prefix, tie-broke differently under greedy decoding
(a control replay then need not repeat its run's steps). Aligned, every prompt token's KV is computed in
the chunk ``[k * n_batch, (k + 1) * n_batch)`` that a fresh evaluation computes it in, and a reused prefix is cut
back to the last boundary whose KV came from such a full chunk: the final logits, hence a greedy reply, are
bitwise the same however much was cached (``python -m benchmarks.prompt_cache_determinism`` measures it; the
cost is re-evaluating up to ``n_batch - 1`` prompt tokens and the previous reply per request).
"""

from __future__ import annotations

import inspect
import runpy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

ALIGNED_BATCH = 64
"""``n_batch`` (and ``n_ubatch``) of the embedded server: the unit of prompt evaluation, and of what a request may
re-evaluate to keep its reply independent of the cache (``python -m benchmarks.prompt_cache_determinism``
measures prompt throughput by size)."""

_CLEAN = "_reflect_clean_tokens"
"""On a ``Llama`` and on its saved states: how many of the first context tokens have KV computed in full chunks
aligned to ``n_batch``, as a fresh evaluation of any prompt starting with them computes it."""


_PATCHED = "_reflect_aligned_batches"
"""On a ``Llama`` class: :func:`align_prompt_batches` patched it (or a class it inherits from)."""


def state_bytes(state: Any) -> int:
    """What one saved state holds: its KV cells, its logits and its token ids."""
    return int(state.llama_state_size) + int(state.scores.nbytes) + int(state.input_ids.nbytes)


def _cache_size(cache: Any) -> int:
    return sum(state_bytes(state) for state in cache.cache_state.values())


def _last_logits_only(save_state: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``Llama.save_state`` keeping one row of logits when the model keeps no others (``logits_all`` off): the rows
    it copied are unused by sampling, and ``load_state`` fills its rows from the one kept (numpy broadcasts it)."""

    def save(llama: Any) -> Any:
        state = save_state(llama)
        if not llama._logits_all and len(state.scores) > 1:
            state.scores = state.scores[-1:].copy()
        return state

    return save


def reusable_prefix(matched: int, clean: int, prompt_tokens: int, batch: int) -> int:
    """How many of a prompt's first tokens to keep from the context, given that its first ``matched`` tokens are in
    the context and ``clean`` of them were computed in aligned full chunks: the last multiple of ``batch`` within
    both, and below the prompt's last token (its last chunk is always evaluated whole, as a fresh one is, so the
    logits come from the same batch)."""
    if batch < 1:
        raise ValueError(f"n_batch must be at least 1, not {batch}")
    if prompt_tokens < 1:
        return 0
    keep = max(0, min(matched, clean, prompt_tokens - 1))
    return keep - keep % batch


def clean_after_eval(clean: int, start: int, count: int, batch: int) -> int:
    """The clean boundary after evaluating ``count`` tokens from position ``start`` in chunks of ``batch``: KV from
    ``start`` on is replaced, and the full chunks extend the clean prefix only when they continue it (start at the
    boundary, hence aligned); a partial last chunk or a generated token (a chunk of one) does not."""
    clean = min(clean, start)
    if start != clean or start % batch:
        return clean
    return start + count - count % batch


def clean_tokens(llama: Any) -> int:
    """The ``Llama``'s clean boundary (0 when nothing set it), never past the tokens it holds."""
    return min(int(getattr(llama, _CLEAN, 0)), int(llama.n_tokens))


def _eval_tracking_clean(eval_: Callable[[Any, Sequence[int]], None]) -> Callable[[Any, Sequence[int]], None]:
    def evaluate(llama: Any, tokens: Sequence[int]) -> None:
        start = int(llama.n_tokens)
        clean = min(clean_tokens(llama), start)
        setattr(llama, _CLEAN, clean)  # what stays true if the evaluation fails half-way
        eval_(llama, tokens)
        setattr(llama, _CLEAN, clean_after_eval(clean, start, len(tokens), int(llama.n_batch)))

    return evaluate


def _generate_aligned(generate: Callable[..., Iterator[int]]) -> Callable[..., Iterator[int]]:
    """``Llama.generate``, the context first cut back to :func:`reusable_prefix`: llama-cpp-python then finds that
    prefix, evaluates the rest from an aligned position, and never takes its exact-hit or one-token refresh paths
    (the prompt's last chunk is never kept)."""
    signature = inspect.signature(generate)

    def aligned(llama: Any, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:
        prompt = list(tokens)
        if signature.bind(llama, prompt, *args, **kwargs).arguments.get("reset", True) and llama.n_tokens > 0:
            matched = 0
            for held, wanted in zip(llama.input_ids[: llama.n_tokens].tolist(), prompt, strict=False):
                if held != wanted:
                    break
                matched += 1
            keep = reusable_prefix(matched, clean_tokens(llama), len(prompt), int(llama.n_batch))
            if keep < llama.n_tokens:
                if keep == 0 or not llama._ctx.kv_cache_seq_rm(-1, keep, -1):
                    keep = 0  # generate resets the context (and clears a recurrent model's memory)
                llama.n_tokens = keep
                llama._requires_eval = True
        return (yield from generate(llama, prompt, *args, **kwargs))

    return aligned


def _save_carrying_clean(save_state: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def save(llama: Any) -> Any:
        state = save_state(llama)
        setattr(state, _CLEAN, clean_tokens(llama))
        return state

    return save


def _load_carrying_clean(load_state: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def load(llama: Any, state: Any) -> None:
        setattr(llama, _CLEAN, 0)  # what stays true if loading fails half-way (the context's tokens already set)
        load_state(llama, state)
        setattr(llama, _CLEAN, min(int(getattr(state, _CLEAN, 0)), int(state.n_tokens)))  # a foreign state: none

    return load


def align_prompt_batches(llama_class: type[Any]) -> None:
    """Patch ``llama_class`` (``llama_cpp.Llama`` or a subclass) so a prompt's evaluation does not depend on the
    cache: prompt chunks at multiples of ``n_batch``, reused prefixes cut back to the clean boundary, which saved
    states carry. Generation, one token at a time, is unchanged. Patching a class twice (or a subclass of a patched
    class) changes nothing more."""
    if getattr(llama_class, _PATCHED, False):
        return
    setattr(llama_class, _PATCHED, True)
    llama_class.eval = _eval_tracking_clean(llama_class.eval)
    llama_class.generate = _generate_aligned(llama_class.generate)
    llama_class.save_state = _save_carrying_clean(llama_class.save_state)
    llama_class.load_state = _load_carrying_clean(llama_class.load_state)


def main() -> None:
    from llama_cpp import Llama, llama_cache

    from reflect_otel.llm import _tool_calls

    _tool_calls.register()
    _tool_calls.accept_null_content()
    llama_cache.LlamaRAMCache.cache_size = property(_cache_size)  # type: ignore[assignment,method-assign]
    Llama.save_state = _last_logits_only(Llama.save_state)  # type: ignore[assignment,method-assign]
    align_prompt_batches(Llama)
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
