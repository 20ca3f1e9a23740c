"""A process paused inside `SQLiteStore.transaction` stalls nobody (real processes, real SIGSTOP).

The holder process opens a transaction on its scope, writes a step, says so,
and is then frozen with SIGSTOP. Meanwhile another process writes to other
scopes. The transaction buffers its steps and commits them in one short
write at the end, so no SQLite lock is held while the holder is frozen:
those writes fail 0 of N. After SIGCONT the holder's transaction commits.

Control: a store whose transaction holds the write lock across the caller's
code (the old behaviour, via the locked unit of ``admitted``) makes the other
process's writes fail.

The pause is 3 s by default and 30 s with ``STOCKADE_LONG=1``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stockade.resources.store import SQLiteStore

CLUSTER = "0123456789abcdef"
LONG = int(os.environ.get("STOCKADE_LONG", "0") or 0)
PAUSE_S = 30.0 if LONG else 3.0
WRITES_MIN = 100
WRITER_BUSY_TIMEOUT_MS = 50  # each write of the other process waits at most this long for the lock
WAIT_S = 20.0

_HOLDER = """
import sys
from contextlib import contextmanager
from stockade.core.tokens import FencingToken
from stockade.resources._tx import Tx
from stockade.resources.store import SQLiteStore

class LockHeldAcrossCallerCode(SQLiteStore):
    # The old behaviour: the write transaction stays open while the caller's block runs.
    @contextmanager
    def transaction(self, scope, *, token):
        with self.admitted(token, scope) as unit:
            yield Tx(unit, token, value_bytes_max=self.value_bytes_max)

path, cluster, mode = sys.argv[1], sys.argv[2], sys.argv[3]
store_class = LockHeldAcrossCallerCode if mode == "control" else SQLiteStore
with store_class(path, keys="unsigned") as store:
    with store.transaction("held", token=FencingToken(cluster, "held", 1)) as tx:
        tx.put("step-1", b"before the pause")
        print("in-transaction", flush=True)
        sys.stdin.readline()  # the test freezes this process here, then lets it go on
        tx.put("step-2", b"after the pause")
    print("committed", flush=True)
"""

_WRITER = """
import sys, time
from stockade.core.errors import BackendUnavailable
from stockade.core.tokens import FencingToken
from stockade.resources.store import SQLiteStore
path, cluster = sys.argv[1], sys.argv[2]
writes_min, pause_s, busy_ms = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
ok = failed = 0
with SQLiteStore(path, busy_timeout_ms=busy_ms, keys="unsigned") as store:
    print("ready", flush=True)
    sys.stdin.readline()  # the holder is frozen inside its transaction now
    started = time.monotonic()
    while ok + failed < writes_min or time.monotonic() - started < pause_s:
        scope = "other-%d" % ((ok + failed) % 16)
        try:
            store.put(scope, "k", b"v", token=FencingToken(cluster, scope, 1))
            ok += 1
        except BackendUnavailable:
            failed += 1
        if ok + failed >= writes_min and failed and time.monotonic() - started >= 1.0:
            break  # the control has shown its failures: no need to wait out the pause
print(ok, failed, flush=True)
"""


def run(tmp_path: Path, mode: str) -> tuple[int, int, str]:
    """Returns (writes ok, writes failed, the holder's last line) while the holder is frozen in its transaction."""
    path = tmp_path / f"{mode}.db"
    SQLiteStore(path, cluster_id=CLUSTER, keys="unsigned").close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # The writer opens the store first (opening writes the schema check), then waits for the pause.
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), CLUSTER, str(WRITES_MIN), str(PAUSE_S), str(WRITER_BUSY_TIMEOUT_MS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    holder = None
    try:
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read() if writer.poll() is not None else ""
        # Only now the holder: its open transaction must not race the writer's opening of the store.
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), CLUSTER, mode],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert holder.stdout.readline().strip() == "in-transaction"
        holder.send_signal(signal.SIGSTOP)
        out, err = writer.communicate("go\n", timeout=PAUSE_S + 60)
        assert writer.returncode == 0, err
        ok, failed = map(int, out.split())
        holder.send_signal(signal.SIGCONT)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        last = holder.stdout.readline().strip()
        holder.wait(WAIT_S)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(WAIT_S)
        if holder is not None and holder.poll() is None:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
            holder.wait(WAIT_S)
    return ok, failed, last


def test_a_holder_paused_inside_a_transaction_stalls_no_other_scope(tmp_path, capsys):
    started = time.monotonic()
    ok, failed, last = run(tmp_path, "buffered")
    paused = time.monotonic() - started
    with capsys.disabled():
        print(f"\n[figure] holder SIGSTOPped in a transaction for about {paused:.0f} s: writes to other scopes "
              f"from another process failed {failed} of {ok + failed}; "
              f"the holder then committed: {last == 'committed'}")
    assert ok + failed >= WRITES_MIN and failed == 0
    assert last == "committed"
    with SQLiteStore(tmp_path / "buffered.db", keys="unsigned") as store:
        assert store.get("held", "step-1").value == b"before the pause"
        assert store.get("held", "step-2").value == b"after the pause"


def test_control_a_lock_held_across_the_callers_code_stalls_other_scopes(tmp_path, capsys):
    ok, failed, last = run(tmp_path, "control")
    with capsys.disabled():
        print(f"\n[figure] control (write lock held across the caller's code): writes to other scopes "
              f"failed {failed} of {ok + failed}")
    assert failed > 0 and ok == 0
    assert last == "committed"
