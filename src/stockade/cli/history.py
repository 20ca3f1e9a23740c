"""``stockade history SCOPE``: the scope's last grants, expiries and releases, and the store's refusals.

The coordinator is --url (http://HOST:PORT of a `stockade serve`,
sqlite:///PATH/coord.db, postgresql://..., etcd://H1:2379,... or
zookeeper://H1:2181,...), else --data-dir, else $STOCKADE_URL, else the data
directory ($STOCKADE_DATA, else ~/.local/state/stockade or
$XDG_STATE_HOME/stockade). A local file is read
read-only: nothing is created. Its journal keeps the last
100 events per scope, each written in the commit of the change it records
(docs/history.md). The fenced store's refusals of stale or foreign tokens are
in the store's own journal: they are read from store.db beside a local
coord.db, or from --store-file (a server's DATA_DIR/store.db on its host),
read-only, and shown among the coordinator's events in time order.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from stockade.cli._common import add_data_dir, add_url, coordinator_url, fail, help_text, local_dir, local_file, refuse
from stockade.cli._readonly import check_store_file, read_history
from stockade.coordinators.journal import HISTORY_PER_SCOPE, HistoryEvent
from stockade.core.errors import BackendUnavailable, InvalidArgument, StockadeError
from stockade.core.limits import validate_scope


def _when(at_unix_ms: int) -> str:
    seconds, ms = divmod(at_unix_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def _line(event: HistoryEvent, source: str) -> str:
    who = f"holder {event.holder}" if event.holder else event.detail
    return f"{_when(event.at_unix_ms)}  {event.kind:<8} token {event.token_value:<20} {who}  ({source})"


def _coordinator_events(url: str, scope: str, limit: int) -> list[HistoryEvent]:
    """The coordinator's journal: a local file read-only (nothing written or created), else through the client."""
    path = local_file(url)
    if path is not None:
        if not path.is_file():
            raise BackendUnavailable(f"no coordinator at {path} (use --url, --data-dir, $STOCKADE_URL or "
                                     f"$STOCKADE_DATA)")
        events, note = read_history(path, scope, limit)
        if note:
            print(f"note: {note}", file=sys.stderr)
        return events
    if url.startswith("memory://"):
        raise InvalidArgument("url", "a memory:// coordinator lives inside one process: ask it with coord.history()")
    from stockade.client import connect

    coord = connect(url)
    try:
        return coord.history(scope, limit=limit)
    finally:
        coord.close()


def _events(url: str, scope: str, limit: int, store_file: Path | None) -> list[tuple[HistoryEvent, str]]:
    from stockade.resources.store._sqlite_journal import rejections

    events = [(event, "coordinator") for event in _coordinator_events(url, scope, limit)]
    directory = local_dir(url)
    if store_file is None and directory is not None and (directory / "store.db").is_file():
        store_file = directory / "store.db"
    if store_file is not None:
        check_store_file(store_file)  # the wrong file named is an error, not an empty journal
        events += [(event, "store") for event in rejections(store_file, scope, limit)]
    events.sort(key=lambda pair: (pair[0].at_unix_ms, pair[1] == "store", pair[0].seq))
    return events[-limit:]


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stockade history", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scope", help="the scope (lock name)")
    add_url(parser)
    add_data_dir(parser)
    parser.add_argument("--limit", type=int, default=HISTORY_PER_SCOPE,
                        help=f"the last this many events (1..{HISTORY_PER_SCOPE}; default {HISTORY_PER_SCOPE})")
    parser.add_argument("--store-file", type=Path, default=None,
                        help="a store file whose refusals to show (default: store.db beside a local coord.db)")
    parser.add_argument("--json", action="store_true", help="one JSON object per event")
    parser.add_argument("--html", type=Path, default=None,
                        help="also write the events as a timeline: one self-contained HTML file (docs/check.md)")
    args = parser.parse_args(argv)
    try:
        scope = validate_scope(args.scope)
        if not 1 <= args.limit <= HISTORY_PER_SCOPE:
            return fail(f"--limit must be in 1..{HISTORY_PER_SCOPE}", 2)
        if args.store_file is not None and not args.store_file.is_file():
            return fail(f"{args.store_file}: no such store file", 2)
        events = _events(coordinator_url(args), scope, args.limit, args.store_file)
        if args.html is not None:
            from stockade.cli._history_html import write_timeline

            write_timeline(args.html, scope, events)
    except StockadeError as exc:
        return refuse(exc)
    for event, source in events:
        if args.json:
            print(json.dumps({**event.as_json(), "source": source}))
        else:
            print(_line(event, source))
    if not events and not args.json:
        print(f"no events recorded for {scope!r}")
    return 0
