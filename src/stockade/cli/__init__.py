"""The ``stockade`` command. Each subcommand is a module with ``run(argv) -> int``.

Subcommands are imported only when chosen, so ``stockade lock`` starts fast.

The global options ``--url URL`` and ``--data-dir DIR`` may come before the
command as well as after it (``stockade --data-dir D history X``); given
before, they are handed to the command as if written after it, so the two
spellings mean the same. A command that takes no such option refuses it in
either place. Given in both places, the one after the command wins.
"""

from __future__ import annotations

import importlib
import sys

from stockade.cli._common import exit_code
from stockade.core.errors import StockadeError

__all__ = ["main"]

# The options every command that reaches a coordinator shares (see the module docstring).
GLOBAL_OPTIONS = ("--url", "--data-dir")

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("stockade.cli.demo", "the zombie-leader story, live, with real processes"),
    "lock": ("stockade.cli.lock", "run a command while holding a lease (token in STOCKADE_TOKEN)"),
    "kv": ("stockade.cli.kv", "get, put or delete a value of the fenced store (token from STOCKADE_TOKEN)"),
    "status": ("stockade.cli.status", "leases, holders, tokens and high-water marks"),
    "history": ("stockade.cli.history", "a scope's last grants, expiries, releases and refused writes"),
    "serve": ("stockade.cli.serve", "the coordinator and the fenced store over HTTP"),
    "ui": ("stockade.cli.ui", "the dashboard, served locally, read-only, for any coordinator url"),
    "sim": ("stockade.cli.sim", "deterministic simulation of the protocol under faults"),
    "floor": ("stockade.cli.floor", "after a resource failover or restore, raise its marks to the issued tokens"),
    "keys": ("stockade.cli.keys", "show or rotate the keys that sign tokens (docs/tokens.md)"),
    "bench": ("stockade.cli.bench", "lock cycles and fenced writes per second, p50/p99, 1 and N clients"),
    "etcd": ("stockade.cli.etcd", "after an etcd snapshot restore, advance its revision past every issued token"),
    "check": ("stockade.cli.check", "run the failure cases of fencing against your own coordinator and resource"),
}


# The global options each command takes; the others it refuses, before or after its name.
TAKES: dict[str, tuple[str, ...]] = {
    "demo": GLOBAL_OPTIONS, "lock": GLOBAL_OPTIONS, "kv": GLOBAL_OPTIONS, "status": GLOBAL_OPTIONS,
    "history": GLOBAL_OPTIONS, "serve": ("--data-dir",), "sim": (), "floor": GLOBAL_OPTIONS,
    "keys": ("--data-dir",), "bench": GLOBAL_OPTIONS, "etcd": ("--url",), "check": (), "ui": GLOBAL_OPTIONS,
}


def _usage() -> str:
    lines = ["usage: stockade [--url URL] [--data-dir DIR] COMMAND [ARGS...]", "       stockade --version", "",
             "commands:"]
    lines += [f"  {name:<8} {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    lines += ["", "'stockade COMMAND --help' describes one command; --url and --data-dir may come before or after it."]
    return "\n".join(lines)


def _leading_options(args: list[str]) -> tuple[list[str], list[str]] | str:
    """Split ``[OPTION VALUE ...] COMMAND ...`` into the global options and the rest, or say what is wrong."""
    options: list[str] = []
    index = 0
    while index < len(args) and args[index].startswith("--") and args[index] not in ("--help", "--version"):
        name, equals, value = args[index].partition("=")
        if name not in GLOBAL_OPTIONS:
            return f"unknown option {name!r} before the command (the global options are {', '.join(GLOBAL_OPTIONS)})"
        if not equals:
            if index + 1 >= len(args):
                return f"{name} needs a value"
            value = args[index + 1]
            index += 1
        options += [name, value]
        index += 1
    return options, args[index:]


def _version() -> str:
    # The version of the code that is running, not of whatever distribution
    # metadata is installed (an editable install or PYTHONPATH may differ).
    from stockade import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    split = _leading_options(args)
    if isinstance(split, str):
        print(f"stockade: {split}\n\n{_usage()}", file=sys.stderr)
        return 2
    options, args = split
    if options and not args:
        print(f"stockade: a command is needed after {options[0]}\n\n{_usage()}", file=sys.stderr)
        return 2
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"stockade {_version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"stockade: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    refused = [option for option in options[::2] if option not in TAKES[name]]
    if refused:
        print(f"stockade {name}: takes no {refused[0]}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        # Before the command's own arguments: argparse lets a later repeat win, so one after the name does.
        return int(module.run([*options, *rest]))
    except StockadeError as exc:  # one line, never a traceback (e.g. `LegacyDataDir` from any command)
        print(f"stockade {name}: {exc}", file=sys.stderr)
        return exit_code(exc)
