#!/usr/bin/env python3
"""stockade beside etcd and PostgreSQL, in one run, on this machine.

Starts, on loopback free ports in a temporary directory (as root, no systemd):
one etcd member (default durability: every commit fsyncs its WAL), PostgreSQL 15
(fsync=on, synchronous_commit=on: the defaults) and `stockade serve` (durable: a
token is fsync'd before it is returned, C1). Then, run after run, interleaved:

* ``stockade bench --url http://...`` (lock cycles and fenced writes) against
  ``stockade serve``;
* ``stockade bench --url postgresql://...`` (lock cycles, the embedded client
  on the PostgreSQL coordinator) against the same PostgreSQL server;
* ``stockade bench --url etcd://...`` (lock cycles, the etcd coordinator)
  against the same etcd member;
* the peers' ``lockbench.py --variants etcd-aetcd,etcd-gw,pg-lease-row --conc-mode procs``
  (the same workload and arithmetic) against the same two servers,

each with 1 client and N client processes, and prints medians over the runs,
with ratios: stockade serve to each peer, stockade on PostgreSQL to the
lease row (``pg-lease-row``), stockade on etcd to a raw lease + txn over the
gateway (``etcd-gw``).

    python benchmarks/side_by_side.py --peers DIR --runs 3
    python benchmarks/side_by_side.py --peers DIR --peer-python /tmp/venv/bin/python

DIR is a directory holding the peer benchmark, ``lockbench.py``; it is not part
of stockade (benchmarks/README.md says what it must provide).

The peers' clients (``aetcd``, ``etcd3gw``, ``psycopg[binary]``) must be
importable by ``--peer-python`` (default: this interpreter); they are not
stockade dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")
METRICS = ("ops_s", "p50_us", "p99_us")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, what: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet, whatever the probe says; retry until the deadline
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready after {timeout_s} s")


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1) as response:
        return response.status == 200


class Servers:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: list[subprocess.Popen] = []
        self.pg_data: Path | None = None

    def start_etcd(self) -> int:
        port, peer = free_port(), free_port()
        data = self.root / "etcd"
        data.mkdir(mode=0o700)
        log = open(self.root / "etcd.log", "w")
        process = subprocess.Popen(
            ["etcd", "--name", "bench", "--data-dir", str(data),
             "--listen-client-urls", f"http://127.0.0.1:{port}", "--advertise-client-urls", f"http://127.0.0.1:{port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"bench=http://127.0.0.1:{peer}", "--initial-cluster-state", "new",
             "--logger", "zap", "--log-outputs", "stderr"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.processes.append(process)
        health = f"http://127.0.0.1:{port}/health"
        wait_until(lambda: b'"health":"true"' in urllib.request.urlopen(health, timeout=1).read(), "etcd", 30, process)
        return port

    def start_postgres(self) -> int:
        port = free_port()
        data = self.root / "pg"
        sock_dir = self.root / "pgsock"
        for path in (data, sock_dir):
            path.mkdir(mode=0o700)
            shutil.chown(path, "postgres", "postgres")
        os.chmod(self.root, 0o755)
        as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(as_pg + [str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                                "--locale=C.UTF-8"], check=True, capture_output=True)
        subprocess.run(as_pg + [str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(data / "log"), "-w", "-o",
                                f"-c listen_addresses=127.0.0.1 -p {port} -k {sock_dir}", "start"],
                       check=True, capture_output=True)
        self.pg_data = data
        wait_until(lambda: subprocess.run([str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port),
                                           "-U", "postgres"]).returncode == 0, "postgres", 30)
        return port

    def start_stockade(self, serve_args: list[str]) -> str:
        port = free_port()
        log = open(self.root / "stockade-serve.log", "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "stockade", "serve", "--data-dir", str(self.root / "stockade"),
             "--port", str(port), *serve_args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.processes.append(process)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(url + "/healthz"), "stockade serve", 30, process)
        return url

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        if self.pg_data is not None:
            as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
            subprocess.run(as_pg + [str(PG_BIN / "pg_ctl"), "-D", str(self.pg_data), "-m", "immediate", "stop"],
                           capture_output=True)


#: The stockade side per coordinator url scheme: its label in the table and the peer it is put beside.
BACKENDS = {"http": ("stockade lock", None), "postgresql": ("stockade lock on postgresql", "pg-lease-row"),
            "etcd": ("stockade lock on etcd", "etcd-gw")}


def run_stockade(url: str, args: argparse.Namespace, out: Path, workloads: str) -> list[dict]:
    cmd = [sys.executable, "-m", "stockade", "bench", "--url", url, "--workloads", workloads,
           "--clients", str(args.clients), "--conc-mode", "procs", "--seconds", str(args.seconds),
           "--iters", str(args.iters), "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"stockade bench --url {url} failed: {done.stderr[-2000:]}")
    results = json.loads(out.read_text())["results"]
    scheme = url.split(":", 1)[0]
    label = BACKENDS[scheme][0]
    return [{"system": label if r["workload"] == "lock" else f"stockade {r['workload']}", **r} for r in results]


def run_peers(args: argparse.Namespace, env: dict[str, str], out: Path) -> list[dict]:
    cmd = [args.peer_python, str(Path(args.peers) / "lockbench.py"), "--variants", args.variants, "--runs", "1",
           "--clients", str(args.clients), "--seconds", str(args.seconds), "--iters", str(args.iters),
           "--conc-mode", "procs", "--json", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"lockbench failed: {done.stderr[-2000:]}")
    results = json.loads(out.read_text())["results"]
    failed = [r for r in results if "failed" in r]
    if failed:
        raise RuntimeError(f"lockbench variant failed: {failed[0]['variant']}: {failed[0]['failed'][-500:]}")
    return [{"system": r["variant"], **r} for r in results]


def medians(rows: list[dict]) -> dict[tuple[str, int], dict[str, float]]:
    grouped: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["system"], row["clients"]), []).append(row)
    return {
        key: {m: statistics.median(r[m] for r in group) for m in METRICS}
        | {"runs": len(group), "errors": sum(r["errors"] for r in group),
           "viol": sum(r["token_violations"] for r in group)}
        for key, group in grouped.items()
    }


def table(summary: dict, clients: int, peers: list[str]) -> str:
    systems = sorted({s for s, _ in summary}, key=lambda s: (not s.startswith("stockade"), s))
    lines = [
        f"| system (median of runs) | 1 client cycles/s | p50 µs | p99 µs | {clients} procs cycles/s | p50 µs | p99 µs "
        "| errors / token violations |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system in systems:
        one, many = summary.get((system, 1)), summary.get((system, clients))
        if one is None or many is None:
            continue
        lines.append(
            f"| {system} | {one['ops_s']:.0f} | {one['p50_us']:.0f} | {one['p99_us']:.0f} | {many['ops_s']:.0f} | "
            f"{many['p50_us']:.0f} | {many['p99_us']:.0f} | {one['errors'] + many['errors']} / "
            f"{one['viol'] + many['viol']} |"
        )
    pairs = [("stockade lock", peer) for peer in peers]
    pairs += [(label, peer) for label, peer in BACKENDS.values() if peer is not None and peer in peers]
    pairs = [(ours, peer) for ours, peer in pairs
             if all((system, c) in summary for system in (ours, peer) for c in (1, clients))]
    if pairs:
        lines.append("")
        lines.append(f"| ratio: stockade lock cycles / peer | 1 client cycles/s | 1 client p50 (peer/stockade) "
                     f"| {clients} procs cycles/s |")
        lines.append("|---|---|---|---|")
        for ours, peer in pairs:
            lines.append(
                f"| {ours} vs {peer} | {summary[(ours, 1)]['ops_s'] / summary[(peer, 1)]['ops_s']:.2f}× | "
                f"{summary[(peer, 1)]['p50_us'] / summary[(ours, 1)]['p50_us']:.2f}× | "
                f"{summary[(ours, clients)]['ops_s'] / summary[(peer, clients)]['ops_s']:.2f}× |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--peers", required=True, help="directory holding the peer benchmark lockbench.py (not part of stockade)"
    )
    parser.add_argument("--peer-python", default=sys.executable, help="python with aetcd, etcd3gw and psycopg[binary]")
    parser.add_argument("--variants", default="etcd-aetcd,etcd-gw,pg-lease-row")
    parser.add_argument("--backends", default="http,postgresql,etcd",
                        help="coordinators stockade bench measures: http (stockade serve), postgresql, etcd")
    parser.add_argument("--workloads", default="lock,write")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--stockade-url", help="bench a running server instead of starting one")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra argument for stockade serve")
    parser.add_argument("--json", help="write all rows and the medians here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stockade-side-by-side-"))
    servers = Servers(root)
    rows: list[dict] = []
    try:
        env = dict(os.environ)
        peers = [v.strip() for v in args.variants.split(",") if v.strip()]
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
        urls: dict[str, str] = {}
        if any(v.startswith("etcd") for v in peers) or "etcd" in backends:
            env["LB_ETCD_PORT"] = str(servers.start_etcd())
            urls["etcd"] = f"etcd://127.0.0.1:{env['LB_ETCD_PORT']}"
        if any(v.startswith("pg") for v in peers) or "postgresql" in backends:
            pg_port = servers.start_postgres()
            env["LB_PG_DSN"] = f"host=127.0.0.1 port={pg_port} user=postgres dbname=postgres"
            urls["postgresql"] = f"postgresql://postgres@127.0.0.1:{pg_port}/postgres"
        if "http" in backends:
            urls["http"] = args.stockade_url or servers.start_stockade(args.serve_arg)
        print(f"servers up in {root}: {', '.join(f'{k} {v}' for k, v in urls.items())} (etcd: one member)",
              flush=True)
        sides = [b for b in backends if b in urls] + ["peers"]
        for run in range(1, args.runs + 1):
            # Rotate who goes first, so no side always runs on a warmer (or busier) machine.
            shift = (run - 1) % len(sides)
            for side in sides[shift:] + sides[:shift]:
                if side == "peers":
                    got = run_peers(args, env, root / f"peers-{run}.json")
                else:
                    workloads = args.workloads if side == "http" else "lock"
                    got = run_stockade(urls[side], args, root / f"stockade-{side}-{run}.json", workloads)
                for row in got:
                    row["run"] = run
                    print(f"run {run} {row['system']:28s} {row['clients']}c {row['ops_s']:8.0f}/s "
                          f"p50 {row['p50_us']:6.0f} p99 {row['p99_us']:6.0f} µs", flush=True)
                rows += got
        summary = medians(rows)
        print()
        print(table(summary, args.clients, peers))
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"rows": rows, "medians": [{"system": s, "clients": c, **v} for (s, c), v in summary.items()]},
                indent=1))
    finally:
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
