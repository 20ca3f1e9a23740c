"""A Python worker taking its turn on a scope: the twin of examples/worker.ts (same arguments, same output).

    python examples/python_worker.py --url http://127.0.0.1:7390 --scope orders --target store --value from-python
    python examples/python_worker.py --url ... --target pg --pg postgresql://... --value from-python

With --pause it stops between the grant and the write until a line arrives on stdin (the tests freeze it
there with SIGSTOP). The write names the token, not the lease, so it is sent even if the lease was lost
meanwhile: the resource decides. With --pause-inside (pg) it stops inside its fenced transaction instead,
after its UPDATE, printing "in-transaction". Prints "acquired <value>", then "accepted" or "refused <Error>".
"""

from __future__ import annotations

import argparse
import os
import sys

import stockade


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--pg")
    parser.add_argument("--scope", default="orders")
    parser.add_argument("--target", choices=("store", "pg"), default="store")
    parser.add_argument("--value", default="from-python")
    parser.add_argument("--ttl-ms", type=int, default=300)
    parser.add_argument("--wait-ms", type=int, default=10_000)
    parser.add_argument("--pause", action="store_true")
    parser.add_argument("--pause-inside", action="store_true")
    parser.add_argument("--no-fence", action="store_true")
    args = parser.parse_args()
    auth = os.environ.get("STOCKADE_AUTH_TOKEN") or None
    coord = stockade.connect(args.url, auth_token=auth)
    store = stockade.open_store(args.url, auth_token=auth) if args.target == "store" else None
    conn = None
    if args.target == "pg":
        import psycopg

        conn = psycopg.connect(args.pg, autocommit=True)
    lease = coord.acquire(args.scope, ttl_ms=args.ttl_ms, wait_ms=args.wait_ms)
    print(f"acquired {lease.token.value}", flush=True)
    if args.pause:
        sys.stdin.readline()
    update = "UPDATE shared SET value = %s, token_value = %s WHERE id = 1"
    try:
        if store is not None:
            store.put(args.scope, "shared", args.value, token=lease.token)
        elif args.no_fence:  # the control: the same transaction without the fence
            with conn.transaction():
                conn.execute(update, (args.value, lease.token.value))
        else:
            from stockade.resources.postgres import fenced

            with fenced(conn, lease.token):
                conn.execute(update, (args.value, lease.token.value))
                if args.pause_inside:
                    print("in-transaction", flush=True)
                    sys.stdin.readline()
        print("accepted", flush=True)
    except stockade.FenceRejected as error:
        print(f"refused {type(error).__name__}", flush=True)
    finally:
        try:
            lease.release()
        except stockade.StockadeError:
            pass
        coord.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
