"""The ``reflect-otel`` command: the composition root that wires the built-in parts by import.

Each command module has ``add_<name>_command(subparsers)``, which adds one subparser and sets ``handler`` on it:
``handler(args) -> int`` returns the exit code and may raise :class:`ReflectError` for a clean one-line error
(exit 2). No command prints a traceback: an ``OSError`` is one line naming the file (exit 2), anything else is
reported as a bug (exit 70; ``-v`` prints the traceback).
Third-party commands register the same function under the entry-point group ``reflect_otel.commands``.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, cast

from reflect_otel import plugins
from reflect_otel.errors import ReflectError
from reflect_otel.settings import check_environment

__all__ = ["EXAMPLES", "INTERNAL_ERROR", "build_parser", "main"]

INTERNAL_ERROR = 70
"""The exit code of a bug (``EX_SOFTWARE``); 2 is a usage or input error, 1 a partial failure."""

EXAMPLES: dict[str, tuple[str, ...]] = {
    "attribute": (
        "reflect-otel attribute traces.jsonl --method evidence -o records.jsonl   # no model needed",
        "REFLECT_LLM_BASE_URL=http://127.0.0.1:8080/v1 REFLECT_LLM_MODEL=m reflect-otel attribute traces.jsonl "
        "-o records.jsonl",
        "reflect-otel attribute --pending --store reflect.duckdb   # the runs 'collect --attribute' left waiting",
    ),
    "collect": (
        "reflect-otel collect -o traces.jsonl   # then OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces",
        "reflect-otel collect --attribute -o traces.jsonl --replay-config replay.toml --export otlp",
    ),
    "demo": ("reflect-otel demo", "reflect-otel demo --questions nt-1,nt-3 --agent sql"),
    "demo-agent": ("reflect-otel demo-agent --questions nt-1 --no-expected --duration 600",),
    "eval": ("reflect-otel eval --benchmark bbm --method reflect --data ../data -o runs/bbm-reflect --limit 20",),
    "eval-compare": ("reflect-otel eval-compare benchmarks/results/bbm-qwen2.5-coder-1.5b --chart chart.svg",),
    "import": (
        "reflect-otel import --example -o traces.jsonl",
        "reflect-otel import export.json runs/ -o traces.jsonl",
    ),
    "replay": (
        """reflect-otel replay a0096688 --step 1 --call 'filter_rows({"column": "C", "op": "=", "table": "t0", "value": "2"})'""",
        "reflect-otel replay a0096688 --step 1 --resample 3",
        """reflect-otel replay 66a4e05 --step 2 --call 'query({"sql": "SELECT 1"})' --replay-config replay.toml""",
    ),
    "report": ("reflect-otel report 66a4e05 -o report.html   # a prefix of the trace id is enough",),
    "settings": ("reflect-otel settings", "reflect-otel settings --markdown"),
    "show": (
        "reflect-otel show traces.jsonl",
        "reflect-otel show traces.jsonl --records records.jsonl --trace-id 66a4",
    ),
    "sql": ('reflect-otel sql "SELECT * FROM error_types"', 'reflect-otel sql "SELECT * FROM verdicts" --json'),
    "stats": ("reflect-otel stats", "reflect-otel stats --store runs.duckdb"),
    "worker": ("reflect-otel worker --store postgresql://reflect@db:5432/reflect",),
}
"""What each built-in command's help ends with: how it is typed."""


class _Formatter(argparse.HelpFormatter):
    """Wraps descriptions as usual, and keeps the examples' lines as they are."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    """Errors in one line that points to ``--help`` (argparse prints the whole usage first, 17 lines for
    ``attribute``), and a mistyped choice, command or option is answered with the nearest right one."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        names = [str(choice) for choice in action.choices]
        close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"choose from {', '.join(names)}"
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} ({hint})")

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        """``extras`` (options this parser does not take) refused, with the nearest option it takes."""
        options = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        hints = []
        for extra in extras:
            close = difflib.get_close_matches(extra.split("=", 1)[0], options, n=1, cutoff=0.6)
            if close and extra.startswith("-"):
                hints.append(f"{extra}: did you mean {close[0]}?")
        self.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))


def _builtin_commands() -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    # imported here so that ``import reflect_otel`` stays light; the commands import their edges themselves
    from reflect_otel.cli.attribute import add_attribute_command
    from reflect_otel.cli.collect import add_collect_command, add_import_command
    from reflect_otel.cli.demo import add_demo_command
    from reflect_otel.cli.demo_agent import add_demo_agent_command
    from reflect_otel.cli.evaluate import add_eval_command, add_eval_compare_command
    from reflect_otel.cli.replay import add_replay_command
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
        add_replay_command,
        add_report_command,
        add_settings_command,
        add_show_command,
        add_sql_command,
        add_stats_command,
        add_worker_command,
    ]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reflect-otel")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="reflect-otel",
        description="Find which step of a failed LLM-agent run caused the failure, from its OpenTelemetry spans.",
        epilog="examples:\n  reflect-otel import --example -o traces.jsonl\n  reflect-otel show traces.jsonl\n  "
        "reflect-otel attribute traces.jsonl --method evidence -o records.jsonl\n  reflect-otel COMMAND --help",
        formatter_class=_Formatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    parser.add_argument("--version", action="version", version=f"reflect-otel {_version()}")
    # every command's parser is a _Parser (argparse makes them of the main parser's class)
    subparsers = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]", parser.add_subparsers(dest="command", metavar="COMMAND")
    )
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
    for name, command in subparsers.choices.items():
        command.formatter_class = _Formatter
        if name in EXAMPLES:
            command.epilog = "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])
        if "-v" not in command._option_string_actions:  # -v after the command too, as before it
            command.add_argument(
                "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log debug detail to stderr"
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = _subparsers(parser).get(getattr(args, "command", None) or "", parser)
        if isinstance(command, _Parser):
            command.unrecognized(extras)
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
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
