"""Flags several commands take, declared once: the REFLECT pipeline's (``attribute``, ``eval``, ``demo``), the
agent's determinism, ``--replay-config`` and ``--export``; and the lines of a trace file that were skipped.

The pipeline's help texts and defaults come from :class:`~reflect_otel.config.ReflectConfig`; a command that runs
with other defaults (the demo) passes them and the help says so. A flag left out keeps the setting's variable or
default.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reflect_otel.config import REFLECT_VARIABLES, GateMode, ReflectConfig
from reflect_otel.errors import ConfigError, InputError
from reflect_otel.settings import settings

__all__ = [
    "SkippedLines",
    "add_agent_determinism_option",
    "add_export_option",
    "add_pipeline_options",
    "add_replay_config_option",
    "agent_is_deterministic",
    "paragraph",
    "pipeline_config",
    "positive_int",
    "temperature",
]

_FLAGS: dict[str, dict[str, Any]] = {
    "rounds": {"type": int, "metavar": "D"},
    "rollback_points": {"type": int, "metavar": "K"},
    "max_corrections": {"type": int, "metavar": "M"},
    "gate": {"choices": [g.value for g in GateMode]},
    "proposal_samples": {"type": int, "metavar": "N"},
    "proposal_temperature": {"type": float, "metavar": "T"},
    "verify_samples": {"type": int, "metavar": "N"},
}


def _help(setting: str, own: Mapping[str, Any]) -> str:
    field = ReflectConfig.model_fields[setting]
    description = (field.description or "").rstrip(".")
    if setting in own:
        return f"{description} (default {own[setting]} for this command)"
    shown = field.default.value if isinstance(field.default, GateMode) else field.default
    variable = REFLECT_VARIABLES.get(setting)
    return f"{description} (default {shown}" + (f", or {variable})" if variable else ")")


def add_pipeline_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, defaults: Mapping[str, Any] | None = None
) -> None:
    """Add ``--rounds``, ``--rollback-points``, ``--max-corrections``, ``--gate``, ``--proposal-samples``,
    ``--proposal-temperature`` and ``--verify-samples``.
    ``defaults`` are this command's own (they win over the variables); the others stay unset until given."""
    own = dict(defaults or {})
    for setting, options in _FLAGS.items():
        parser.add_argument(
            "--" + setting.replace("_", "-"), default=own.get(setting), help=_help(setting, own), **options
        )


def pipeline_config(args: argparse.Namespace, **settings: Any) -> ReflectConfig:
    """The pipeline's settings: these flags (and ``settings``, a command's other options), then the ``REFLECT_*``
    variables, then the defaults. A bad flag value fails naming the flag."""
    flags = {setting: getattr(args, setting) for setting in _FLAGS if getattr(args, setting, None) is not None}
    try:
        ReflectConfig(**flags)
    except ValidationError as error:
        problems = [
            f"--{'-'.join(map(str, e['loc'])).replace('_', '-')} {e.get('input')!r}: {e['msg']}" for e in error.errors()
        ]
        raise ConfigError("; ".join(problems)) from None
    return ReflectConfig.from_env(**flags, **settings)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def temperature(text: str) -> float:
    """An argparse type: a sampling temperature, from 0 (greedy) to 2."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 2:
        raise argparse.ArgumentTypeError(f"{value} is not a temperature from 0 to 2")
    return value


def add_agent_determinism_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add ``--deterministic-agent`` / ``--no-deterministic-agent`` (read by :func:`agent_is_deterministic`)."""
    parser.add_argument(
        "--deterministic-agent",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the demo agent's replays repeat exactly, so one replay per arm decides a controlled test (default: "
        "only on the embedded local model, or REFLECT_DETERMINISTIC_AGENT; on a remote API each arm runs "
        "--verify-samples replays, temperature 0 not being repeatable there)",
    )


def agent_is_deterministic(args: argparse.Namespace, llm: object) -> bool:
    """Whether the demo agent on ``llm`` replays deterministically: the flag, then ``REFLECT_DETERMINISTIC_AGENT``,
    then whether ``llm`` is the embedded local server (whose backend says ``repeatable``), greedy and one request at
    a time. A remote endpoint at temperature 0 is not assumed repeatable: batching and load change its replies."""
    told = getattr(args, "deterministic_agent", None)
    if told is None:
        told = settings().deterministic_agent
    if told is not None:
        return bool(told)
    return getattr(llm, "repeatable", False) is True


def add_replay_config_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, help: str) -> None:
    """Add ``--replay-config FILE``: the TOML file naming each agent's HTTP replay endpoint (the command's ``help``)."""
    parser.add_argument("--replay-config", type=Path, metavar="FILE", help=help)


def add_export_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, help: str) -> None:
    """Add ``--export NAME``, repeatable: the record exporters to send records to besides the store."""
    parser.add_argument("--export", action="append", default=[], metavar="NAME", help=help)


class SkippedLines:
    """A ``skipped`` callback for :func:`~reflect_otel.reading.tracefile.good_trace_rows`: each line of a trace
    file that is not a trace is said on stderr (after ``said_as``) as it is met, and kept in ``errors``."""

    def __init__(self, said_as: str = "") -> None:
        self.said_as = said_as
        self.errors: list[InputError] = []

    def __call__(self, error: InputError) -> None:
        self.errors.append(error)
        print(f"{self.said_as}skipped: {error}", file=sys.stderr)


def paragraph(text: str) -> str:
    """``text``, written over several source lines, as one line: its words joined by single spaces (argparse wraps
    it to the terminal)."""
    return " ".join(text.split())
