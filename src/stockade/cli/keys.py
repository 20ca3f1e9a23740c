"""``stockade keys``: the coordinator's keyring (docs/tokens.md).

    stockade keys show                     # key ids, which one signs, until when the others verify
    stockade keys rotate [--grace-s 604800]  # a new signing key; the old one verifies for --grace-s more

The keyring is ``<data-dir>/coord.keys`` (created with the coordinator). A
running coordinator and the stores that follow the file pick a rotation up
within a second. ``--grace-s 0`` retires the old key at once (it leaked).

keys takes no --url: the keyring is a file on the coordinator's host, read
and rotated there (on a `stockade serve` host, with its --data-dir). No HTTP
route hands out or changes keys, on purpose.
"""

from __future__ import annotations

import argparse
import time

from stockade.cli._common import add_data_dir, data_dir, fail, help_text
from stockade.core.errors import StockadeError
from stockade.keys import ROTATE_GRACE_S_DEFAULT, load_keyring, rotate


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stockade keys", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_dir(parser)
    parser.add_argument("action", choices=("show", "rotate"))
    parser.add_argument("--grace-s", type=int, default=ROTATE_GRACE_S_DEFAULT,
                        help="how long the replaced key still verifies (default: 7 days)")
    args = parser.parse_args(argv)
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
