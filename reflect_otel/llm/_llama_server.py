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
"""

from __future__ import annotations

import runpy
from collections.abc import Callable
from typing import Any


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


def main() -> None:
    from llama_cpp import Llama, llama_cache

    from reflect_otel.llm import _tool_calls

    _tool_calls.register()
    _tool_calls.accept_null_content()
    llama_cache.LlamaRAMCache.cache_size = property(_cache_size)  # type: ignore[assignment,method-assign]
    Llama.save_state = _last_logits_only(Llama.save_state)  # type: ignore[assignment,method-assign]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
