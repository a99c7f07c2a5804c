"""``python -m reflect_otel.llm._llama_server ARGS``: llama-cpp-python's server (same arguments), with its prompt
cache holding to ``--cache_size`` in real bytes.

llama-cpp-python's RAM cache counts a saved state by its KV cells alone, but each state also copies the logits of
up to a batch of prompt tokens (vocabulary x 4 bytes a token: 311 MB for a state of 512 or more tokens of
Qwen2.5, against 29 kB a token of KV). Counted its way, the cache either grows far past its budget (unbounded, it
took the server to 23 GB and the OOM killer) or, divided down to be safe, keeps only a state or two, and the
auditor's shared trace prefix is evicted by the agent's replays in between. Counting every byte lets the budget
mean what it says and keep as many states as fit.
"""

from __future__ import annotations

import runpy
from typing import Any


def state_bytes(state: Any) -> int:
    """What one saved state holds: its KV cells, its logits and its token ids."""
    return int(state.llama_state_size) + int(state.scores.nbytes) + int(state.input_ids.nbytes)


def _cache_size(cache: Any) -> int:
    return sum(state_bytes(state) for state in cache.cache_state.values())


def main() -> None:
    from llama_cpp import llama_cache

    llama_cache.LlamaRAMCache.cache_size = property(_cache_size)  # type: ignore[assignment,method-assign]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
