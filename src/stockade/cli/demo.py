"""``stockade demo``: the zombie-leader story, live, with real processes.

1. Worker A acquires the scope (token n) and writes.
2. A checks that it still holds the lease and starts its next write...
3. ...and is frozen with SIGSTOP (a GC pause, a stopped VM) past its TTL.
4. Worker B acquires the scope (token n+1) and writes.
5. A is resumed with SIGCONT and sends its delayed write with token n.
6. The store rejects it: n < high-water mark n+1. B's work survives.

Exits 0 only if the story played out exactly so (the test suite also runs
it against a store that ignores tokens, and there it must exit 1).

The coordinator and store are files in a temporary directory (or in
--data-dir; the coordinator file through its host process, the default), or,
with --url http://HOST:PORT (or $STOCKADE_URL), a running `stockade serve`:
the workers then share it over HTTP, on a scope of their own (demo-<random>),
so the story never touches the server's other scopes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stockade.cli._common import URL_ENV, help_text, is_remote
from stockade.core.errors import StockadeError
from stockade.transport.sqlite_url import sqlite_url

SCOPE = "reports"
KEY = "summary"
TTL_MS = 500
STEP_TIMEOUT_S = 15.0


# -- the workers (each a separate process) -----------------------------------------------


def _emit(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def _urls(root: Path | None, url: str | None) -> tuple[str, str]:
    if url is not None:
        return url, url
    assert root is not None
    return sqlite_url(root / "coord.db"), sqlite_url(root / "store.db")


def _worker(name: str, root: Path | None, store_class: str | None, url: str | None = None,
            scope: str = SCOPE) -> int:
    import stockade

    coord_url, store_url = _urls(root, url)
    coord = stockade.connect(coord_url)
    if store_class is None:
        store: Any = stockade.open_store(store_url, cluster_id=coord.cluster_id)
    else:  # a control: e.g. stockade.testing.mutants:FencingOffStore
        assert root is not None
        module, _, attr = store_class.partition(":")
        store = getattr(importlib.import_module(module), attr)(root / "store.db", cluster_id=coord.cluster_id,
                                                               keys=coord.verify_keys())
    lease = coord.acquire(scope, ttl_ms=TTL_MS, wait_ms=10_000, holder=f"worker-{name}")
    _emit(step="acquired", worker=name, token=lease.token.value, pid=os.getpid())
    store.put(scope, KEY, f"{name}: first draft", token=lease.token)
    _emit(step="wrote", worker=name, token=lease.token.value, value=f"{name}: first draft",
          high_water=store.high_water(scope))
    if name == "A":
        lease.raise_if_lost()  # "am I still the leader?" — yes, right now
        _emit(step="checked", worker=name, token=lease.token.value)
        sys.stdin.readline()  # the orchestrator freezes us about here
        value = f"{name}: final (computed before the pause)"
        try:
            store.put(scope, KEY, value, token=lease.token)  # the token, not the lease: A believes it leads
        except stockade.StaleToken as exc:
            _emit(step="rejected", worker=name, token=lease.token.value, high_water=exc.high_water, value=value)
            return 0
        _emit(step="accepted", worker=name, token=lease.token.value, value=value, high_water=store.high_water(scope))
        return 0
    lease.release()
    _emit(step="released", worker=name, token=lease.token.value)
    return 0


# -- the orchestrator --------------------------------------------------------------------


class _Story:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def say(self, who: str, text: str) -> None:
        print(f"  +{time.monotonic() - self.t0:6.3f}s  {who:<2} {text}", flush=True)


def _spawn(name: str, root: Path | None, store_class: str | None, url: str | None, scope: str
           ) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "stockade", "demo", "--worker", name, "--scope", scope]
    argv += ["--url", url] if url is not None else ["--data-dir", str(root)]
    if store_class:
        argv += ["--store-class", store_class]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _next_event(worker: subprocess.Popen[str], expected: str) -> dict[str, Any]:
    assert worker.stdout is not None
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError(f"worker exited before {expected!r} (status {worker.wait(timeout=STEP_TIMEOUT_S)})")
    event = json.loads(line)
    if event.get("step") != expected:
        raise RuntimeError(f"expected {expected!r}, got {event}")
    return event


def _orchestrate(root: Path | None, store_class: str | None, url: str | None = None) -> int:
    story = _Story()
    scope = SCOPE if url is None else f"demo-{os.urandom(4).hex()}"
    print("stockade demo: a zombie leader meets a fence" + (f" (store: {store_class})" if store_class else ""))
    print(f"  data {'at ' + url if url else 'in ' + str(root)}; scope {scope!r}, lease TTL {TTL_MS} ms\n")
    a = _spawn("A", root, store_class, url, scope)
    b = None
    try:
        e = _next_event(a, "acquired")
        n = e["token"]
        story.say("A", f"acquires {scope!r}: token {n}")
        e = _next_event(a, "wrote")
        story.say("A", f"writes {KEY!r} = {e['value']!r} with token {n}: accepted, high-water {e['high_water']}")
        _next_event(a, "checked")
        story.say("A", "checks its lease (still held) and starts its next write...")
        os.kill(a.pid, signal.SIGSTOP)
        story.say("--", f"SIGSTOP A (pid {a.pid}): frozen, like a long GC pause; its keepalive stops too")
        assert a.stdin is not None
        a.stdin.write("go\n")  # A reads this only once it runs again
        a.stdin.flush()
        b = _spawn("B", root, store_class, url, scope)
        e = _next_event(b, "acquired")
        m = e["token"]
        story.say("B", f"acquires {scope!r} once A's lease expired at the coordinator: token {m}")
        e = _next_event(b, "wrote")
        story.say("B", f"writes {KEY!r} = {e['value']!r} with token {m}: accepted, high-water {e['high_water']}")
        _next_event(b, "released")
        story.say("B", "releases")
        os.kill(a.pid, signal.SIGCONT)
        story.say("--", "SIGCONT A: A wakes up believing it still leads, and sends its delayed write")
        assert a.stdout is not None
        e = json.loads(a.stdout.readline() or "{}")
        if e.get("step") == "rejected":
            story.say("A", f"write with token {e['token']} REJECTED: StaleToken "
                           f"(token {e['token']} < high-water {e['high_water']})")
        elif e.get("step") == "accepted":
            story.say("A", f"write with token {e['token']} ACCEPTED: B's work is overwritten (lost update)")
        else:
            raise RuntimeError(f"unexpected event from A: {e}")
        a.wait(timeout=STEP_TIMEOUT_S)
        b.wait(timeout=STEP_TIMEOUT_S)
    finally:
        for worker in (a, b):
            if worker is not None and worker.poll() is None:
                os.kill(worker.pid, signal.SIGCONT)
                worker.kill()
                worker.wait()

    import stockade

    with stockade.open_store(_urls(root, url)[1]) as store:
        item = store.get(scope, KEY)
        high_water = store.high_water(scope)
    final = item.value.decode() if item else None
    print(f"\n  final value: {final!r} (token {item.token_value if item else '-'}), high-water {high_water}")
    held = (
        m == n + 1
        and e.get("step") == "rejected"
        and e.get("high_water") == m
        and final == "B: first draft"
        and high_water == m
    )
    if held:
        print(f"  the zombie's write with token {n} changed nothing: fencing held.")
        return 0
    print("  the story did NOT play out as claimed: the zombie's write was not rejected.")
    return 1


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stockade demo", description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=None,
                        help="a running 'stockade serve' (http://HOST:PORT, its port is 7390 by default) to play the "
                             "story on (default: $STOCKADE_URL, else files in a directory)")
    parser.add_argument("--data-dir", default=None,
                        help="where to keep the demo's files (default: a temporary directory, removed at the end)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory, and print where it is and how to look at it")
    parser.add_argument("--scope", default=SCOPE, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=("A", "B"), help=argparse.SUPPRESS)
    parser.add_argument("--store-class", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        try:
            return _worker(args.worker, Path(args.data_dir) if args.data_dir else None, args.store_class, args.url,
                           args.scope)
        except StockadeError as exc:
            print(f"stockade demo: worker {args.worker}: {exc}", file=sys.stderr)
            return 1
    url = args.url or (None if args.data_dir else os.environ.get(URL_ENV))
    if url is not None and not is_remote(url):
        print("stockade demo: --url takes a stockade serve (http:// or https://); use --data-dir for files",
              file=sys.stderr)
        return 2
    try:
        if url is not None:
            return _orchestrate(None, args.store_class, url)
        if args.data_dir:
            root = Path(args.data_dir)
            problem = _unusable_data_dir(root)
            if problem:
                print(f"stockade demo: --data-dir {root}: {problem}", file=sys.stderr)
                return 2
            if (root / "coord.db").exists() or (root / "store.db").exists():
                print(f"stockade demo: {root} already has data; give an empty directory", file=sys.stderr)
                return 2
            return _orchestrate(root, args.store_class)
        if args.keep:
            kept = Path(tempfile.mkdtemp(prefix="stockade-demo-"))
            status = _orchestrate(kept, args.store_class)
            print(f"  the demo's files stay in {kept}; look at what happened with\n"
                  f"    stockade history --data-dir {kept} {args.scope}")
            return status
        with tempfile.TemporaryDirectory(prefix="stockade-demo-") as tmp:
            return _orchestrate(Path(tmp), args.store_class)
    except (RuntimeError, OSError, ValueError, StockadeError) as exc:
        # A worker that could not play its part (it printed why) or a file that could not be used.
        print(f"stockade demo: the demo could not run: {exc}", file=sys.stderr)
        return 1


def _unusable_data_dir(root: Path) -> str | None:
    """Why ``root`` cannot hold the demo's files (created if missing), or None if it can."""
    if root.exists() and not root.is_dir():
        return "exists and is not a directory"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create it: {exc.strerror or exc}"
    try:  # the only reliable test of writability (root ignores permission bits, not read-only mounts)
        fd, probe = tempfile.mkstemp(prefix=".stockade-demo-probe-", dir=root)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write in it: {exc.strerror or exc}"
    return None
