"""``stockade lock NAME -- CMD...``: run CMD while holding a lease on NAME.

The coordinator is --url (http://HOST:PORT of a `stockade serve`,
sqlite:///PATH/coord.db, postgresql://..., etcd://H1:2379,... or
zookeeper://H1:2181,...), else --data-dir, else $STOCKADE_URL, else the data
directory ($STOCKADE_DATA, else $XDG_STATE_HOME/stockade, by default
~/.local/state/stockade: the same from every working directory; creating a
coordinator there prints one line naming it). CMD gets the encoded fencing
token in STOCKADE_TOKEN (and STOCKADE_SCOPE, STOCKADE_TOKEN_VALUE, and
STOCKADE_URL, plus STOCKADE_DATA for a local coordinator), so `stockade kv put`
inside CMD writes to the same place with the lease's token. A keepalive renews
the lease at about TTL/3. CMD runs in its own process group.

Stopping: if the lease is lost, CMD's process group gets SIGTERM, then
SIGKILL after --grace-ms. SIGTERM, SIGINT and SIGHUP sent to `stockade lock`
are forwarded to CMD's process group; if CMD is still running --grace-ms
after the first of them, the group gets SIGKILL. On Linux CMD also gets
SIGKILL if `stockade lock` itself dies (even by SIGKILL): CMD never runs on
without the lease. The lease is released only once CMD is gone.

Exit status: CMD's own (128+N if a signal N ended it); 137 if CMD had to be
killed after the grace period; 75 if the lease could not be acquired within
--wait-ms (``--wait forever``, or ``--wait-ms forever``: wait until granted, however
long; Ctrl-C ends the wait and leaves no waiter behind); 76 if the lease was lost
and CMD still exited 0 (a lost lease never reads as success); 126 if CMD cannot be executed, 127 if it is not found;
130 if interrupted while waiting for the lease; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from stockade.cli._common import (
    add_data_dir,
    add_url,
    announce_created,
    child_env,
    coordinator_url,
    fail,
    help_text,
    refuse,
)
from stockade.client import connect
from stockade.core.errors import LockTimeout, StockadeError

EXIT_LOCK_TIMEOUT = 75
EXIT_LEASE_LOST = 76
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
EXIT_KILLED = 128 + signal.SIGKILL
EXIT_INTERRUPTED = 128 + signal.SIGINT
GRACE_MS_DEFAULT = 5_000
GRACE_MS_MAX = 600_000
POLL_MS = 50
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Interrupted(BaseException):
    """A forwarded signal arrived before CMD was started (a BaseException, like KeyboardInterrupt,
    so that no ``except Exception`` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies (Linux).

    ``prctl(PR_SET_PDEATHSIG)`` is resolved here, in the parent, so the child
    only makes the foreign call. If this process died between the fork and the
    prctl, the child has already been reparented and no signal will ever come:
    it compares its parent with the expected pid right after setting the
    signal, and kills itself if they differ. The signal is tied to the thread
    that forks, so `run` spawns CMD from the main thread, which lives as long
    as the process.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here, not with the module: `stockade lock --help` and a refused lock never need it

    try:
        # The symbols this process already has, libc's among them: no search for the library (which runs
        # ``ldconfig -p``, a child process of its own, on every start).
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, sigkill, 0, 0, 0) != 0 or os.getppid() != parent:
            os.kill(os.getpid(), sigkill)

    return preexec


def _spawn(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # preexec_fn is safe here: `_run` spawns CMD before any keepalive or timer thread starts.
    return subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_die_with_parent())  # noqa: PLW1509


def _spawn_error(command: list[str], exc: OSError) -> tuple[str, int]:
    name = command[0]
    if exc.errno == errno.ENOENT:
        if os.sep in name:
            return f"{name}: no such file or directory", EXIT_NOT_FOUND
        return f"{name}: command not found", EXIT_NOT_FOUND
    reason = {
        errno.EACCES: "permission denied",
        errno.EISDIR: "is a directory",
        errno.ENOEXEC: "not an executable format",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return f"{name}: cannot execute: {reason}", EXIT_CANNOT_EXECUTE


def _wait_ms(text: str) -> int | None:
    """``--wait-ms``: milliseconds, or ``forever`` (None: until granted; the range is the client's to check)."""
    if text == "forever":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be milliseconds or 'forever', got {text!r}") from None


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stockade lock", description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", help="the scope to lock")
    parser.add_argument("--ttl-ms", type=int, default=10_000, help="lease TTL (default 10000)")
    parser.add_argument("--wait-ms", "--wait", type=_wait_ms, default=0, metavar="MS|forever",
                        help="how long to wait for the lease, or 'forever': until granted (default 0)")
    parser.add_argument(
        "--grace-ms", type=int, default=GRACE_MS_DEFAULT,
        help=f"how long CMD may run after SIGTERM before SIGKILL (default {GRACE_MS_DEFAULT})",
    )
    parser.add_argument("--holder", default=None, help="holder name shown in status (default host:pid)")
    add_url(parser)
    add_data_dir(parser)
    parser.usage = ("stockade lock NAME [--url URL] [--ttl-ms MS] [--wait-ms MS|forever] [--grace-ms MS] [--holder H] "
                    "-- CMD [ARGS...]")
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])  # --help ends here, with or without a CMD
    if split == len(argv):
        parser.error("missing '-- CMD [ARGS...]'")
    command = argv[split + 1 :]
    if not command:
        parser.error("missing command after '--'")
    if not 0 <= args.grace_ms <= GRACE_MS_MAX:
        parser.error(f"--grace-ms must be in 0..{GRACE_MS_MAX}")

    # Until CMD runs, a forwarded signal just ends `stockade lock` (after releasing
    # whatever it holds); SIGINT while waiting for the lease exits 130, no traceback.
    def interrupt(signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    previous = {s: signal.signal(s, interrupt) for s in FORWARDED_SIGNALS}
    try:
        return _run(args, command)
    except _Interrupted as exc:
        print(f"stockade: interrupted by {signal.Signals(exc.signum).name}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print("stockade: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run(args: argparse.Namespace, command: list[str]) -> int:
    url = coordinator_url(args)
    announce = announce_created(url)
    try:
        coord = connect(url)
        announce()
        lease = coord.acquire(
            args.name, ttl_ms=args.ttl_ms, wait_ms=args.wait_ms, holder=args.holder, keepalive=False
        )
    except LockTimeout as exc:
        return fail(str(exc), EXIT_LOCK_TIMEOUT)
    except StockadeError as exc:
        return refuse(exc)

    child: subprocess.Popen[bytes] | None = None
    try:
        env = dict(os.environ)
        env.update(
            STOCKADE_TOKEN=lease.token.encode(),
            STOCKADE_SCOPE=lease.scope,
            STOCKADE_TOKEN_VALUE=str(lease.token.value),
        )
        env.update(child_env(url))
        # From here a signal is CMD's: one that arrives before the forwarding below is in place is kept and
        # forwarded then (it used to end `stockade lock` with 128+N and kill a CMD that had already started).
        pending: list[int] = []
        for s in FORWARDED_SIGNALS:
            signal.signal(s, lambda signum, _frame: pending.append(signum))
        try:
            # Spawned before any keepalive or timer thread starts: the fork happens while this
            # process has one thread, which is what makes a preexec_fn safe.
            child = _spawn(command, env)
        except OSError as exc:
            message, code = _spawn_error(command, exc)
            return fail(message, code)
        lease._schedule_keepalive()
        return _supervise(args, child, lease, pending)
    finally:
        if child is not None and child.poll() is None:
            # Only on an unexpected error: CMD must not outlive the lease.
            _signal_group(child, signal.SIGKILL)
            child.wait()
        try:
            lease.release()  # only now that CMD is gone
        except StockadeError as exc:
            print(f"stockade: release failed ({exc}); the lease expires by TTL", file=sys.stderr)


def _supervise(args: argparse.Namespace, child: subprocess.Popen[bytes], lease: object, pending: list[int]) -> int:
    """Wait for CMD; forward signals (first ``pending``, those that came while it was started); stop it if
    the lease is lost. Returns the exit status."""
    grace_ns = args.grace_ms * 1_000_000
    stop_by_ns: list[int] = []  # when CMD gets SIGKILL, once a stop began
    sent: list[str] = []  # the signals CMD's group was sent, named in the message if it must be killed
    killed = False

    def forward(signum: int, _frame: object) -> None:
        sent.append(_signal_group(child, signum))
        if not stop_by_ns:
            stop_by_ns.append(time.monotonic_ns() + grace_ns)

    for s in FORWARDED_SIGNALS:
        signal.signal(s, forward)
    for signum in list(pending):
        forward(signum, None)
    lost = False
    while child.poll() is None:
        if stop_by_ns:
            if time.monotonic_ns() >= stop_by_ns[0]:
                print(f"stockade: command still running {args.grace_ms} ms after {', '.join(sent)}; killing it",
                      file=sys.stderr)
                _signal_group(child, signal.SIGKILL)
                killed = True
                break
            _wait_child(child, POLL_MS / 1000)
        elif lease.wait_lost(timeout_ms=POLL_MS):  # type: ignore[attr-defined]
            lost = True
            print(f"stockade: lease on {args.name!r} lost ({lease.lost_cause}); stopping command",  # type: ignore[attr-defined]
                  file=sys.stderr)
            sent.append(_signal_group(child, signal.SIGTERM))
            stop_by_ns.append(time.monotonic_ns() + grace_ns)
    returncode = child.wait()
    # Signals that arrive now have no CMD to go to; the lease is released next.
    for s in FORWARDED_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    lost = lost or lease.lost  # type: ignore[attr-defined]  # lost while CMD was finishing: still not a success
    if killed:
        return EXIT_KILLED
    status = _exit_status(returncode)
    if lost and status == 0:
        return EXIT_LEASE_LOST
    return status


def _wait_child(child: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> str:
    """Send ``signum`` to CMD's process group; says what was done (the signal's name, or why not)."""
    name = signal.Signals(signum).name
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:
        return f"{name} (its process group was gone)"
    return name
