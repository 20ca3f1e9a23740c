"""Lock cycles and fenced writes against a coordinator, measured as the peers are.

The workload and the arithmetic match those of the peer benchmark that
benchmarks/side_by_side.py runs beside this one (a ``lockbench.py`` given with
``--peers``; see benchmarks/README.md), so the two can be compared:

* a *lock cycle* is acquire → fencing token → release, on one scope per client;
* each client warms up with 20 cycles, then runs until ``seconds`` pass or
  ``iters`` cycles are done, whichever comes first;
* "1 client" is one sequential client; "N clients" are N processes (or
  threads), each on its own scope, started together at a barrier;
* ops/s is all measured cycles over the wall time from the first client's start
  to the last one's end; p50/p99 are over every cycle's latency;
* tokens are checked to strictly increase per scope.

A *fenced write* is one ``store.put`` carrying the token of a lease acquired
once beforehand (equal tokens are accepted, R1), the resource side's unit of work.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from stockade.core.errors import InvariantViolation

__all__ = ["WORKLOADS", "DEFAULT_WORKLOADS", "Result", "run_workload", "format_table", "WARMUP"]

WARMUP = 20
TTL_MS = 10_000
WRITE_VALUE = b"x" * 100
RESULT_TIMEOUT_S_EXTRA = 120


@dataclass(frozen=True)
class Result:
    workload: str
    clients: int
    conc_mode: str
    n: int
    wall_s: float
    ops_s: float
    p50_us: float
    p99_us: float
    mean_us: float | None
    errors: int
    token_violations: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


def _violations(tokens: list[int]) -> int:
    return sum(1 for a, b in zip(tokens, tokens[1:], strict=False) if not b > a)


def _open(url: str, store_url: str | None, *, need_store: bool) -> tuple[Any, Any]:
    import stockade

    coord = stockade.connect(url)
    store = None
    if need_store:
        target = store_url or url
        remote = target.startswith(("http://", "https://"))  # a server's store verifies with its own keys
        store = stockade.open_store(target, cluster_id=coord.cluster_id, keys=None if remote else coord.verify_keys())
    return coord, store


def _loop(step: Callable[[], int | None], seconds: float, iters: int, barrier: Any) -> dict[str, Any]:
    tokens: list[int] = []
    latencies: list[float] = []
    errors = 0
    for _ in range(WARMUP):
        token = step()
        if token is not None:
            tokens.append(token)
    if barrier is not None:
        barrier.wait()
    t0 = time.perf_counter()
    while len(latencies) < iters and time.perf_counter() - t0 < seconds:
        started = time.perf_counter()
        try:
            token = step()
        except InvariantViolation:
            raise  # a bug in stockade is not a refused cycle: stop the run and show it
        except Exception:  # noqa: BLE001 - a refused cycle counts as an error, as in the peers' bench
            errors += 1
            continue
        latencies.append(time.perf_counter() - started)
        if token is not None:
            tokens.append(token)
    t1 = time.perf_counter()
    return {"t0": t0, "t1": t1, "lat": latencies, "errors": errors, "viol": _violations(tokens)}


def _client(workload: str, url: str, store_url: str | None, scope: str, seconds: float, iters: int,
            barrier: Any) -> dict[str, Any]:
    coord, store = _open(url, store_url, need_store=workload == "write")
    try:
        if workload in ("lock", "lock-keepalive"):
            keepalive = workload == "lock-keepalive"

            def step() -> int:
                lease = coord.acquire(scope, ttl_ms=TTL_MS, keepalive=keepalive)
                token = lease.token.value
                lease.release()
                return token

            return _loop(step, seconds, iters, barrier)
        if workload == "write":
            lease = coord.acquire(scope, ttl_ms=60_000)
            try:

                def write() -> None:
                    store.put(scope, "bench", WRITE_VALUE, token=lease.token)

                return _loop(write, seconds, iters, barrier)
            finally:
                lease.release()
        raise ValueError(f"unknown workload {workload!r}")
    finally:
        coord.close()
        if store is not None:
            store.close()


def _process_entry(workload: str, url: str, store_url: str | None, scope: str, seconds: float, iters: int,
                   barrier: Any, queue: Any) -> None:
    try:
        queue.put(_client(workload, url, store_url, scope, seconds, iters, barrier))
    except BaseException as exc:  # noqa: BLE001 - tell the parent instead of leaving it waiting
        barrier.abort()
        queue.put({"failed": repr(exc)})


WORKLOADS = {
    "lock": "lock cycle: acquire -> fencing token -> release (keepalive off, TTL 10 s)",
    "write": "fenced write: store.put of 100 bytes with the token of a lease held throughout",
    "lock-keepalive": "lock cycle as coord.lock() runs it: the same, keepalive on (not in the default run)",
}
#: What ``stockade bench`` runs when ``--workloads`` is not given (what `benchmarks/side_by_side.py` compares).
DEFAULT_WORKLOADS = ("lock", "write")


def run_workload(
    workload: str, url: str, *, clients: int, seconds: float, iters: int, store_url: str | None = None,
    conc_mode: str = "procs", tag: str | None = None,
) -> Result:
    """Run one workload with ``clients`` clients and summarise it as the peers' bench does."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    tag = tag or uuid.uuid4().hex[:6]
    scopes = [f"bench-{tag}-{workload}-{clients}-{i}" for i in range(clients)]
    if clients == 1:
        results = [_client(workload, url, store_url, scopes[0], seconds, iters, None)]
    elif conc_mode == "procs":
        context = multiprocessing.get_context("fork")
        barrier = context.Barrier(clients)
        queue = context.Queue()
        processes = [
            context.Process(target=_process_entry, args=(workload, url, store_url, s, seconds, iters, barrier, queue))
            for s in scopes
        ]
        for process in processes:
            process.start()
        results = [queue.get(timeout=seconds + RESULT_TIMEOUT_S_EXTRA) for _ in processes]
        for process in processes:
            process.join(30)
    else:
        thread_barrier = threading.Barrier(clients)
        slots: list[dict[str, Any]] = [{"failed": "the client thread returned nothing"} for _ in range(clients)]

        def run(i: int) -> None:
            slots[i] = _client(workload, url, store_url, scopes[i], seconds, iters, thread_barrier)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results = slots
    failed = [r["failed"] for r in results if "failed" in r]
    if failed:
        raise RuntimeError(f"{len(failed)} client(s) failed: {failed[0]}")
    latencies = [x * 1e6 for r in results for x in r["lat"]]
    wall = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    return Result(
        workload=workload,
        clients=clients,
        conc_mode=conc_mode if clients > 1 else "-",
        n=len(latencies),
        wall_s=round(wall, 3),
        ops_s=round(len(latencies) / wall, 1) if wall > 0 else 0.0,
        p50_us=round(_pct(latencies, 50), 1),
        p99_us=round(_pct(latencies, 99), 1),
        mean_us=round(statistics.fmean(latencies), 1) if latencies else None,
        errors=sum(r["errors"] for r in results),
        token_violations=sum(r["viol"] for r in results),
    )


def format_table(rows: list[tuple[str, Result, Result]]) -> str:
    """One line per (label, 1-client result, N-client result), in the peers' bench layout."""
    if not rows:
        return ""
    n = rows[0][2].clients
    lines = [
        f"{'workload':20s} {'1c ops/s':>9s} {'p50 us':>8s} {'p99 us':>8s}  {n}c ops/s  {n}c p50  {n}c p99  err viol"
    ]
    for label, one, many in rows:
        lines.append(
            f"{label:20s} {one.ops_s:9.0f} {one.p50_us:8.0f} {one.p99_us:8.0f}  {many.ops_s:8.0f} {many.p50_us:7.0f} "
            f"{many.p99_us:7.0f}  {one.errors + many.errors:3d} {one.token_violations + many.token_violations:4d}"
        )
    return "\n".join(lines)


def to_json(rows: list[tuple[str, Result, Result]]) -> str:
    return json.dumps([{"label": label, "one": one.as_dict(), "many": many.as_dict()} for label, one, many in rows])
