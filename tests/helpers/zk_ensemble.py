"""A real three-server ZooKeeper 3.8 ensemble on free loopback ports in a temporary directory.

Each server is the Debian ``zookeeper`` jar run by ``java`` (``QuorumPeerMain``)
with its own ``zoo.cfg``, ``myid`` and data directory, a 256 MB heap and the
admin server off. The ensemble is ready when every server answers the ``srvr``
four-letter word with a ``Mode:`` line and one of them is the leader. Servers
are stopped by the pid this helper started, and may be killed (SIGKILL),
paused (SIGSTOP/SIGCONT) and restarted one by one, for the failover tests.

The transaction log is not fsynced by default (``forceSync=no``): a
server killed with SIGKILL loses nothing the kernel already holds, and the
disk is shared by the whole test run; ``force_sync=True`` for measurements.
``tickTime`` is 500 ms, so sessions may be negotiated from 1 s (two ticks) up
to 60 s; a container node left empty is deleted by the server within about
``CONTAINER_CHECK_MS``.
"""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

from stockade.testing.servers import reaper
from stockade.testing.servers.ports import free_ports as _free_ports

__all__ = ["ZkEnsemble", "zookeeper_available", "SERVERS", "CONTAINER_CHECK_MS"]

SERVERS = 3
STARTUP_S = 120
TICK_MS = 500
CONTAINER_CHECK_MS = 300
JARS = "/usr/share/java"


def zookeeper_available() -> bool:
    return os.path.exists(f"{JARS}/zookeeper.jar") and os.path.exists("/usr/bin/java")


def _classpath() -> str:
    names = ["zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-nop.jar", "metrics-core.jar",
             "snappy-java.jar", "commons-cli.jar", "commons-io.jar"]
    netty = sorted(glob.glob(f"{JARS}/netty-*[0-9].Final.jar"))
    return ":".join([f"{JARS}/{name}" for name in names] + netty)


def four_letter(port: int, word: str, timeout_s: float = 1.0) -> str:
    """A four-letter word's answer from the server on ``port`` ("" if it does not answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(word.encode())
            chunks = []
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class ZkEnsemble:
    """Three ZooKeeper servers; ``url`` is the ``zookeeper://`` url of all three."""

    def __init__(self, root: Path, *, servers: int = SERVERS, force_sync: bool = False,
                 sync_limit_ticks: int = 4) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        ports = _free_ports(3 * servers)
        self.ids = list(range(1, servers + 1))
        self.client_ports = dict(zip(self.ids, ports[:servers], strict=True))
        quorum = ports[servers:2 * servers]
        election = ports[2 * servers:]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        members = "\n".join(f"server.{i}=127.0.0.1:{quorum[i - 1]}:{election[i - 1]}" for i in self.ids)
        for i in self.ids:
            data = root / f"zk{i}"
            data.mkdir(exist_ok=True)
            (data / "myid").write_text(f"{i}\n")
            (root / f"zoo{i}.cfg").write_text(
                f"tickTime={TICK_MS}\ninitLimit=20\nsyncLimit={sync_limit_ticks}\ndataDir={data}\n"
                f"clientPort={self.client_ports[i]}\nclientPortAddress=127.0.0.1\n"
                "minSessionTimeout=1000\nmaxSessionTimeout=60000\nmaxClientCnxns=0\n"
                "admin.enableServer=false\n4lw.commands.whitelist=srvr,ruok,mntr\n"
                "autopurge.purgeInterval=0\nquorumListenOnAllIPs=false\n"
                f"forceSync={'yes' if force_sync else 'no'}\n"
                f"{members}\n"
            )
        for i in self.ids:
            self.start(i)
        self.wait_ready()

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{self.client_ports[i]}" for i in self.ids)

    @property
    def url(self) -> str:
        return f"zookeeper://{self.hosts}"

    def start(self, i: int) -> None:
        log = open(self.root / f"zk{i}.log", "ab")  # noqa: SIM115 - closed with the process
        self.processes[i] = self._spawn(self.argv(i), log)
        log.close()

    def argv(self, i: int) -> list[str]:
        """The command line of server ``i`` (its configuration in ``root/zoo<i>.cfg``)."""
        return ["java", "-Xmx256m", "-Xms32m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Dznode.container.checkIntervalMs={CONTAINER_CHECK_MS}", "-Dznode.container.maxPerMinute=100000",
                "-Dzookeeper.admin.enableServer=false", "-cp", _classpath(),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(self.root / f"zoo{i}.cfg")]

    def _spawn(self, argv: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        """Start one server, watched by the reaper (ended if this test process is killed)."""
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        reaper.watch(process.pid)
        return process

    def mode(self, i: int) -> str:
        """``leader``, ``follower`` or "" (down, or not serving yet)."""
        if self.processes[i].poll() is not None:
            return ""
        for line in four_letter(self.client_ports[i], "srvr", 0.5).splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return ""

    def wait_ready(self, ids: list[int] | None = None, timeout_s: float = STARTUP_S) -> None:
        deadline = time.monotonic() + timeout_s
        for i in ids or self.ids:
            while self.mode(i) not in ("leader", "follower"):
                process = self.processes[i]
                if process.poll() is not None:
                    raise RuntimeError(f"zookeeper {i} exited {process.returncode}: {self.log(i)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"zookeeper {i} not serving after {timeout_s} s: {self.log(i)}")
                time.sleep(0.1)

    def wait_serving(self, timeout_s: float = STARTUP_S) -> None:
        """Every server in quorum and answering a client's write and read (after faults)."""
        from kazoo.client import KazooClient

        self.wait_ready(timeout_s=timeout_s)
        for i in self.ids:
            client = KazooClient(hosts=f"127.0.0.1:{self.client_ports[i]}", timeout=timeout_s)
            try:
                client.start(timeout_s)
                client.ensure_path("/serving")
                client.sync("/serving")
                client.exists("/serving")
            finally:
                client.stop()
                client.close()

    def leader(self, timeout_s: float = 120.0, *, other_than: int | None = None) -> int:
        """The id of the server that is leader now (waits for one, not ``other_than``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i in self.ids:
                if i != other_than and self.mode(i) == "leader":
                    return i
            if time.monotonic() > deadline:
                raise RuntimeError(f"no zookeeper leader: {[self.log(i)[-500:] for i in self.ids]}")
            time.sleep(0.05)

    def log(self, i: int) -> str:
        path = self.root / f"zk{i}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def kill(self, i: int) -> None:
        process = self.processes[i]
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGKILL)
            process.wait(10)

    def pause(self, i: int) -> None:
        self.processes[i].send_signal(signal.SIGSTOP)

    def resume(self, i: int) -> None:
        self.processes[i].send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop every server this helper started (SIGKILL: their data is thrown away)."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
        for process in self.processes.values():
            process.wait(10)
