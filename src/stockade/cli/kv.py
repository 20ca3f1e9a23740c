"""``stockade kv get|put|delete SCOPE KEY [VALUE|-]``: the fenced store from a shell script.

    stockade lock --url http://127.0.0.1:7390 reports -- sh -c 'stockade kv put reports daily.csv - < out.csv'
    stockade kv get reports daily.csv > daily.csv
    stockade kv delete reports daily.csv --token "$SAVED_TOKEN"

The store is the one of the coordinator: --url (http://HOST:PORT of a
`stockade serve`, or sqlite:///PATH/coord.db for store.db beside it), else
--data-dir, else $STOCKADE_URL, else the data directory ($STOCKADE_DATA, else
$XDG_STATE_HOME/stockade, by default ~/.local/state/stockade). Under `stockade lock`
both variables are set, so a command
writes where its lease came from. A bearer token comes from
$STOCKADE_AUTH_TOKEN.

put and delete need the lease's fencing token: --token, else $STOCKADE_TOKEN
(which `stockade lock` sets). put writes VALUE, or standard input when VALUE
is '-' (at most 1 MiB). get writes the value's bytes to standard output.

A write with a stale token is refused and changes nothing: one line on
stderr names the token and the scope's high-water mark. Never retry it with
the same token; take the lease again, read, reconcile.

Exit status: 0 done; 1 the store could not be reached or refused the
credentials; 2 bad usage or a bad argument (no token, a malformed token, a
bad scope or key, a value over 1 MiB); 3 get: no such key; 4 fenced out: the
token is stale (below the high-water mark); 5 the token belongs to another
scope or another coordinator, or was not issued by it.
"""

from __future__ import annotations

import argparse
import os
import sys

from stockade.cli._common import (
    add_data_dir,
    add_url,
    coordinator_url,
    fail,
    help_text,
    is_remote,
    local_dir,
    refuse,
    store_url,
)
from stockade.core.errors import FenceRejected, InvalidArgument, LimitExceeded, StaleToken, StockadeError
from stockade.core.limits import VALUE_BYTES_MAX

__all__ = ["run", "EXIT_UNAVAILABLE", "EXIT_USAGE", "EXIT_NOT_FOUND", "EXIT_STALE", "EXIT_MISMATCH"]

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_STALE = 4
EXIT_MISMATCH = 5
TOKEN_ENV = "STOCKADE_TOKEN"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stockade kv", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("get", "put", "delete"))
    parser.add_argument("scope", help="the scope (the lock's name)")
    parser.add_argument("key", help="the key within the scope")
    parser.add_argument("value", nargs="?", help="put: the value, or '-' to read it from standard input")
    parser.add_argument("--token", default=None, help=f"the fencing token (default: ${TOKEN_ENV})")
    parser.add_argument("--idempotency-key", default=None,
                        help="put/delete: a retry with the same key returns the first result")
    add_url(parser, any_coordinator=False)
    add_data_dir(parser)
    return parser


def _value(raw: str) -> bytes:
    if raw != "-":
        return os.fsencode(raw)  # the argument's bytes as given, whatever the locale
    data = sys.stdin.buffer.read(VALUE_BYTES_MAX + 1)
    if len(data) > VALUE_BYTES_MAX:
        raise LimitExceeded("value_bytes_max", VALUE_BYTES_MAX, "standard input holds more than the largest value")
    return data


def run(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action == "put" and args.value is None:
        parser.error("put needs a VALUE (or '-' for standard input)")
    if args.action != "put" and args.value is not None:
        parser.error(f"{args.action} takes no VALUE")
    token = args.token or os.environ.get(TOKEN_ENV)
    if args.action != "get" and not token:
        return fail(f"{args.action} needs the lease's fencing token: run it under 'stockade lock' "
                    f"(which sets ${TOKEN_ENV}) or pass --token", EXIT_USAGE)
    try:
        return _run(args, token)
    except StaleToken as exc:
        value = getattr(exc.token, "value", exc.token)
        return fail(f"fenced out: token {value} is below the high-water mark {exc.high_water} of scope {args.scope!r}; "
                    f"nothing was written (a newer lease wrote here: do not retry with this token)", EXIT_STALE)
    except FenceRejected as exc:
        return fail(f"refused: {exc}; nothing was written", EXIT_MISMATCH)
    except (InvalidArgument, LimitExceeded) as exc:
        return fail(str(exc), EXIT_USAGE)
    except StockadeError as exc:
        return refuse(exc)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except BrokenPipeError:
        return EXIT_UNAVAILABLE


def _run(args: argparse.Namespace, token: str | None) -> int:
    from stockade.client import open_store

    url = coordinator_url(args)
    directory = local_dir(url)
    if not is_remote(url) and directory is None:
        return fail(f"kv reaches a stockade serve (http://...) or a sqlite:/// coordinator's store, not {url}",
                    EXIT_USAGE)
    cluster_id = None
    if directory is not None and not (directory / "store.db").exists():
        if args.action == "get":
            return fail(f"no such key: no store at {directory / 'store.db'}", EXIT_NOT_FOUND)
        cluster_id = _local_cluster_id(directory)
        if cluster_id is None:
            return fail(f"no coordinator at {directory / 'coord.db'} (use --url, --data-dir, $STOCKADE_URL "
                        f"or $STOCKADE_DATA)", EXIT_UNAVAILABLE)
    value = _value(args.value) if args.action == "put" else b""
    store = open_store(store_url(args, url), cluster_id=cluster_id)
    try:
        if args.action == "get":
            item = store.get(args.scope, args.key)
            if item is None:
                return fail(f"no such key: {args.scope} {args.key}", EXIT_NOT_FOUND)
            sys.stdout.buffer.write(item.value)
            sys.stdout.buffer.flush()
            return 0
        if args.action == "put":
            result = store.put(args.scope, args.key, value, token=token, idempotency_key=args.idempotency_key)
        else:
            result = store.delete(args.scope, args.key, token=token, idempotency_key=args.idempotency_key)
    finally:
        store.close()
    print(f"{args.action} {args.scope} {args.key}: token {result.token_value}, high-water mark {result.high_water}"
          + (" (replayed)" if result.replayed else ""))
    return 0


def _local_cluster_id(directory: os.PathLike[str]) -> str | None:
    """The cluster id of the coordinator file in ``directory``, read without writing (None if there is none)."""
    from pathlib import Path

    from stockade.cli._readonly import read_coordinator

    path = Path(directory) / "coord.db"
    if not path.exists():
        return None
    return read_coordinator(path, 0, 0).cluster_id
