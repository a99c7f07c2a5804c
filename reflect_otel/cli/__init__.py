"""The ``reflect-otel`` command: the composition root that wires the built-in parts by import.

Each command module has ``add_<name>_command(subparsers)``, which adds one subparser and sets ``handler`` on it:
``handler(args) -> int`` returns the exit code and may raise :class:`ReflectError` for a clean one-line error
(exit 2). No command prints a traceback: an ``OSError`` is one line naming the file (exit 2), anything else is
reported as a bug (exit 70; ``-v`` prints the traceback).
Third-party commands register the same function under the entry-point group ``reflect_otel.commands``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Sequence

from reflect_otel import plugins
from reflect_otel.errors import ReflectError
from reflect_otel.settings import check_environment

__all__ = ["INTERNAL_ERROR", "build_parser", "main"]

INTERNAL_ERROR = 70
"""The exit code of a bug (``EX_SOFTWARE``); 2 is a usage or input error, 1 a partial failure."""


def _builtin_commands() -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    # imported here so that ``import reflect_otel`` stays light; the commands import their edges themselves
    from reflect_otel.cli.attribute import add_attribute_command
    from reflect_otel.cli.collect import add_collect_command, add_import_command
    from reflect_otel.cli.demo import add_demo_command
    from reflect_otel.cli.demo_agent import add_demo_agent_command
    from reflect_otel.cli.evaluate import add_eval_command, add_eval_compare_command
    from reflect_otel.cli.settings import add_settings_command
    from reflect_otel.cli.show import add_show_command
    from reflect_otel.cli.store import add_report_command, add_sql_command, add_stats_command
    from reflect_otel.cli.worker import add_worker_command

    return [
        add_attribute_command,
        add_collect_command,
        add_demo_command,
        add_demo_agent_command,
        add_eval_command,
        add_eval_compare_command,
        add_import_command,
        add_report_command,
        add_settings_command,
        add_show_command,
        add_sql_command,
        add_stats_command,
        add_worker_command,
    ]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reflect-otel")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reflect-otel",
        description="Find which step of a failed LLM-agent run caused the failure, from its OpenTelemetry spans.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    parser.add_argument("--version", action="version", version=f"reflect-otel {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _builtin_commands():
        register(subparsers)
    for name in plugins.names(plugins.COMMANDS):
        if name in subparsers.choices:
            continue  # a plugin cannot replace a built-in command
        try:
            plugins.load(plugins.COMMANDS, name)(subparsers)
        except Exception as error:  # a plugin that cannot load (a missing dependency, a bug) must not break the rest
            message = plugins.unloadable(plugins.COMMANDS, name, error)
            logging.getLogger("reflect_otel.plugins").warning("%s", message)
            if name not in subparsers.choices:
                subparsers.add_parser(name, help=f"(unavailable: {message})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        if getattr(args, "checks_environment", True):
            check_environment()  # a bad REFLECT_* variable fails here, named, before any work starts
        return int(handler(args))
    except ReflectError as error:
        print(f"reflect-otel {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"reflect-otel {args.command}: interrupted; files it was writing are left as they were", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head and the like
        sys.stderr.close()
        return 0
    except OSError as error:  # the disk, a permission or a path the checks could not foresee (full disk, a race)
        where = f"{error.filename}: " if error.filename else ""
        print(f"reflect-otel {args.command}: error: {where}{error.strerror or error}", file=sys.stderr)
        return 2
    except Exception as error:  # a bug: one line that says so, the traceback with -v
        if args.verbose:
            traceback.print_exc()
        print(
            f"reflect-otel {args.command}: internal error ({type(error).__name__}: {error}); this is a bug in "
            "reflect-otel: please report it with the output of 'reflect-otel -v ...'",
            file=sys.stderr,
        )
        return INTERNAL_ERROR
