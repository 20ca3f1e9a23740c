"""What the subcommands share: where the coordinator and the data live, help text, and how errors are printed.

Every command that talks to a coordinator finds it the same way: ``--url``,
else ``$STOCKADE_URL``, else the files in the data directory (``--data-dir``,
else ``$STOCKADE_DATA``, else the user's state directory,
``$XDG_STATE_HOME/stockade``, by default ``~/.local/state/stockade``). An
``http(s)://`` url is a `stockade serve`, whose bearer token comes from
``$STOCKADE_AUTH_TOKEN`` (the client reads it).

Why not the working directory: a cron job's working directory is an
accident, and ``./stockade-data`` (the old default) gave two jobs run
from two directories two coordinators, each granting the same lock. The
default is now one place per user; a ``./stockade-data`` holding a
coordinator in the working directory is refused unless named (`LegacyDataDir`),
so an upgrade never silently moves a job to a fresh coordinator either.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from stockade.coordinators.registry import coordinator_backend
from stockade.core.errors import InvalidArgument, StockadeError
from stockade.transport.sqlite_url import sqlite_path, sqlite_url

if TYPE_CHECKING:
    from stockade.client import Coordinator, FencedStore

__all__ = [
    "add_data_dir", "add_url", "data_dir", "coordinator_url", "local_dir", "child_env", "store_url", "is_remote",
    "open_coordinator", "open_default_store", "fail", "help_text", "DATA_DIR_ENV", "URL_ENV",
    "default_data_dir", "LEGACY_DATA_DIR", "LegacyDataDir", "announce_created",
]

DATA_DIR_ENV = "STOCKADE_DATA"
DATA_DIR_DEFAULT_SHOWN = "$XDG_STATE_HOME/stockade, by default ~/.local/state/stockade"
LEGACY_DATA_DIR = "stockade-data"  # the old default, relative to the working directory
URL_ENV = "STOCKADE_URL"
_LITERAL = re.compile(r"``(.+?)``|`([^`\n]+)`")


def help_text(doc: str | None) -> str:
    """A module docstring as argparse shows it: ``code`` plain, `a name` in single quotes, no backquotes."""
    return _LITERAL.sub(lambda m: m.group(1) or f"'{m.group(2)}'", doc or "")


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"directory of coord.db and store.db (default: ${DATA_DIR_ENV}, else {DATA_DIR_DEFAULT_SHOWN})",
    )


def add_url(parser: argparse.ArgumentParser, default: str = "the data directory's coord.db", *,
            any_coordinator: bool = True) -> None:
    """``--url``: any coordinator's url, or (``any_coordinator=False``: a store's) a server's or a local file's."""
    others = (", sqlite:///PATH/coord.db, postgresql://..., etcd://H1:2379,... or zookeeper://H1:2181,..."
              if any_coordinator else ", or sqlite:///PATH/coord.db")
    parser.add_argument(
        "--url", default=None,
        help=f"the coordinator: http://HOST:PORT of a 'stockade serve' (its port is 7390 by default){others} "
             f"(default: ${URL_ENV}, else {default}); a bearer token comes from $STOCKADE_AUTH_TOKEN",
    )


class LegacyDataDir(InvalidArgument):
    """No data directory was named, and ``./stockade-data`` in the working directory holds a coordinator.

    That was the old default. Using it would make the coordinator
    depend on the working directory again; ignoring it would move its users to
    a fresh coordinator without a word (two coordinators, one lock). So the
    command refuses and names both: the user picks with ``--data-dir``.
    """

    def __init__(self, legacy: Path, default: Path) -> None:
        self.legacy = legacy
        self.default = default
        move = "" if default.exists() else f", or move it to the default: mv {legacy} {default}"
        super().__init__(
            "data_dir",
            f"{legacy} in the working directory holds a coordinator (the old default data directory); "
            f"the default is now {default}, the same from every directory. Name the one you mean: "
            f"--data-dir {legacy} (or ${DATA_DIR_ENV}={legacy.resolve()}){move}",
        )


def default_data_dir() -> Path:
    """The per-user data directory: ``$XDG_STATE_HOME/stockade``, else ``~/.local/state/stockade``.

    As the XDG Base Directory specification says, a relative
    ``$XDG_STATE_HOME`` is ignored: a relative path would depend on the
    working directory, which is what this default exists to avoid.
    """
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "stockade"


def data_dir(args: argparse.Namespace) -> Path:
    """``--data-dir``, else ``$STOCKADE_DATA``, else `default_data_dir`.

    Raises:
        LegacyDataDir: neither was given and ``./stockade-data/coord.db`` exists.
    """
    given = getattr(args, "data_dir", None) or os.environ.get(DATA_DIR_ENV)
    if given:
        return Path(given)
    default = default_data_dir()
    legacy = Path(LEGACY_DATA_DIR)
    if (legacy / "coord.db").exists() and not _same_directory(legacy, default):
        raise LegacyDataDir(legacy, default)
    return default


def _same_directory(a: Path, b: Path) -> bool:
    try:
        return b.exists() and a.samefile(b)
    except OSError:
        return False


ANNOUNCE_HINT = "other hosts reach it through 'stockade serve' and --url"


def announce_created(url: str, hint: str = ANNOUNCE_HINT, *, prefix: str = "stockade",
                     stream: TextIO | None = None) -> Callable[[], None]:
    """Call before opening ``url``; the returned function prints one line if that created the coordinator file.

    A coordinator made where none was expected is how two jobs end up with
    two locks: so creating one is never silent. The line goes to ``stream``
    (default stderr, out of a command's output).
    """
    path = local_file(url)
    if path is None or path.exists():
        return lambda: None

    def announce() -> None:
        if path.exists():
            print(f"{prefix}: created a new coordinator at {path.resolve()} ({hint})", file=stream or sys.stderr,
                  flush=True)

    return announce


def coordinator_url(args: argparse.Namespace) -> str:
    """The coordinator's url: a flag before the environment, the url before the data directory.

    ``--url``, else ``--data-dir``'s ``coord.db``, else ``$STOCKADE_URL``, else
    ``$STOCKADE_DATA``'s (or `default_data_dir`'s) ``coord.db``. So a command
    run by ``stockade lock`` (which sets both variables) reaches the same
    coordinator, and a ``--data-dir`` given inside it still wins.
    """
    url: str | None = getattr(args, "url", None)
    if url:
        return url
    if getattr(args, "data_dir", None) is None and os.environ.get(URL_ENV):
        return os.environ[URL_ENV]
    return sqlite_url(data_dir(args) / "coord.db")


def local_dir(url: str) -> Path | None:
    """The directory of a ``sqlite://`` coordinator url (None for a server)."""
    path = local_file(url)
    return None if path is None else path.parent


def local_file(url: str) -> Path | None:
    """The coordinator file a ``sqlite://`` url names, its query left out (None for a server)."""
    if url.startswith("sqlite://"):
        backend, location = coordinator_backend(url)
        return sqlite_path(backend.url_query(location)[0])
    return None


def child_env(url: str) -> dict[str, str]:
    """What a command run under a lease is told about its coordinator: ``$STOCKADE_URL`` (and ``$STOCKADE_DATA``)."""
    env = {URL_ENV: url}
    directory = local_dir(url)
    if directory is not None:
        env[DATA_DIR_ENV] = str(directory)
    return env


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def store_url(args: argparse.Namespace, coord_url: str) -> str:
    """The fenced store that goes with ``coord_url``: the same server, or ``store.db`` beside ``coord.db``."""
    if is_remote(coord_url):
        return coord_url
    return sqlite_url((local_dir(coord_url) or data_dir(args)) / "store.db")


def open_coordinator(args: argparse.Namespace) -> Coordinator:
    from stockade.client import connect  # on use: a command that serves or only reads files never loads the client

    return connect(coordinator_url(args))


def open_default_store(args: argparse.Namespace, coord: Coordinator) -> FencedStore:
    from stockade.client import open_store

    return open_store(store_url(args, coordinator_url(args)), cluster_id=coord.cluster_id)


def fail(message: str, code: int = 1) -> int:
    print(f"stockade: {message}", file=sys.stderr)
    return code


EXIT_REFUSED = 1  # the backend or the resource refused or could not be reached
EXIT_USAGE = 2  # bad input: an option, a url, a name; nothing was done


def exit_code(exc: StockadeError) -> int:
    """Every command's exit code for a typed error: 2 for bad input, 1 for the rest."""
    return EXIT_USAGE if exc.code == "invalid-argument" else EXIT_REFUSED


def refuse(exc: StockadeError) -> int:
    """Say ``exc`` in one line (whatever a driver's message spans) and return its exit code."""
    return fail(" ".join(str(exc).split()), exit_code(exc))
