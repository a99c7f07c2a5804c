"""The local-model registry: parts assembled once and checked by sha256, paths, names, and the opt-in download
from a Hugging Face endpoint (a fake one on loopback)."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reflect_otel.errors import ConfigError, LLMError
from reflect_otel.llm import models
from reflect_otel.llm.models import LocalModel, PackagedParts, assemble_parts, resolve_local_model

PARTS = [b"GGUF-part-one|", b"part-two|", b"part-three"]
WHOLE = b"".join(PARTS)
SHA = hashlib.sha256(WHOLE).hexdigest()


def _part_files(folder: Path) -> list[Path]:
    paths = []
    for number, data in enumerate(PARTS, start=1):
        path = folder / f"part{number:02d}.bin"
        path.write_bytes(data)
        paths.append(path)
    return paths


def test_parts_are_assembled_once_and_checked(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "model.gguf"
    seen: list[tuple[int, int]] = []
    assert (
        assemble_parts(
            _part_files(tmp_path), target, sha256=SHA, size=len(WHOLE), progress=lambda d, t: seen.append((d, t))
        )
        == target
    )
    assert target.read_bytes() == WHOLE and seen[-1] == (len(WHOLE), len(WHOLE))
    assert (tmp_path / "cache" / "model.gguf.sha256").read_text().strip() == SHA
    before = target.stat().st_mtime_ns
    assert assemble_parts(_part_files(tmp_path), target, sha256=SHA, size=len(WHOLE)) == target
    assert target.stat().st_mtime_ns == before  # verified before: not written again


def test_a_sha256_mismatch_leaves_no_file_and_names_the_fix(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(LLMError, match=r"sha256 [0-9a-f]{64}, expected 0{64}.*force-reinstall"):
        assemble_parts(_part_files(tmp_path), target, sha256="0" * 64, size=None)
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.gguf.lock"]  # no model, no .partial
    with pytest.raises(LLMError, match=f"gave {len(WHOLE)} bytes, expected {len(WHOLE) + 1}"):
        assemble_parts(_part_files(tmp_path), target, sha256=SHA, size=len(WHOLE) + 1)
    assert not target.exists()


def test_a_registered_model_is_assembled_from_installed_part_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    for number, data in enumerate(PARTS, start=1):
        package = site / f"fake_model_part{number}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{number:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("REFLECT_CACHE_DIR", str(tmp_path / "cache"))
    parts = tuple((f"fake_model_part{n}", f"data/part{n:02d}.bin") for n in range(1, 4))
    fake = LocalModel("fake-1b", "fake-1b.gguf", PackagedParts(parts), len(WHOLE), SHA, "pip install fake", "MIT")
    monkeypatch.setitem(models.MODELS, "fake-1b", fake)
    resolved = resolve_local_model("fake-1b")
    assert resolved.name == "fake-1b" and resolved.path == tmp_path / "cache" / "models" / "fake-1b.gguf"
    assert resolved.path.read_bytes() == WHOLE
    missing = LocalModel(
        "gone", "gone.gguf", PackagedParts((("no_such_part_pkg", "x.bin"),)), None, None, "pip install gone", "MIT"
    )
    monkeypatch.setitem(models.MODELS, "gone", missing)
    with pytest.raises(LLMError, match="'no_such_part_pkg' is not installed; install it with: pip install gone"):
        resolve_local_model("gone")


def test_a_path_is_served_under_its_own_name_and_unknown_names_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "my-model.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("REFLECT_LOCAL_MODEL", str(gguf))
    assert resolve_local_model() == models.ResolvedModel("my-model.Q4", gguf)
    with pytest.raises(ConfigError, match=r"unknown local model 'nope'; choose one of qwen2\.5-coder-1\.5b-instruct"):
        resolve_local_model("nope")
    with pytest.raises(LLMError, match="no such file"):
        resolve_local_model(str(tmp_path / "absent.gguf"))


@pytest.fixture
def fake_hub() -> Iterator[tuple[str, list[str]]]:
    """A loopback stand-in for a Hugging Face endpoint serving one file of owner/repo."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _headers(self) -> bool:
            seen.append(f"{self.command} {self.path}")
            if self.path != "/owner/repo/resolve/main/tiny.gguf":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return False
            self.send_response(200)
            self.send_header("ETag", f'"{SHA}"')
            self.send_header("X-Repo-Commit", "c" * 40)
            self.send_header("Content-Length", str(len(WHOLE)))
            self.end_headers()
            return True

        def do_HEAD(self) -> None:
            self._headers()

        def do_GET(self) -> None:
            if self._headers():
                self.wfile.write(WHOLE)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_an_hf_model_is_downloaded_through_huggingface_hub_when_named(
    fake_hub: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    constants = pytest.importorskip("huggingface_hub.constants")
    endpoint, seen = fake_hub
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("REFLECT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("REFLECT_LOCAL_MODEL_SHA256", SHA)
    resolved = resolve_local_model("hf:owner/repo/tiny.gguf")
    assert resolved.name == "tiny" and resolved.path.read_bytes() == WHOLE
    assert str(resolved.path).startswith(str(tmp_path / "cache" / "hub"))
    assert "GET /owner/repo/resolve/main/tiny.gguf" in seen
    monkeypatch.setenv("REFLECT_LOCAL_MODEL_SHA256", "f" * 64)
    with pytest.raises(LLMError, match=f"has sha256 {SHA}, expected f{{64}}"):
        resolve_local_model("hf:owner/repo/tiny.gguf")
    with pytest.raises(LLMError, match=r"could not download owner/repo/absent\.gguf"):
        resolve_local_model("hf:owner/repo/absent.gguf")


def test_the_servers_prompt_cache_counts_every_byte_of_a_state() -> None:
    """llama-cpp-python counts a saved state by its KV cells alone; our server counts its logits and ids too, so
    the cache budget holds in real memory (reflect_otel/llm/_llama_server.py)."""
    from types import SimpleNamespace

    import numpy as np

    from reflect_otel.llm._llama_server import _cache_size, state_bytes

    state = SimpleNamespace(
        llama_state_size=29_000 * 600,  # KV of 600 tokens
        scores=np.zeros((512, 151_936), dtype=np.single),  # the logits llama-cpp-python copies with each state
        input_ids=np.zeros(600, dtype=np.intc),
    )
    assert state_bytes(state) == 29_000 * 600 + 512 * 151_936 * 4 + 600 * 4
    cache = SimpleNamespace(cache_state={"a": state, "b": state})
    assert _cache_size(cache) == 2 * state_bytes(state)
