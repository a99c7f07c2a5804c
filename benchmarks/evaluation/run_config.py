"""``run_config.json`` of a resumable evaluation: what the run measures, when it first started, and every session
that added rows to it (with the package versions of each), so resuming never loses how earlier rows were made.

A resumed run must measure the same thing as the rows it continues: the options that define a row (the method, the
seed, the model, the REFLECT configuration) are checked against the stored ones, and a difference fails naming
the fix instead of mixing two measurements in one table.
"""

from __future__ import annotations

import json
import platform
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from reflect_otel.errors import InputError

__all__ = [
    "REGIME",
    "RUN_CONFIG",
    "VERIFICATION",
    "code_line",
    "code_version",
    "package_versions",
    "read_json_object",
    "write_run_config",
]

RUN_CONFIG = "run_config.json"
VERIFICATION = "controlled, change of effect, sensitivity arm, localization test"
"""The verification rule a run's rows were made under (``run_config.json``'s ``verification``)."""
REGIME = (
    "the localizer and the classifier may see the expected answer (the oracle regime, where a method does); every "
    "text or call a replay executes (corrections, proposals, plans, memories) is written without it; the answer "
    "judges replays only"
)
"""Who sees the expected answer in a run's methods (``run_config.json``'s ``regime``)."""

_MAX_BYTES = 1_000_000
_PACKAGES = ("reflect-otel", "openai", "pydantic", "duckdb", "opentelemetry-sdk", "langgraph")


_CODE_FOLDERS = ("reflect_otel", "collectors", "exporters", "replay_adapters", "benchmarks/evaluation")


def code_version() -> dict[str, str | bool]:
    """The commit the package's code was run from, and whether its code folders had changes not committed: a
    results table names the code that made it. ``{"commit": "unknown"}`` outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", *_CODE_FOLDERS],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown"}
    return {"commit": commit, "uncommitted_code_changes": bool(status.strip())}


def code_line(config: Mapping[str, Any]) -> str:
    """The code that made a run's rows, from its ``run_config.json``, for the run's table: ``Code: commit C (all N
    sessions)`` when every session that added rows ran one commit, else each commit with the sessions (numbered from
    1) that ran it; sessions whose code folders had uncommitted changes are named, and one that recorded no commit
    says so."""
    sessions = [s for s in config.get("sessions") or () if isinstance(s, Mapping)]
    codes: list[Any] = [s.get("code") for s in sessions] or [config.get("code")]
    commits: dict[str, list[int]] = {}
    dirty: list[int] = []
    for number, code in enumerate(codes, start=1):
        code = code if isinstance(code, Mapping) else {}
        commits.setdefault(str(code.get("commit") or "not recorded"), []).append(number)
        if code.get("uncommitted_code_changes"):
            dirty.append(number)
    if len(commits) == 1:
        only = next(iter(commits))
        line = f"Code: commit {only}" + (f" (all {len(codes)} sessions)" if len(codes) > 1 else "")
    else:
        line = "Code: " + "; ".join(f"commit {c} (session {_numbers(n)})" for c, n in commits.items())
    if dirty:
        line += f"; uncommitted code changes in session {_numbers(dirty)}"
    return line


def _numbers(numbers: Sequence[int]) -> str:
    return ", ".join(str(n) for n in numbers)


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in _PACKAGES:
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            continue
    return out


def write_run_config(
    folder: Path,
    config: Mapping[str, Any],
    *,
    defining: Sequence[str],
    absent_means: Mapping[str, Any] | None = None,
) -> None:
    """Write ``config`` to ``folder/run_config.json`` with this session appended to ``sessions``. When the folder
    already holds a run, its first ``started_at`` is kept, and every key of ``defining`` must be unchanged (a
    nested mapping compares on the keys both sides have, so a setting added since keeps old runs resumable).
    ``absent_means`` gives the value a defining key had in runs written before it was recorded, where that is
    known: such a run is then checked against it instead of taken as compatible with any value."""
    path = folder / RUN_CONFIG
    now = {"started_at": datetime.now(UTC).isoformat(), "versions": package_versions(), "code": code_version()}
    previous = read_json_object(path) if path.is_file() else None
    sessions: list[Any] = []
    started = now["started_at"]
    if previous is not None:
        _check_unchanged(path, {**(absent_means or {}), **previous}, config, defining)
        sessions = previous.get("sessions") or (  # a run written before sessions were kept: its one known start
            [{"started_at": previous["started_at"], "versions": previous.get("versions")}]
            if previous.get("started_at")
            else []
        )
        started = previous.get("started_at") or started
    first_code = (sessions[0].get("code") if sessions and isinstance(sessions[0], dict) else None) or now["code"]
    path.write_text(
        json.dumps(
            {
                **config,
                "started_at": started,
                "code": first_code,
                "versions": now["versions"],
                "sessions": [*sessions, now],
            },
            indent=2,
        )
    )


def read_json_object(path: Path) -> dict[str, Any]:
    """An evaluation run's JSON file (``run_config.json``, ``metrics.json``), bounded in bytes and checked to be an
    object: :class:`InputError` naming the fix otherwise."""
    if path.stat().st_size > _MAX_BYTES:
        raise InputError(f"{path} is over {_MAX_BYTES} bytes, not an evaluation run's file; use a new --out folder")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise InputError(
            f"{path} is not valid JSON ({error}); restore it from version control or use a new --out"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a JSON object; restore it from version control or use a new --out")
    return data


def _check_unchanged(
    path: Path, previous: Mapping[str, Any], config: Mapping[str, Any], defining: Sequence[str]
) -> None:
    changed = [
        f"{key}: {before!r} -> {after!r}"
        for name in defining
        if name in previous and name in config
        for key, before, after in _differences(name, previous[name], config[name])
    ]
    if changed:
        raise InputError(
            f"{path.parent} holds a run made with other settings ({'; '.join(changed)}); resuming would mix two "
            "measurements in one table: pass the settings it was made with, or a new --out folder"
        )


def _differences(name: str, before: Any, after: Any) -> list[tuple[str, Any, Any]]:
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        return [
            (f"{name}.{key}", before[key], after[key]) for key in before if key in after and before[key] != after[key]
        ]
    return [] if before == after else [(name, before, after)]
