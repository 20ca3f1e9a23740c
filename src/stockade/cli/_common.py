"""What the subcommands share: where the coordinator and the data live, help text, and how errors are printed.

Every command that talks to a coordinator finds it the same way: ``--url``,
else ``$STOCKADE_URL``, else the files in the data directory (``--data-dir``,
else ``$STOCKADE_DATA``, else ``./stockade-data``). An ``http(s)://`` url is a
`stockade serve`, whose bearer token comes from ``$STOCKADE_AUTH_TOKEN`` (the
client reads it).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from stockade.client import Coordinator, FencedStore, connect, open_store

__all__ = [
    "add_data_dir", "add_url", "data_dir", "coordinator_url", "local_dir", "child_env", "store_url", "is_remote",
    "open_coordinator", "open_default_store", "fail", "help_text", "DATA_DIR_ENV", "URL_ENV",
]

DATA_DIR_ENV = "STOCKADE_DATA"
DATA_DIR_DEFAULT = "./stockade-data"
URL_ENV = "STOCKADE_URL"
_LITERAL = re.compile(r"``(.+?)``|`([^`\n]+)`")


def help_text(doc: str | None) -> str:
    """A module docstring as argparse shows it: ``code`` plain, `a name` in single quotes, no backquotes."""
    return _LITERAL.sub(lambda m: m.group(1) or f"'{m.group(2)}'", doc or "")


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"directory of coord.db and store.db (default: ${DATA_DIR_ENV}, else {DATA_DIR_DEFAULT})",
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


def data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir or os.environ.get(DATA_DIR_ENV) or DATA_DIR_DEFAULT)


def coordinator_url(args: argparse.Namespace) -> str:
    """The coordinator's url: a flag before the environment, the url before the data directory.

    ``--url``, else ``--data-dir``'s ``coord.db``, else ``$STOCKADE_URL``, else
    ``$STOCKADE_DATA``'s (or ``./stockade-data``'s) ``coord.db``. So a command
    run by ``stockade lock`` (which sets both variables) reaches the same
    coordinator, and a ``--data-dir`` given inside it still wins.
    """
    url: str | None = getattr(args, "url", None)
    if url:
        return url
    if getattr(args, "data_dir", None) is None and os.environ.get(URL_ENV):
        return os.environ[URL_ENV]
    return f"sqlite://{data_dir(args) / 'coord.db'}"


def local_dir(url: str) -> Path | None:
    """The directory of a ``sqlite://`` coordinator url (None for a server)."""
    path = local_file(url)
    return None if path is None else path.parent


def local_file(url: str) -> Path | None:
    """The coordinator file a ``sqlite://`` url names (None for a server)."""
    if url.startswith("sqlite://"):
        return Path(url.partition("://")[2].partition("?")[0])
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
    return f"sqlite://{(local_dir(coord_url) or data_dir(args)) / 'store.db'}"


def open_coordinator(args: argparse.Namespace) -> Coordinator:
    return connect(coordinator_url(args))


def open_default_store(args: argparse.Namespace, coord: Coordinator) -> FencedStore:
    return open_store(store_url(args, coordinator_url(args)), cluster_id=coord.cluster_id)


def fail(message: str, code: int = 1) -> int:
    print(f"stockade: {message}", file=sys.stderr)
    return code
