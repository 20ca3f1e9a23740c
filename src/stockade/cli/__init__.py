"""The ``stockade`` command. Each subcommand is a module with ``run(argv) -> int``.

Subcommands are imported only when chosen, so ``stockade lock`` starts fast.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["main"]

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("stockade.cli.demo", "the zombie-leader story, live, with real processes"),
    "lock": ("stockade.cli.lock", "run a command while holding a lease (token in STOCKADE_TOKEN)"),
    "kv": ("stockade.cli.kv", "get, put or delete a value of the fenced store (token from STOCKADE_TOKEN)"),
    "status": ("stockade.cli.status", "leases, holders, tokens and high-water marks"),
    "history": ("stockade.cli.history", "a scope's last grants, expiries, releases and refused writes"),
    "serve": ("stockade.cli.serve", "the coordinator and the fenced store over HTTP"),
    "sim": ("stockade.cli.sim", "deterministic simulation of the protocol under faults"),
    "floor": ("stockade.cli.floor", "after a resource failover or restore, raise its marks to the issued tokens"),
    "keys": ("stockade.cli.keys", "show or rotate the keys that sign tokens (docs/tokens.md)"),
    "bench": ("stockade.cli.bench", "lock cycles and fenced writes per second, p50/p99, 1 and N clients"),
    "etcd": ("stockade.cli.etcd", "after an etcd snapshot restore, advance its revision past every issued token"),
}


def _usage() -> str:
    lines = ["usage: stockade COMMAND [ARGS...]", "       stockade --version", "", "commands:"]
    lines += [f"  {name:<8} {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    lines += ["", "'stockade COMMAND --help' describes one command."]
    return "\n".join(lines)


def _version() -> str:
    # The version of the code that is running, not of whatever distribution
    # metadata is installed (an editable install or PYTHONPATH may differ).
    from stockade import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
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
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.run(rest))
