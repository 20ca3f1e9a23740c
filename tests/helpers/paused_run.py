"""Drive ``paused_holder.py`` (the etcd and ZooKeeper coordinator tests).

`paused_holder_writes` starts the holder, SIGSTOPs it past its leases (or its
session), takes and writes every scope from this process, SIGCONTs it and
returns what its writes with the old tokens got: ``(accepted, rejected)``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import stockade

HELPERS = Path(__file__).parent


def paused_holder_writes(url: str, child_url: str, directory: Path, count: int, mutant: str = "",
                         env: dict[str, str] | None = None) -> tuple[int, int]:
    coord = stockade.connect(url)
    store_path = directory / "store.db"
    store = stockade.open_store(f"sqlite:///{store_path}", cluster_id=coord.cluster_id, keys=coord.verify_keys())
    argv = [sys.executable, str(HELPERS / "paused_holder.py"), child_url, str(store_path), str(count)]
    child = subprocess.Popen(
        argv + ([mutant] if mutant else []), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "held"
        child.send_signal(signal.SIGSTOP)
        for index in range(count):  # each granted once the paused holder's lease (or session) ended
            lease = coord.acquire(f"p{index}", ttl_ms=5000, wait_ms=30_000)
            store.put(f"p{index}", "k", b"from the new holder", token=lease.token)
            lease.release()
        child.send_signal(signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        fields = child.stdout.readline().split()
        child.wait(30)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait(10)
        store.close()
        coord.close()
    return int(fields[1]), int(fields[3])
