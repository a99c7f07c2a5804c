"""The one place entry points are looked up: backends a user or a third party chooses by name.

Built-in parts are wired by plain imports (as the OTel SDK imports its own ``BatchSpanProcessor`` and simonw/llm
its default plugins); entry points exist only where a name picks a backend:

| group | entry point is | chosen by |
| --- | --- | --- |
| ``reflect_otel.llm`` | ``factory(LLMConfig) -> StructuredLLM`` | ``REFLECT_LLM_BACKEND`` (default ``openai``/``local``) |
| ``reflect_otel.replay_adapters`` | ``factory(trace, llm) -> ReplayAdapter | None`` (claims the traces it can re-run) | every installed one is asked, by name order |
| ``reflect_otel.record_exporters`` | ``factory() -> RecordExporter``, settings from the environment | ``--export NAME``, ``configure(exporters=[...])`` |
| ``reflect_otel.stores`` | ``factory(path) -> AttributionStore`` | ``open_store(kind=...)`` (default ``duckdb``) |
| ``reflect_otel.commands`` | ``register(subparsers)`` adding one subcommand (third-party commands) | its name on the command line |
| ``reflect_otel.correction_rules`` | ``rule(trace, step, context) -> list[Correction]`` (:data:`reflect_otel.attribution.corrections.Rule`): a third party's evidence rule (the package installs none; an agent's own rules travel with its replay adapter) | every installed one runs on every trace after the built-in rules, by name order; one that fails is logged and skipped |

A plugin that raises anything while loading (a missing optional dependency, a bug at import) never stops the tool:
:func:`loaded` and the command line skip it with a warning naming it, its package and the fix (:func:`unloadable`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from reflect_otel.errors import ConfigError

__all__ = [
    "COMMANDS",
    "CORRECTION_RULES",
    "LLM_BACKENDS",
    "RECORD_EXPORTERS",
    "REPLAY_ADAPTERS",
    "STORES",
    "load",
    "loaded",
    "names",
    "unloadable",
]

_log = logging.getLogger("reflect_otel.plugins")
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()

LLM_BACKENDS = "reflect_otel.llm"
REPLAY_ADAPTERS = "reflect_otel.replay_adapters"
RECORD_EXPORTERS = "reflect_otel.record_exporters"
STORES = "reflect_otel.stores"
COMMANDS = "reflect_otel.commands"
CORRECTION_RULES = "reflect_otel.correction_rules"

_KINDS = {
    LLM_BACKENDS: "LLM backend",
    REPLAY_ADAPTERS: "replay adapter",
    RECORD_EXPORTERS: "record exporter",
    STORES: "store backend",
    COMMANDS: "command",
    CORRECTION_RULES: "correction rule",
}


def _entries(group: str) -> dict[str, EntryPoint]:
    return {entry.name: entry for entry in entry_points(group=group)}


def names(group: str) -> list[str]:
    """The names installed in ``group``, sorted."""
    return sorted(_entries(group))


def load(group: str, name: str) -> Any:
    """The object the entry point ``name`` of ``group`` refers to. Raises :class:`ConfigError` naming what is
    installed when there is no such entry point."""
    found = _entries(group)
    if name not in found:
        installed = ", ".join(sorted(found)) or "none"
        raise ConfigError(f"unknown {_KINDS.get(group, group)} {name!r}; installed: {installed}")
    return found[name].load()


def loaded(group: str) -> Iterator[tuple[str, Any]]:
    """``(name, object)`` for every entry point of ``group`` in name order. One that raises anything while loading
    (a missing optional dependency, a bug at import) is skipped with a warning naming it and the fix, logged once
    per process: a broken plugin cannot break the others, nor the tool."""
    for name, entry in sorted(_entries(group).items()):
        try:
            found = entry.load()
        except Exception as error:
            _warn_once(group, entry, error)
            continue
        yield name, found


def unloadable(group: str, entry_name: str, error: BaseException) -> str:
    """What to tell the user of a plugin that raised ``error`` while loading: which plugin, from which package, and
    the fix."""
    entry = _entries(group).get(entry_name)
    value = f" ({entry.value})" if entry is not None else ""
    dist = getattr(entry, "dist", None) if entry is not None else None
    package = getattr(dist, "name", None)
    fix = (
        f"fix it, or uninstall it: pip uninstall {package}"
        if package
        else f"fix it, or remove the package that declares it in the entry-point group {group}"
    )
    return (
        f"{_KINDS.get(group, group)} plugin {entry_name!r}{value}"
        + (f" of package {package!r}" if package else "")
        + f" could not be loaded ({type(error).__name__}: {error}); skipped. To use it, {fix}"
    )


def _warn_once(group: str, entry: EntryPoint, error: Exception) -> None:
    with _warned_lock:
        if (group, entry.name) in _warned:
            return
        _warned.add((group, entry.name))
    _log.warning("%s", unloadable(group, entry.name, error))
