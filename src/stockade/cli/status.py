"""``stockade status``: leases, holders, tokens and high-water marks.

The coordinator is --url (http://HOST:PORT of a `stockade serve`,
sqlite:///PATH/coord.db, postgresql://..., etcd://H1:P1,H2:P2[/NAMESPACE] or
zookeeper://H1:2181,...),
else --data-dir, else $STOCKADE_URL, else the data directory ($STOCKADE_DATA, else
$XDG_STATE_HOME/stockade, by default ~/.local/state/stockade).

A local coordinator's and store's files are read read-only and no file is
created, so status works on a read-only data directory and on a full disk.
A server is asked over HTTP (bearer token from $STOCKADE_AUTH_TOKEN): its
scopes page by page, and the high-water mark of each scope shown.

With a SCOPE, status shows that scope's contenders instead: its holder first,
then its waiters in the order they will be served (holder names only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stockade.cli._common import (
    add_data_dir,
    add_url,
    coordinator_url,
    fail,
    help_text,
    is_remote,
    local_dir,
    local_file,
    refuse,
)
from stockade.cli._readonly import read_contenders, read_coordinator, read_high_waters
from stockade.clock import SystemClock
from stockade.core.errors import BackendUnavailable, StockadeError
from stockade.core.leases import Contender, ScopeInfo
from stockade.core.limits import CONTENDERS_MAX, LIST_PAGE_MAX, validate_scope

SCOPES_SHOWN_MAX = 10_000
REMOTE_HIGH_WATERS_MAX = 1_000  # one request each: beyond this many scopes, the marks are left out


def _remote(url: str) -> tuple[str, list[ScopeInfo], dict[str, int], list[str | None]]:
    """The cluster id, the first scopes and their marks of the server at ``url``.

    Raises:
        StockadeError: the server cannot be reached or refused the request.
    """
    from stockade.client import open_store

    cluster_id, infos = _scopes(url)
    notes: list[str | None] = []
    high_waters: dict[str, int] = {}
    store = open_store(url)
    try:
        for info in infos[:REMOTE_HIGH_WATERS_MAX]:
            high_waters[info.scope] = store.high_water(info.scope)
    finally:
        store.close()
    if len(infos) > REMOTE_HIGH_WATERS_MAX:
        notes.append(f"high-water marks shown for the first {REMOTE_HIGH_WATERS_MAX} scopes only")
    return cluster_id, infos, high_waters, notes


def _scopes(url: str) -> tuple[str, list[ScopeInfo]]:
    """The cluster id and the first scopes of the coordinator at ``url``, through the client."""
    from stockade.client import connect

    coord = connect(url)
    try:
        infos: list[ScopeInfo] = []
        while len(infos) < SCOPES_SHOWN_MAX:
            page = coord.scopes(after=infos[-1].scope if infos else "",
                                limit=min(LIST_PAGE_MAX, SCOPES_SHOWN_MAX - len(infos)))
            infos += page
            if not page:
                break
        cluster_id = coord.cluster_id
    finally:
        coord.close()
    return cluster_id, infos


def _contenders(url: str, scope: str, coord_file: Path) -> tuple[list[Contender], str | None]:
    """The contenders of ``scope``: a local coordinator file read-only, any other url through the client.

    Raises:
        StockadeError: a bad scope, or the coordinator cannot be read.
    """
    validate_scope(scope)
    if local_file(url) is not None:
        if not coord_file.is_file():
            raise BackendUnavailable(f"no coordinator at {coord_file}", certain_no_effect=True)
        return read_contenders(coord_file, SystemClock().now_ns(), scope, CONTENDERS_MAX)
    from stockade.client import connect

    coord = connect(url)
    try:
        return coord.contenders(scope), None
    finally:
        coord.close()


def _show_contenders(url: str, scope: str, coord_file: Path, as_json: bool) -> int:
    try:
        line, note = _contenders(url, scope, coord_file)
    except StockadeError as exc:
        return fail(str(exc))
    if note:
        print(f"stockade: note: {note}", file=sys.stderr)
    if as_json:
        for position, contender in enumerate(line):
            print(json.dumps({"scope": scope, "position": position, "holder": contender.holder,
                              "holding": contender.holding}))
        return 0
    waiting = sum(not c.holding for c in line)
    print(f"scope {scope}: {'held' if line and line[0].holding else 'not held'}, {waiting} waiting")
    width = max([len("HOLDER")] + [len(c.holder) for c in line])
    print(f"{'#':>4}  {'HOLDER'.ljust(width)}  STATE")
    for position, contender in enumerate(line):
        print(f"{position:>4}  {contender.holder.ljust(width)}  {'holding' if contender.holding else 'waiting'}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stockade status", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_url(parser)
    add_data_dir(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per scope (per contender with SCOPE)")
    parser.add_argument("scope", nargs="?", metavar="SCOPE",
                        help="show this scope's contenders: the holder, then the waiters in serving order")
    return parser


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    url = coordinator_url(args)
    root = local_dir(url)
    coord_file = local_file(url) or Path("coord.db")  # the file the url names, never another beside it
    if args.scope is not None:
        return _show_contenders(url, args.scope, coord_file, args.json)
    high_waters: dict[str, int] = {}
    try:
        if is_remote(url):
            cluster_id, infos, high_waters, notes = _remote(url)
            where = url
        elif url.startswith(("postgresql://", "postgres://")):
            (cluster_id, infos), notes = _scopes(url), []
            where = url.partition("@")[2] or url  # no password on screen
        elif url.startswith(("etcd://", "zookeeper://", "zk://")):  # no store beside it: no marks to show
            (cluster_id, infos), notes = _scopes(url), []
            where = url
        elif root is None:
            return fail(f"status reads a stockade serve (http://...), a sqlite:///, postgresql://, etcd:// or "
                        f"zookeeper:// coordinator, not {url}", 2)
        elif not coord_file.is_file():
            return fail(f"no coordinator at {coord_file} (use --url, --data-dir, $STOCKADE_URL or "
                        f"$STOCKADE_DATA)")
        else:
            # Read-only: no file is written or created, so status works on a read-only
            # mount, in a directory it may only read, and on a full disk.
            snapshot = read_coordinator(coord_file, SystemClock().now_ns(), SCOPES_SHOWN_MAX)
            cluster_id, infos, notes, where = snapshot.cluster_id, snapshot.scopes, [snapshot.note], str(coord_file)
            if (root / "store.db").exists():
                high_waters, note = read_high_waters(root / "store.db")
                notes.append(note)
    except StockadeError as exc:
        return refuse(exc)
    for note in filter(None, notes):
        print(f"stockade: note: {note}", file=sys.stderr)
    rows = [
        {
            "scope": i.scope,
            "state": i.state.value,
            "holder": i.holder,
            "token": i.token.value if i.token else None,
            "last_token": i.last_token,
            "remaining_ms": i.remaining_ms,
            "waiters": i.waiters,
            "high_water": high_waters.get(i.scope),
        }
        for i in infos
    ]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"coordinator {where}  cluster {cluster_id}")
    if not rows:
        print("no scopes yet")
        return 0
    header: tuple[str, ...] = ("SCOPE", "STATE", "HOLDER", "TOKEN", "LAST", "REMAINING", "WAITERS", "HIGH-WATER")
    table: list[tuple[str, ...]] = [header] + [
        (
            str(r["scope"]), str(r["state"]), str(r["holder"] or "-"), str(r["token"] or "-"), str(r["last_token"]),
            f"{r['remaining_ms']} ms" if r["state"] == "held" else "-", str(r["waiters"]),
            "-" if r["high_water"] is None else str(r["high_water"]),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    return 0
