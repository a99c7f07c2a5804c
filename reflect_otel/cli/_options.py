"""The REFLECT pipeline's flags, declared once for every command that runs it (``attribute``, ``eval``, ``demo``).

Help texts and defaults come from :class:`~reflect_otel.config.ReflectConfig`; a command that runs with other
defaults (the demo) passes them and the help says so. A flag left out keeps the setting's variable or default.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from reflect_otel.config import REFLECT_VARIABLES, GateMode, ReflectConfig
from reflect_otel.errors import ConfigError

__all__ = ["add_pipeline_options", "pipeline_config", "positive_int", "temperature"]

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
