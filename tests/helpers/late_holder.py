"""A lock holder for the delayed-request test (S05), in the test process or in a process of its own.

`Holder` acquires a scope on an embedded coordinator (``sqlite://`` on the
coordinator file a `stockade serve --coordinator` serves; or the server's own
url), writes to a fenced store (the server, directly or through a proxy, or
its store file itself, ``sqlite://``, as another process on the host may),
releases, reads. Every call returns one dict with its timings on the host's
monotonic clock (``invoke_ns``, ``complete_ns``) and its outcome (``type``:
ok, fail, info; ``error``, ``high_water``), which the test turns into history
records.

As a process::

    python late_holder.py serve COORD_URL NAME
        JSON lines on stdin: {"id": N, "cmd": "acquire"|"write"|"release"|"read", "args": {...}};
        each command runs in a thread of its own (a held write does not block a release);
        answers {"id": N, "result": {...}} on stdout, in the order they finish. Ends at EOF.
    python late_holder.py traffic COORD_URL STORE_URL PREFIX SECONDS
        lock, put, release on the scopes PREFIX0..PREFIX3 until SECONDS passed (at most
        5,000 cycles): load on the coordinator file and the server's store; prints the count.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import stockade
from stockade.core.errors import BackendUnavailable, LeaseLost, StaleToken, StockadeError

TRAFFIC_CYCLES_MAX = 5_000


class Holder:
    """One holder: its coordinator handle, at most one lease, and fenced stores by url."""

    def __init__(self, coord_url: str, name: str) -> None:
        self.name = name
        self.coord_url = coord_url
        self._coords: dict[str, Any] = {coord_url: stockade.connect(coord_url)}
        self.lease: Any = None
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()

    def store(self, url: str) -> Any:
        with self._lock:
            if url not in self._stores:
                remote = url.startswith(("http://", "https://"))
                # A local store file verifies with the embedded coordinator's keys (L2: never unsigned by default).
                self._stores[url] = (stockade.open_store(url, timeout_ms=30_000) if remote
                                     else stockade.open_store(url, keys=self._coords[self.coord_url].verify_keys()))
            return self._stores[url]

    def coordinator(self, url: str | None) -> Any:
        with self._lock:
            url = url or self.coord_url
            if url not in self._coords:
                self._coords[url] = stockade.connect(url)
            return self._coords[url]

    def acquire(self, scope: str, ttl_ms: int, wait_ms: int, keepalive: bool, via: str | None = None) -> dict[str, Any]:
        """Acquire on the coordinator file, or (``via``) through a `stockade serve` url."""
        coord = self.coordinator(via)
        result: dict[str, Any] = {"invoke_ns": time.monotonic_ns()}
        try:
            self.lease = coord.acquire(scope, ttl_ms=ttl_ms, wait_ms=wait_ms, holder=self.name,
                                            keepalive=keepalive)
        except StockadeError as exc:
            # LeaseLost: granted, but so late (a busy host) that the lease had lapsed: a token was issued.
            result.update(type="info" if isinstance(exc, (BackendUnavailable, LeaseLost)) else "fail", error=exc.code)
        else:
            result.update(type="ok", token=self.lease.token.encode(), token_value=self.lease.token.value)
        result["complete_ns"] = time.monotonic_ns()
        return result

    def write(self, store_url: str, scope: str, key: str, value: str, idempotency_key: str) -> dict[str, Any]:
        """Put ``value`` with the held lease's token (taken before the request, as a paused holder would)."""
        token = self.lease.token
        store = self.store(store_url)
        result: dict[str, Any] = {"invoke_ns": time.monotonic_ns(), "token": token.encode()}
        try:
            written = store.put(scope, key, value, token=token, idempotency_key=idempotency_key)
        except StaleToken as exc:
            result.update(type="fail", error="stale-token", high_water=exc.high_water)
        except StockadeError as exc:
            certain = isinstance(exc, BackendUnavailable) and exc.certain_no_effect
            result.update(type="fail" if certain or not isinstance(exc, BackendUnavailable) else "info",
                          error=exc.code, detail=str(exc)[:200])
        else:
            result.update(type="ok", high_water=written.high_water, commit_seq=written.commit_seq,
                          replayed=written.replayed)
        result["complete_ns"] = time.monotonic_ns()
        return result

    def release(self) -> dict[str, Any]:
        result: dict[str, Any] = {"invoke_ns": time.monotonic_ns(), "token": self.lease.token.encode()}
        try:
            self.lease.release()
        except StockadeError as exc:
            result.update(type="info", error=exc.code)
        else:
            result["type"] = "ok"
        result["complete_ns"] = time.monotonic_ns()
        return result

    def read(self, store_url: str, scope: str, key: str) -> dict[str, Any]:
        result: dict[str, Any] = {"invoke_ns": time.monotonic_ns()}
        try:
            item = self.store(store_url).get(scope, key)
        except StockadeError as exc:
            result.update(type="fail", error=exc.code)
        else:
            result.update(type="ok", value=None if item is None else item.value.decode(),
                          token_value=None if item is None else item.token_value)
        result["complete_ns"] = time.monotonic_ns()
        return result

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        for coord in self._coords.values():
            coord.close()


def _serve(coord_url: str, name: str) -> int:
    holder = Holder(coord_url, name)
    out_lock = threading.Lock()
    threads: list[threading.Thread] = []

    def run(request: dict[str, Any]) -> None:
        try:
            result = getattr(holder, request["cmd"])(**request["args"])
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with it
            result = {"type": "info", "error": "helper-error", "detail": repr(exc)[:300]}
        with out_lock:
            sys.stdout.write(json.dumps({"id": request["id"], "result": result}) + "\n")
            sys.stdout.flush()

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip():
            thread = threading.Thread(target=run, args=(json.loads(line),), daemon=True)
            thread.start()
            threads.append(thread)
    for thread in threads:
        thread.join(30)
    holder.close()
    return 0


def _traffic(coord_url: str, store_url: str, prefix: str, seconds: float) -> int:
    coord = stockade.connect(coord_url)
    store = stockade.open_store(store_url, timeout_ms=30_000)
    end = time.monotonic() + seconds
    cycles = 0
    while time.monotonic() < end and cycles < TRAFFIC_CYCLES_MAX:
        scope = f"{prefix}{cycles % 4}"
        try:
            with coord.lock(scope, ttl_ms=2_000, wait_ms=2_000, holder="traffic") as lease:
                store.put(scope, "k", str(cycles), token=lease.token)
        except StockadeError:
            pass  # load only: its outcomes are not judged
        cycles += 1
    print(cycles, flush=True)
    store.close()
    coord.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        sys.exit(_serve(sys.argv[2], sys.argv[3]))
    sys.exit(_traffic(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])))
