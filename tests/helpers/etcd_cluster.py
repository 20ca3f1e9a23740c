"""A real three-member etcd 3.4 cluster on free loopback ports in a temporary directory.

Each member is the Debian ``etcd`` binary, started with its own client and
peer port; the cluster is ready when every member's ``/health`` says
``"health":"true"``. Members are stopped by the pid this helper started, and
may be killed (SIGKILL), paused (SIGSTOP/SIGCONT) and restarted one by one, for
the failover tests.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import IO

from stockade.testing.servers import reaper
from stockade.testing.servers.ports import free_ports as _free_ports

__all__ = ["EtcdCluster", "etcd_available", "MEMBERS"]

MEMBERS = 3
STARTUP_S = 30


def etcd_available() -> bool:
    return shutil.which("etcd") is not None


class EtcdCluster:
    """Three etcd members; ``url`` is the ``etcd://`` url of all three."""

    def __init__(self, root: Path, *, members: int = MEMBERS, extra_args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.extra_args = extra_args  # more flags for every member (e.g. a small --quota-backend-bytes)
        root.mkdir(parents=True, exist_ok=True)
        ports = _free_ports(2 * members)
        self.names = [f"n{i + 1}" for i in range(members)]
        self.client_ports = dict(zip(self.names, ports[:members], strict=True))
        self.peer_ports = dict(zip(self.names, ports[members:], strict=True))
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.token = f"stockade-{os.getpid()}-{root.name}"
        self.initial_cluster = ",".join(f"{n}=http://127.0.0.1:{self.peer_ports[n]}" for n in self.names)
        for name in self.names:
            self.start(name, state="new")
        self.wait_healthy()

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(f"127.0.0.1:{self.client_ports[n]}" for n in self.names)

    def client_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.client_ports[name]}"

    def start(self, name: str, *, state: str = "existing") -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        self.processes[name] = self._spawn(self.argv(name, state), log)
        log.close()

    def argv(self, name: str, state: str) -> list[str]:
        """The command line of member ``name`` (its data in ``root/name``)."""
        client = self.client_url(name)
        peer = f"http://127.0.0.1:{self.peer_ports[name]}"
        return [
            "etcd", "--name", name, "--data-dir", str(self.root / name),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster, "--initial-cluster-state", state,
            "--initial-cluster-token", self.token,
            "--logger", "zap", "--log-level", "warn", *self.extra_args,
        ]

    def _spawn(self, argv: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start one member, watched by the reaper (ended if this test process is killed)."""
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        reaper.watch(process.pid)
        return process

    def _get(self, name: str, path: str, timeout_s: float = 1.0) -> dict:
        with urllib.request.urlopen(self.client_url(name) + path, timeout=timeout_s) as response:
            return json.loads(response.read())

    def _post(self, name: str, path: str, body: dict, timeout_s: float = 1.0) -> dict:
        request = urllib.request.Request(self.client_url(name) + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())

    def healthy(self, name: str) -> bool:
        try:
            return self._get(name, "/health").get("health") == "true"
        except (OSError, ValueError):
            return False

    def wait_healthy(self, names: list[str] | None = None, timeout_s: float = STARTUP_S) -> None:
        deadline = time.monotonic() + timeout_s
        for name in names or self.names:
            while not self.healthy(name):
                process = self.processes[name]
                if process.poll() is not None:
                    raise RuntimeError(f"etcd {name} exited {process.returncode}: {self.log(name)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd {name} not healthy after {timeout_s} s: {self.log(name)}")
                time.sleep(0.05)

    def leader(self, timeout_s: float = 20.0) -> str:
        """The name of the member that is leader now (waits for one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for name in self.names:
                if self.processes[name].poll() is not None:
                    continue
                try:
                    status = self._post(name, "/v3/maintenance/status", {}, 0.5)
                except (OSError, ValueError):
                    continue
                header = status.get("header", {})
                if status.get("leader") and status.get("leader") == header.get("member_id"):
                    return name
            if time.monotonic() > deadline:
                raise RuntimeError("no etcd leader")
            time.sleep(0.05)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def kill(self, name: str) -> None:
        process = self.processes[name]
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(10)

    def pause(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGCONT)

    def snapshot(self, path: Path) -> None:
        """``etcdctl snapshot save`` from the first member."""
        subprocess.run(["etcdctl", "--endpoints", self.client_url(self.names[0]), "snapshot", "save", str(path)],
                       check=True, capture_output=True, env={**os.environ, "ETCDCTL_API": "3"}, timeout=60)

    def restore(self, path: Path, *, cluster_token: str | None = None) -> None:
        """Stop every member, restore each from ``path`` (``etcdctl snapshot restore``), start them again.

        ``cluster_token``: restore under another cluster token (etcd's cluster id then changes).
        """
        self.stop()
        if cluster_token is not None:
            self.token = cluster_token
        for name in self.names:
            shutil.rmtree(self.root / name, ignore_errors=True)
            subprocess.run(
                ["etcdctl", "snapshot", "restore", str(path), "--name", name, "--data-dir", str(self.root / name),
                 "--initial-cluster", self.initial_cluster, "--initial-cluster-token", self.token,
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[name]}"],
                check=True, capture_output=True, env={**os.environ, "ETCDCTL_API": "3"}, timeout=60,
            )
        for name in self.names:
            self.start(name, state="new")
        self.wait_healthy()

    def status(self, name: str) -> dict:
        """One member's ``/v3/maintenance/status`` (cluster id, revision, raft index)."""
        return self._post(name, "/v3/maintenance/status", {}, 5.0)

    def put(self, key: bytes, value: bytes = b"") -> int:
        """A raw put outside stockade; its create revision is what a grant's token would be now."""
        answer = self._post(self.names[0], "/v3/kv/put",
                            {"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()}, 5.0)
        return int(answer["header"]["revision"])

    def stop(self) -> None:
        """Stop every member this helper started (SIGKILL: their data is thrown away, or restored)."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
        for process in self.processes.values():
            process.wait(10)
