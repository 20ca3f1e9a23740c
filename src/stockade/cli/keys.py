"""``stockade keys``: the coordinator's keyring (docs/tokens.md).

    stockade keys show                     # key ids, which one signs, until when the others verify
    stockade keys rotate [--grace-s 604800]  # a new signing key; the old one verifies for --grace-s more
    stockade keys export --url http://HOST:7390 --out /etc/app/coord.keys   # a server's keyring, for a resource host

The keyring is ``<data-dir>/coord.keys`` (created with the coordinator). A
running coordinator and the stores that follow the file pick a rotation up
within a second. ``--grace-s 0`` retires the old key at once (it leaked).

show and rotate take no --url: the keyring is a file on the coordinator's
host, read and rotated there (on a `stockade serve` host, with its --data-dir).
export copies a `stockade serve`'s keyring to a resource host, where a fenced
resource verifies tokens with it (``keys="/etc/app/coord.keys"``). The keys can
mint tokens too, so the server hands them out only to an administrator: a
bearer token ($STOCKADE_AUTH_TOKEN) without scope patterns, on a server started
with --auth-tokens. The file is written 0600; export again after a rotation.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from stockade.cli._common import add_data_dir, add_url, coordinator_url, data_dir, fail, help_text, is_remote
from stockade.core.errors import StockadeError
from stockade.keys import ROTATE_GRACE_S_DEFAULT, load_keyring, rotate, save_keyring


def _export(args: argparse.Namespace) -> int:
    from stockade.client import connect

    url = coordinator_url(args)
    if not is_remote(url) or args.out is None:
        return fail("export needs --url http(s)://HOST:PORT of a stockade serve and --out FILE")
    out = Path(args.out)
    try:
        with connect(url) as coord:
            keys = coord.verify_keys()
        save_keyring(out, keys.keyring)  # type: ignore[attr-defined]
    except (StockadeError, OSError) as exc:
        return fail(str(exc))
    print(f"keyring of cluster {keys.cluster_id} written to {out}")  # type: ignore[attr-defined]
    return 0


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stockade keys", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_dir(parser)
    add_url(parser, "none: export only")
    parser.add_argument("action", choices=("show", "rotate", "export"))
    parser.add_argument("--grace-s", type=int, default=ROTATE_GRACE_S_DEFAULT,
                        help="how long the replaced key still verifies (default: 7 days)")
    parser.add_argument("--out", default=None, help="export: the keyring file to write (0600)")
    args = parser.parse_args(argv)
    if args.action == "export":
        return _export(args)
    if args.url is not None:  # the keyring is read and rotated on the coordinator's host, never over HTTP
        parser.error("show and rotate take no --url: run them on the coordinator's host, with --data-dir")
    path = data_dir(args) / "coord.keys"
    if not path.exists():
        return fail(f"no keyring at {path} (it is created with the coordinator; use --data-dir)")
    try:
        keyring = rotate(path, grace_s=args.grace_s) if args.action == "rotate" else load_keyring(path)
    except (StockadeError, OSError) as exc:
        return fail(str(exc))
    now = time.time()
    print(f"keyring {path}  cluster {keyring.cluster_id}")
    for key in keyring.keys:
        if key.verify_until_s is None:
            state = "signs"
        elif key.verify_until_s > now:
            state = f"verifies for {int(key.verify_until_s - now)} s more"
        else:
            state = "retired"
        print(f"  {key.kid}  {state}")
    return 0
