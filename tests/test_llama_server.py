"""The embedded server's aligned prompt batches (reflect_otel/llm/_llama_server.py), without a model: the boundary
arithmetic, and a simulated context over random request sequences in which every prompt token must end up
computed in the batch a fresh evaluation computes it in (what makes the reply independent of the cache; the
model test is ``test_local_llm.py::test_a_prompt_gets_the_same_logits_fresh_cached_and_restored``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from reflect_otel.llm._llama_server import align_prompt_batches, clean_after_eval, clean_tokens, reusable_prefix


def test_a_reused_prefix_is_cut_back_to_an_aligned_clean_boundary() -> None:
    assert reusable_prefix(matched=100, clean=128, prompt_tokens=300, batch=64) == 64
    assert reusable_prefix(matched=200, clean=64, prompt_tokens=300, batch=64) == 64  # the rest was a reply
    assert reusable_prefix(matched=300, clean=256, prompt_tokens=300, batch=64) == 256
    # the whole prompt cached: its last chunk is evaluated again whole, as a fresh evaluation does
    assert reusable_prefix(matched=256, clean=256, prompt_tokens=256, batch=64) == 192
    assert reusable_prefix(matched=50, clean=0, prompt_tokens=60, batch=64) == 0
    assert reusable_prefix(matched=0, clean=0, prompt_tokens=0, batch=64) == 0
    assert reusable_prefix(matched=9, clean=9, prompt_tokens=9, batch=1) == 8  # one token at a time: all but the last
    with pytest.raises(ValueError, match="n_batch"):
        reusable_prefix(matched=1, clean=1, prompt_tokens=2, batch=0)


def test_only_full_chunks_that_continue_the_clean_prefix_extend_it() -> None:
    assert clean_after_eval(clean=0, start=0, count=150, batch=64) == 128  # the partial last chunk is not clean
    assert clean_after_eval(clean=128, start=128, count=64, batch=64) == 192
    assert clean_after_eval(clean=128, start=150, count=1, batch=64) == 128  # a generated token
    assert clean_after_eval(clean=128, start=128, count=1, batch=64) == 128  # one even at an aligned position
    assert clean_after_eval(clean=192, start=64, count=10, batch=64) == 64  # the context was cut back
    assert clean_after_eval(clean=64, start=100, count=128, batch=64) == 64  # full chunks over unclean KV
    assert clean_after_eval(clean=5, start=5, count=3, batch=1) == 8


Chunk = tuple[int, int]


@dataclass
class Context:
    """A simulated llama.cpp context: per position, its token and the chunk ``[start, end)`` its KV was computed
    in; the clean boundary as the patched ``Llama`` tracks it."""

    cells: list[tuple[int, Chunk]] = field(default_factory=list)
    clean: int = 0
    last_prompt_fresh: bool = False
    """Whether every token of the last prompt was computed in the chunk a fresh evaluation computes it in."""

    def tokens(self) -> list[int]:
        return [token for token, _ in self.cells]

    def evaluate(self, tokens: list[int], batch: int) -> None:
        """``Llama.eval``: chunks of ``batch`` from the current end."""
        start = len(self.cells)
        for offset in range(0, len(tokens), batch):
            chunk = (start + offset, start + min(len(tokens), offset + batch))
            self.cells += [(token, chunk) for token in tokens[offset : offset + batch]]
        self.clean = clean_after_eval(min(self.clean, start), start, len(tokens), batch)

    def request(self, prompt: list[int], reply: list[int], batch: int, *, aligned: bool) -> None:
        """A completion: keep a prefix, evaluate the prompt's rest, then the reply one token at a time (its last
        token is sampled, never evaluated)."""
        matched = 0
        for held, wanted in zip(self.tokens(), prompt, strict=False):
            if held != wanted:
                break
            matched += 1
        # unaligned, llama-cpp-python's own: everything that matches, less one token when the whole prompt does
        keep = reusable_prefix(matched, self.clean, len(prompt), batch) if aligned else min(matched, len(prompt) - 1)
        del self.cells[keep:]
        self.clean = min(self.clean, keep)
        self.evaluate(prompt[keep:], batch)
        fresh = [(p - p % batch, min(len(prompt), p - p % batch + batch)) for p in range(len(prompt))]
        self.last_prompt_fresh = [chunk for (_, chunk) in self.cells[: len(prompt)]] == fresh
        for token in reply[:-1]:
            self.evaluate([token], batch)


def _random_requests(seed: int, batch: int, *, aligned: bool) -> list[bool]:
    """Whether each request's prompt was computed as fresh, over an agent-like sequence: prompts extending the
    last prompt and its reply, prompts sharing a beginning with an earlier one, the same prompt again, states
    saved and restored."""
    rng = random.Random(seed)
    context = Context()
    saved: list[tuple[list[tuple[int, Chunk]], int]] = []
    history: list[list[int]] = []
    fresh = []
    for _ in range(40):
        if history and rng.random() < 0.7:
            base = rng.choice(history)
            base = base[: rng.randint(1, len(base))] if rng.random() < 0.4 else base
        else:
            base = []
        prompt = base + [rng.randrange(1000) for _ in range(rng.choice([0, 1, 5, 37, 100]))] or [1]
        reply = [rng.randrange(1000) for _ in range(rng.randint(1, 12))]
        if saved and rng.random() < 0.3:  # the RAM cache restores a saved state
            cells, clean = rng.choice(saved)
            context.cells, context.clean = list(cells), clean
        context.request(prompt, reply, batch, aligned=aligned)
        fresh.append(context.last_prompt_fresh)
        history.append(prompt + reply)
        saved.append((list(context.cells), context.clean))
    return fresh


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_with_aligned_batches_every_prompt_is_computed_as_a_fresh_evaluation_computes_it(batch: int) -> None:
    for seed in range(10):
        assert all(_random_requests(seed, batch, aligned=True)), seed


def test_llama_cpp_pythons_own_reuse_computes_cached_prompts_in_other_batches() -> None:
    """The same sequences without the alignment: cached prompts are computed in batches a fresh evaluation does not
    use (the check above can fail)."""
    fresh = [ok for seed in range(10) for ok in _random_requests(seed, 8, aligned=False)]
    assert fresh.count(False) > len(fresh) // 8


class _Context:
    """The part of ``llama_cpp.Llama`` the patches read (tokens held, ``n_batch``) and the four methods they wrap,
    each as llama-cpp-python does it in outline; ``load_state`` sets the context's tokens before the KV and can fail
    there, as ``llama_state_set_data`` can."""

    n_batch = 8

    def __init__(self) -> None:
        self.n_tokens = 0
        self.evaluations = 0

    def eval(self, tokens: list[int]) -> None:
        self.evaluations += 1
        self.n_tokens += len(tokens)

    def generate(self, tokens: list[int], reset: bool = True) -> Iterator[int]:
        yield from ()

    def save_state(self) -> SimpleNamespace:
        return SimpleNamespace(n_tokens=self.n_tokens)

    def load_state(self, state: SimpleNamespace) -> None:
        self.n_tokens = state.n_tokens
        if getattr(state, "broken", False):
            raise RuntimeError("Failed to set llama state data")


def test_a_state_that_fails_to_load_leaves_no_clean_prefix() -> None:
    """A failed load leaves the state's tokens in the context over KV of unknown origin: none of it is reused as
    clean (before, the clean boundary of the context it replaced stayed)."""

    class Patched(_Context):
        pass

    align_prompt_batches(Patched)
    llama = Patched()
    llama.eval(list(range(40)))
    assert clean_tokens(llama) == 40 - 40 % 8
    broken = llama.save_state()
    broken.broken = True
    with pytest.raises(RuntimeError, match="state data"):
        llama.load_state(broken)
    assert llama.n_tokens == 40
    assert clean_tokens(llama) == 0
    llama.load_state(llama.save_state())
    assert clean_tokens(llama) == 0  # carried by the state


def test_patching_twice_wraps_once() -> None:
    class Patched(_Context):
        pass

    class Sub(Patched):
        pass

    align_prompt_batches(Patched)
    wrapped = Patched.eval
    align_prompt_batches(Patched)
    align_prompt_batches(Sub)
    assert Patched.eval is wrapped and Sub.eval is wrapped
    llama = Sub()
    llama.eval(list(range(16)))
    assert llama.evaluations == 1 and clean_tokens(llama) == 16
