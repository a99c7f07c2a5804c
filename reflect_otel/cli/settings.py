"""``reflect-otel settings``: every ``REFLECT_*`` variable, its default, what it sets and its value here."""

from __future__ import annotations

import argparse
import os

from reflect_otel.settings import variables, variables_markdown

__all__ = ["add_settings_command"]

_SECRET = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def _shown(name: str) -> str:
    value = next((os.environ[n] for n in name.split(" / ") if os.environ.get(n)), None)
    if value is None:
        return "-"
    return "(set, hidden)" if any(word in name for word in _SECRET) else value


def _settings(args: argparse.Namespace) -> int:
    if args.markdown:
        print(variables_markdown())
        return 0
    for variable in variables():
        print(f"{variable.name}\n    value: {_shown(variable.name)}   default: {variable.default}")
        print(f"    {variable.description}")
    return 0


def add_settings_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "settings",
        help="list every REFLECT_* variable with its default and its value here (checked first: a bad value "
        "fails naming the variable)",
        description="Every environment variable reflect-otel reads, its default, what it sets, and the value it "
        "has in this environment (keys hidden). Every command checks them all before it starts.",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print the table as Markdown (the one in docs/settings.md)"
    )
    parser.set_defaults(handler=_settings)
