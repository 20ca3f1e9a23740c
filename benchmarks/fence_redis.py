#!/usr/bin/env python3
"""Fenced SET beside plain SET on one redis-server, in one run (docs/fence-redis.md).

Starts redis-server 7 on a free loopback port in a temporary directory with
``--appendonly yes --appendfsync always`` (every write is fsync'd before it is
answered, on both sides), then, round after round, interleaved:

* ``plain``: ``SET {bench}:k<i> value`` with redis-py;
* ``fenced``: ``RedisFence.set(token, "{bench}:k<i>", value)`` (a signed token:
  MAC check in Python, then one EVALSHA of the fenced script);
* ``evalsha`` and ``fcall``: the fenced script alone, sent straight by EVALSHA
  and as a Redis Function by FCALL (no Python-side check), to choose between them;

each with one client and with 8 client processes, and prints the medians over
the rounds and the fenced/plain ratios.

    PYTHONPATH=src python benchmarks/fence_redis.py --rounds 5 --ops 2000
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, ephemeral_keyring
from stockade.resources import _redis_script as script
from stockade.resources.redis import RedisFence

CLUSTER = "be5c4be5c4be5c40"
KEYS = FixedKeys(ephemeral_keyring(CLUSTER))
VALUE = b"x" * 100
VARIANTS = ("plain", "fenced", "evalsha", "fcall")
FUNCTION = (
    "#!lua name=stockade_bench\n"
    "redis.register_function('stockade_fenced_write', function(KEYS, ARGV)\n"
    + script.FENCED_WRITE + "\nend)\n"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1", "--port", str(port),
         "--dir", str(directory), "--daemonize", "no", "--appendonly", "yes", "--appendfsync", "always",
         "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(3000):
        try:
            if client.ping():
                break
        except redis.ConnectionError:
            time.sleep(0.01)
    client.close()
    return process, port


def writer(port: int, variant: str, worker: int, ops: int, barrier: Any) -> float:
    """``ops`` writes of ``variant``; seconds from the common start to the last answer."""
    client = redis.Redis(port=port)
    token = KEYS.sign(FencingToken(CLUSTER, "bench", 1))
    fence = RedisFence(client, keys=KEYS)
    keys = [f"{{bench}}:w{worker}:{i % 100}" for i in range(ops)]
    client.ping()
    sha = client.script_load(script.FENCED_WRITE)
    hwm, floor = script.hwm_key("bench"), script.floor_key("bench")
    if barrier is not None:
        barrier.wait()
    start = time.perf_counter()
    if variant == "plain":
        for key in keys:
            client.set(key, VALUE)
    elif variant == "fenced":
        for key in keys:
            fence.set(token, key, VALUE)
    else:  # the script alone, by EVALSHA or as a Function: which call costs Redis less
        run = client.evalsha if variant == "evalsha" else client.fcall
        name = sha if variant == "evalsha" else "stockade_fenced_write"
        for key in keys:
            run(name, 3, hwm, floor, key, str(token.value), "ge", "SET", "3", "1", VALUE)
    elapsed = time.perf_counter() - start
    client.close()
    return elapsed


def _proc(args: tuple[int, str, int, int, Any, Any]) -> None:
    port, variant, worker, ops, barrier, out = args
    out.put(writer(port, variant, worker, ops, barrier))


def run_procs(port: int, variant: str, procs: int, ops: int) -> float:
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(procs), context.Queue()
    workers = [context.Process(target=_proc, args=((port, variant, w, ops, barrier, out),)) for w in range(procs)]
    for process in workers:
        process.start()
    elapsed = max(out.get(timeout=600) for _ in workers)
    for process in workers:
        process.join()
    return procs * ops / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=2000, help="writes per client per round")
    parser.add_argument("--procs", type=int, default=8)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fence-redis-bench-") as directory:
        process, port = start_server(Path(directory))
        try:
            setup = redis.Redis(port=port)
            setup.function_load(FUNCTION, replace=True)
            setup.close()
            results: dict[tuple[str, str], list[float]] = {}
            for round_ in range(options.rounds):
                for variant in VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS)):
                    one = options.ops / writer(port, variant, 0, options.ops, None)
                    many = run_procs(port, variant, options.procs, options.ops // 4)
                    results.setdefault((variant, "1 client"), []).append(one)
                    results.setdefault((variant, f"{options.procs} procs"), []).append(many)
                print(f"round {round_ + 1}/{options.rounds} done", file=sys.stderr)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait()
    print(f"redis-server, appendfsync always; medians of {options.rounds} interleaved rounds (writes/s)\n")
    print("| clients | plain SET | fenced SET | fenced/plain | script by EVALSHA | script by FCALL |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for clients in ("1 client", f"{options.procs} procs"):
        plain, fenced, evalsha, fcall = (statistics.median(results[(v, clients)]) for v in VARIANTS)
        # Paired: each round's plain over its own fenced, so a slow spell of the disk counts on both sides.
        pairs = zip(results[("plain", clients)], results[("fenced", clients)], strict=True)
        ratio = statistics.median(p / f for p, f in pairs)
        print(f"| {clients} | {plain:,.0f} | {fenced:,.0f} | {ratio:.2f}x | {evalsha:,.0f} | {fcall:,.0f} |")
    print("\n(writes/s; fenced/plain: the median over rounds of the round's time per write, fenced over plain)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
