"""``stockade lock NAME -- CMD...``: run CMD while holding a lease on NAME.

CMD gets the encoded fencing token in STOCKADE_TOKEN (and STOCKADE_SCOPE,
STOCKADE_TOKEN_VALUE, STOCKADE_DATA). A keepalive renews the lease at about
TTL/3. If the lease is lost, CMD's process group gets SIGTERM, then SIGKILL
after --grace-ms.

Exit status: CMD's own (128+N if a signal N ended it); 75 if the lease could
not be acquired within --wait-ms; 76 if the lease was lost and CMD still
exited 0 (a lost lease never reads as success); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from stockade.cli._common import DATA_DIR_ENV, add_data_dir, data_dir, fail, open_coordinator
from stockade.core.errors import LockTimeout, StockadeError

EXIT_LOCK_TIMEOUT = 75
EXIT_LEASE_LOST = 76
POLL_MS = 50


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stockade lock", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", help="the scope to lock")
    parser.add_argument("--ttl-ms", type=int, default=10_000, help="lease TTL (default 10000)")
    parser.add_argument("--wait-ms", type=int, default=0, help="how long to wait for the lease (default 0)")
    parser.add_argument("--grace-ms", type=int, default=5_000, help="SIGTERM to SIGKILL delay (default 5000)")
    parser.add_argument("--holder", default=None, help="holder name shown in status (default host:pid)")
    add_data_dir(parser)
    parser.usage = "stockade lock NAME [--ttl-ms MS] [--wait-ms MS] [--grace-ms MS] [--holder H] -- CMD [ARGS...]"
    if "--" not in argv:
        parser.error("missing '-- CMD [ARGS...]'")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        parser.error("missing command after '--'")
    if not 0 <= args.grace_ms <= 600_000:
        parser.error("--grace-ms must be in 0..600000")
    try:
        coord = open_coordinator(args)
        lease = coord.acquire(args.name, ttl_ms=args.ttl_ms, wait_ms=args.wait_ms, holder=args.holder)
    except LockTimeout as exc:
        return fail(str(exc), EXIT_LOCK_TIMEOUT)
    except StockadeError as exc:
        return fail(str(exc), 2 if exc.code == "invalid-argument" else 1)

    env = dict(os.environ)
    env.update(
        STOCKADE_TOKEN=lease.token.encode(),
        STOCKADE_SCOPE=lease.scope,
        STOCKADE_TOKEN_VALUE=str(lease.token.value),
    )
    env[DATA_DIR_ENV] = str(data_dir(args))
    forwarded: list[int] = []
    try:
        child = subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as exc:
        lease.release()
        return fail(f"cannot run {command[0]!r}: {exc}", 127)

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        _signal_group(child, signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    lost = False
    try:
        while child.poll() is None:
            if lease.wait_lost(timeout_ms=POLL_MS):
                lost = True
                print(f"stockade: lease on {args.name!r} lost ({lease.lost_cause}); stopping command", file=sys.stderr)
                _stop(child, args.grace_ms)
                break
        returncode = child.wait()
        lost = lost or lease.lost  # lost while CMD was finishing: still not a success
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        try:
            lease.release()
        except StockadeError as exc:
            print(f"stockade: release failed ({exc}); the lease expires by TTL", file=sys.stderr)
    status = _exit_status(returncode)
    if lost and status == 0:
        return EXIT_LEASE_LOST
    return status


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:
        pass


def _stop(child: subprocess.Popen[bytes], grace_ms: int) -> None:
    _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace_ms / 1000
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if child.poll() is None:
        _signal_group(child, signal.SIGKILL)
