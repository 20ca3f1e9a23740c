#!/usr/bin/env python3
"""Lock cycles of ``stockade serve`` with 0 and with N open dashboard streams, side by side in one run.

Starts one ``stockade serve`` (durable, no auth) in a temporary directory, then,
run after run with the order rotated: opens N ``GET /ui/events`` streams (read
and counted by one thread, as N browsers would), waits until the server counts
them, and runs ``stockade bench --workloads lock`` (1 client and C client
processes) against it; then the same with no stream open. Prints the medians
of cycles/s and the ratio (streams / none), and the events the streams read.

    PYTHONPATH=src python benchmarks/dashboard_streams.py --streams 100 --runs 3
    PYTHONPATH=src python benchmarks/dashboard_streams.py --scopes 100000   # + RSS before/after the first page

``--scopes K`` first makes K scopes (acquire and release each) and reports the
server's resident memory before and after the dashboard's first page and
after its first stream (``/proc/PID/status`` VmRSS).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(port: int, path: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())


class Streams:
    """N open event streams, read (and their frames counted) by one thread."""

    def __init__(self, port: int, count: int) -> None:
        self.selector = selectors.DefaultSelector()
        self.frames = 0
        self.socks = []
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /ui/events HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
            self.socks.append(sock)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stop.is_set():
            for key, _ in self.selector.select(0.1):
                try:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                self.frames += data.count(b"event: snapshot")

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for sock in self.socks:
            sock.close()


def bench(url: str, clients: int, seconds: float, out: Path, pid: int) -> tuple[float, float, float]:
    """Cycles/s with 1 client and with ``clients``, and the server's CPU microseconds per cycle over both."""
    cpu = cpu_s(pid)
    subprocess.run([sys.executable, "-m", "stockade", "bench", "--url", url, "--workloads", "lock", "--clients",
                    str(clients), "--seconds", str(seconds), "--json", str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = json.loads(out.read_text())["results"]
    one = next(r["ops_s"] for r in results if r["clients"] == 1)
    many = next(r["ops_s"] for r in results if r["clients"] == clients)
    cycles = sum(r["n"] for r in results)
    return one, many, (cpu_s(pid) - cpu) * 1e6 / cycles


def make_scopes(port: int, count: int) -> None:
    def worker(indexes: range) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for index in indexes:
            conn.request("POST", f"/v1/locks/rss.{index:06d}/acquire", body=b'{"ttl_ms": 60000}',
                         headers={"Content-Type": "application/json"})
            lease = json.loads(conn.getresponse().read())["lease_id"]
            conn.request("DELETE", f"/v1/leases/{lease}")
            conn.getresponse().read()

    step = -(-count // 8)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, [range(i, min(count, i + step)) for i in range(0, count, step)]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--scopes", type=int, default=0, help="first make this many scopes and report RSS")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "stockade", "serve", "--data-dir", tmp, "--port", str(port),
                                   "--dashboard-streams-max", str(2 * max(100, args.streams)), "--log-level", "error"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert server.stdout is not None and b"listening" in server.stdout.readline()
            if args.scopes:
                started = time.monotonic()
                make_scopes(port, args.scopes)
                before = rss_kib(server.pid)
                began = time.monotonic()
                first = get(port, "/ui/api/state")
                page_s = time.monotonic() - began
                after_page = rss_kib(server.pid)
                stream = Streams(port, 1)
                deadline = time.monotonic() + 30
                while stream.frames < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)
                after_stream = rss_kib(server.pid)
                stream.close()
                print(f"{first['scopes_seen']} scopes (made in {time.monotonic() - started:.0f} s): server RSS "
                      f"{before / 1024:.1f} MiB before the first page, {after_page / 1024:.1f} MiB after it "
                      f"({page_s * 1000:.0f} ms), {after_stream / 1024:.1f} MiB after a stream's first "
                      f"{stream.frames} snapshots")
            figures: dict[int, list[tuple[float, float, float]]] = {0: [], args.streams: []}
            frames = 0
            for run in range(args.runs):
                for count in ([0, args.streams] if run % 2 == 0 else [args.streams, 0]):
                    streams = Streams(port, count)
                    deadline = time.monotonic() + 30
                    while get(port, "/ui/api/state")["health"]["streams"] < count:
                        assert time.monotonic() < deadline, "the streams did not open"
                        time.sleep(0.05)
                    figures[count].append(bench(url, args.clients, args.seconds, Path(tmp) / "bench.json",
                                                server.pid))
                    frames += streams.frames
                    streams.close()
                    while get(port, "/ui/api/state")["health"]["streams"] > 0:  # the server saw them close
                        time.sleep(0.05)
                    print(f"run {run + 1}: {count:4d} streams: {figures[count][-1][0]:7.0f} cycles/s 1 client, "
                          f"{figures[count][-1][1]:7.0f} cycles/s {args.clients} clients, server CPU "
                          f"{figures[count][-1][2]:5.0f} us/cycle", flush=True)
            none = [statistics.median(f[i] for f in figures[0]) for i in (0, 1, 2)]
            some = [statistics.median(f[i] for f in figures[args.streams]) for i in (0, 1, 2)]
            print(f"median of {args.runs} runs: 1 client {none[0]:.0f} -> {some[0]:.0f} cycles/s "
                  f"(ratio {some[0] / none[0]:.2f}); {args.clients} clients {none[1]:.0f} -> {some[1]:.0f} cycles/s "
                  f"(ratio {some[1] / none[1]:.2f}) with {args.streams} streams open; server CPU {none[2]:.0f} -> "
                  f"{some[2]:.0f} us/cycle; the streams read {frames} snapshots")
        finally:
            server.terminate()
            server.wait(30)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
