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

``--workload batch`` writes a batch of four commands instead (SET, INCRBY,
HSET, XADD on keys that exist: the script's first pass reads each one's type,
the counter's value and the stream's last id), and ``plain`` sends them as one
MULTI/EXEC. ``--before FILE`` adds ``fenced-before``: the same fence with the
script of another revision (FILE: that revision's
``src/stockade/resources/redis/_script.py``, e.g. from ``git show``), so a
change of the script is measured before and after in one run, on one server.
``--appendfsync no`` takes the disk out, leaving the CPU the script costs.
``--fencekit`` adds ``fencekit``: the same write through fencekit's
``FenceGate.set_if_fresh`` (an unsigned integer token, one EVAL of its script),
a peer that must be importable (``pip install fencekit``; not a stockade
dependency), and the ratio of its rate to the fenced one's.

    PYTHONPATH=src python benchmarks/fence_redis.py --rounds 5 --ops 2000
    git show 75513f1:src/stockade/resources/redis/_script.py > /tmp/before.py
    PYTHONPATH=src python benchmarks/fence_redis.py --workload batch --before /tmp/before.py --appendfsync no
    PYTHONPATH=src python benchmarks/fence_redis.py --fencekit --rounds 5
"""

from __future__ import annotations

import argparse
import importlib.util
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
from stockade.resources.redis import RedisFence
from stockade.resources.redis import _script as script

CLUSTER = "be5c4be5c4be5c40"
KEYS = FixedKeys(ephemeral_keyring(CLUSTER))
VALUE = b"x" * 100
VARIANTS = ("plain", "fenced", "evalsha", "fcall")
#: The fenced script of another revision (``--before``), set in the parent before the workers fork.
BEFORE: dict[str, str] = {}
FUNCTION = (
    "#!lua name=stockade_bench\n"
    "redis.register_function('stockade_fenced_write', function(KEYS, ARGV)\n"
    + script.FENCED_WRITE + "\nend)\n"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(directory: Path, appendfsync: str = "always") -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1", "--port", str(port),
         "--dir", str(directory), "--daemonize", "no", "--appendonly", "yes", "--appendfsync", appendfsync,
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


def writer(port: int, variant: str, worker: int, ops: int, barrier: Any, workload: str = "set") -> float:
    """``ops`` writes (or batches) of ``variant``; seconds from the common start to the last answer."""
    client = redis.Redis(port=port)
    token = KEYS.sign(FencingToken(CLUSTER, "bench", 1))
    fence = RedisFence(client, keys=KEYS)
    if variant == "fenced-before":
        fence._write = client.register_script(BEFORE["FENCED_WRITE"])
    keys = [f"{{bench}}:w{worker}:{i % 100}" for i in range(ops)]
    client.ping()
    sha = client.script_load(script.FENCED_WRITE)
    hwm, floor = script.hwm_key("bench"), script.floor_key("bench")
    verified = script.verified_key("bench", False)  # the memory of verifying (L2), a single server
    if workload == "batch":
        counter, table, log = (f"{{bench}}:w{worker}:{name}" for name in ("n", "h", "s"))
        client.set(counter, 1)
        client.hset(table, "f", "0")
        client.xadd(log, {"e": "0"}, maxlen=100)
    if barrier is not None:
        barrier.wait()
    start = time.perf_counter()
    if workload == "batch" and variant == "plain":
        for key in keys:
            pipe = client.pipeline(transaction=True)
            pipe.set(key, VALUE).incrby(counter, 1).hset(table, "f", "1").xadd(log, {"e": "1"}, maxlen=100,
                                                                               approximate=True)
            pipe.execute()
    elif workload == "batch":
        for key in keys:
            with fence.batch(token) as batch:
                batch.set(key, VALUE)
                batch.incrby(counter, 1)
                batch.hset(table, {"f": "1"})
                batch.xadd(log, {"e": "1"}, maxlen=100)
    elif variant == "plain":
        for key in keys:
            client.set(key, VALUE)
    elif variant == "fencekit":
        gate, peer_token, text = _fencekit(client)
        for key in keys:
            gate.set_if_fresh(peer_token, key, text)
    elif variant in ("fenced", "fenced-before"):
        for key in keys:
            fence.set(token, key, VALUE)
    else:  # the script alone, by EVALSHA or as a Function: which call costs Redis less
        run = client.evalsha if variant == "evalsha" else client.fcall
        name = sha if variant == "evalsha" else "stockade_fenced_write"
        for key in keys:
            run(name, 4, hwm, floor, verified, key, str(token.value), "ge", "v", "SET", "4", "1", VALUE)
    elapsed = time.perf_counter() - start
    client.close()
    return elapsed


def _fencekit(client: redis.Redis) -> tuple[Any, Any, str]:
    """The peer's gate on the same client, its token for the same scope, and the same 100 bytes."""
    import fencekit  # a peer, imported only when asked for

    return fencekit.FenceGate(client), fencekit.FenceToken(value=1, resource="bench"), VALUE.decode()


def _proc(args: tuple[int, str, int, int, Any, Any, str]) -> None:
    port, variant, worker, ops, barrier, out, workload = args
    out.put(writer(port, variant, worker, ops, barrier, workload))


def run_procs(port: int, variant: str, procs: int, ops: int, workload: str = "set") -> float:
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(procs), context.Queue()
    workers = [context.Process(target=_proc, args=((port, variant, w, ops, barrier, out, workload),))
               for w in range(procs)]
    for process in workers:
        process.start()
    elapsed = max(out.get(timeout=600) for _ in workers)
    for process in workers:
        process.join()
    return procs * ops / elapsed


def _load_before(path: str) -> None:
    spec = importlib.util.spec_from_file_location("fenced_script_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    BEFORE["FENCED_WRITE"] = module.FENCED_WRITE


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=2000, help="writes per client per round")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--workload", choices=("set", "batch"), default="set")
    parser.add_argument("--before", help="another revision's _redis_script.py: adds the fenced-before variant")
    parser.add_argument("--appendfsync", choices=("always", "everysec", "no"), default="always")
    parser.add_argument("--fencekit", action="store_true", help="add the peer fencekit's fenced SET (installed)")
    options = parser.parse_args()
    variants: tuple[str, ...] = ("plain", "fenced") if options.workload == "batch" else VARIANTS
    if options.before:
        _load_before(options.before)
        variants += ("fenced-before",)
    if options.fencekit:
        if importlib.util.find_spec("fencekit") is None:
            parser.error("--fencekit: the peer is not importable here (pip install fencekit)")
        variants += ("fencekit",)
    with tempfile.TemporaryDirectory(prefix="fence-redis-bench-") as directory:
        process, port = start_server(Path(directory), options.appendfsync)
        try:
            setup = redis.Redis(port=port)
            setup.function_load(FUNCTION, replace=True)
            setup.close()
            results: dict[tuple[str, str], list[float]] = {}
            server_us: dict[str, list[float]] = {}
            stats = redis.Redis(port=port)
            for round_ in range(options.rounds):
                for variant in variants if round_ % 2 == 0 else tuple(reversed(variants)):
                    stats.config_resetstat()
                    one = options.ops / writer(port, variant, 0, options.ops, None, options.workload)
                    many = run_procs(port, variant, options.procs, options.ops // 4, options.workload)
                    results.setdefault((variant, "1 client"), []).append(one)
                    results.setdefault((variant, f"{options.procs} procs"), []).append(many)
                    # Redis's own time in the script per call (its commands included): the CPU a change costs.
                    evalsha = stats.info("commandstats").get("cmdstat_evalsha")
                    if variant.startswith("fenced") and evalsha:
                        server_us.setdefault(variant, []).append(float(evalsha["usec_per_call"]))
                print(f"round {round_ + 1}/{options.rounds} done", file=sys.stderr)
            stats.close()
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait()
    unit = "batches" if options.workload == "batch" else "writes"
    print(f"redis-server, appendfsync {options.appendfsync}; workload {options.workload}; medians of "
          f"{options.rounds} interleaved rounds ({unit}/s)\n")
    print("| clients | " + " | ".join(variants) + " | fenced/plain |" + (" fenced/fenced-before |" if options.before
                                                                          else "")
          + (" fenced/fencekit |" if options.fencekit else ""))
    print("| --- |" + " ---: |" * (len(variants) + 1 + bool(options.before) + bool(options.fencekit)))
    for clients in ("1 client", f"{options.procs} procs"):
        medians = [statistics.median(results[(v, clients)]) for v in variants]
        # Paired: each round's ratio of times per write, so a slow spell of the disk counts on both sides.
        row = [f"{m:,.0f}" for m in medians] + [f"{_paired(results, clients, 'plain', 'fenced'):.2f}x"]
        if options.before:
            row.append(f"{_paired(results, clients, 'fenced-before', 'fenced'):.2f}x")
        if options.fencekit:
            row.append(f"{_paired(results, clients, 'fencekit', 'fenced'):.2f}x")
        print(f"| {clients} | " + " | ".join(row) + " |")
    for variant, per_call in server_us.items():
        print(f"\n{variant}: Redis's time in the script, {statistics.median(per_call):.2f} us a call (median over "
              f"rounds of INFO commandstats usec_per_call)", end="")
    print()
    print(f"\n({unit}/s; a ratio: the median over rounds of the round's time per write, the first over the second"
          " side's rate, >1 = slower)")
    return 0


def _paired(results: dict[tuple[str, str], list[float]], clients: str, fast: str, slow: str) -> float:
    """The median over rounds of rate(fast) / rate(slow): how many times longer a write of ``slow`` takes."""
    pairs = zip(results[(fast, clients)], results[(slow, clients)], strict=True)
    return statistics.median(f / s for f, s in pairs)


if __name__ == "__main__":
    raise SystemExit(main())
