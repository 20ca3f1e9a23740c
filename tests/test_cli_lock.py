"""``stockade lock -- CMD`` under real signals: CMD never outlives the lock, the lease outlives CMD.

Everything here is judged by counts and order, never by sleeping a fixed time:
conditions are polled with generous bounds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import python_env

import stockade

STOCKADE = [sys.executable, "-m", "stockade"]
BOUND_S = 30.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")


def env_for(tmp_path: Path) -> dict[str, str]:
    return {**python_env(), "STOCKADE_DATA": str(tmp_path / "data")}


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaps, e.g. under a PID 1 that does not reap, is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def poll(condition, bound_s: float = BOUND_S) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def kill_quietly(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a process this test started, unless it was reaped already: its pid may be another's by now (the
    suite starts tens of thousands of processes and this host's pid_max is 32,768, so pids come round)."""
    if proc.poll() is None:
        proc.kill()


def kill_child_quietly(pidfd: int) -> None:
    """SIGKILL CMD (a child of `stockade lock`, not of this test) through the pidfd opened while it ran: never
    another process that took its pid since."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)


def start_lock(tmp_path: Path, scope: str, cmd: list[str], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        STOCKADE + ["lock", scope, *extra, "--", *cmd],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for(tmp_path),
    )


def run_lock(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(STOCKADE + ["lock", *args], capture_output=True, text=True, env=env_for(tmp_path),
                          timeout=60)


def test_cmd_dies_when_stockade_lock_is_sigkilled(tmp_path):
    runs = 20
    locks = [start_lock(tmp_path, f"kill{i}", ["sh", "-c", "echo $$; exec sleep 300"]) for i in range(runs)]
    children: list[int] = []
    pidfds: list[int] = []
    try:
        for lock in locks:
            children.append(int(lock.stdout.readline()))
            pidfds.append(os.pidfd_open(children[-1]))  # CMD runs (it is exec'd sleep under this pid)
        assert all(alive(pid) for pid in children)
        for lock in locks:
            lock.send_signal(signal.SIGKILL)
        for lock in locks:
            assert lock.wait(timeout=BOUND_S) == -signal.SIGKILL
        poll(lambda: not any(alive(pid) for pid in children))
        survived = sum(alive(pid) for pid in children)
        print(f"\nCMD survived {survived} of {runs} SIGKILLs of stockade lock")
        assert survived == 0
    finally:
        for pidfd in pidfds:
            kill_child_quietly(pidfd)
        for lock in locks:
            kill_quietly(lock)
            lock.wait()
            lock.stdout.close()
            lock.stderr.close()


IGNORES_SIGTERM = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: print('term', flush=True))\n"
    "print(os.getpid(), flush=True)\n"
    "time.sleep(300)\n"
)


def test_sigterm_ignoring_cmd_is_killed_after_grace_and_lease_released(tmp_path):
    runs = 10
    locks = [start_lock(tmp_path, f"term{i}", [sys.executable, "-c", IGNORES_SIGTERM], "--grace-ms", "300")
             for i in range(runs)]
    children: list[int] = []
    pidfds: list[int] = []
    try:
        for lock in locks:
            children.append(int(lock.stdout.readline()))
            pidfds.append(os.pidfd_open(children[-1]))
        for lock in locks:
            lock.send_signal(signal.SIGTERM)
        statuses = []
        deadline = time.monotonic() + BOUND_S
        for lock in locks:
            try:
                statuses.append(lock.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                statuses.append(None)
        running = sum(alive(pid) for pid in children)
        print(f"\n{running} of {runs} SIGTERM-ignoring CMDs still running after grace; exit statuses {statuses}")
        assert running == 0
        assert statuses == [137] * runs
        for lock in locks:
            assert lock.stdout.readline().strip() == "term"  # SIGTERM was forwarded first
            assert "killing it" in lock.stderr.read()
        # the lease was released: the scopes are free at once
        for i in range(runs):
            assert run_lock(tmp_path, f"term{i}", "--", "true").returncode == 0
    finally:
        for pidfd in pidfds:
            kill_child_quietly(pidfd)
        for lock in locks:
            kill_quietly(lock)
            lock.wait()
            lock.stdout.close()
            lock.stderr.close()


# On SIGTERM, CMD itself tries to take its own scope: it must find it still held
# (the lease is released only once CMD is gone), then it goes on ignoring SIGTERM.
CHECKS_LEASE_ON_SIGTERM = (
    "import os, signal, time, stockade\n"
    "coord = stockade.connect('sqlite:///' + os.environ['STOCKADE_DATA'] + '/coord.db')\n"
    "def on_term(*_):\n"
    "    try:\n"
    "        coord.acquire(os.environ['STOCKADE_SCOPE'], ttl_ms=1000).release(); print('free', flush=True)\n"
    "    except stockade.LockTimeout:\n"
    "        print('held', flush=True)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('ready', flush=True)\n"
    "time.sleep(300)\n"
)


def test_lease_is_released_only_after_cmd_is_gone(tmp_path):
    lock = start_lock(tmp_path, "order", [sys.executable, "-c", CHECKS_LEASE_ON_SIGTERM], "--grace-ms", "5000")
    try:
        assert lock.stdout.readline().strip() == "ready"
        lock.send_signal(signal.SIGTERM)
        assert lock.stdout.readline().strip() == "held"
        assert lock.wait(timeout=BOUND_S) == 137
        coord = stockade.connect(f"sqlite:///{tmp_path / 'data' / 'coord.db'}")
        try:
            info = coord.inspect("order")
            assert info.state.value == "free" and info.last_token > 0  # released; the probe got no grant ("held")
        finally:
            coord.close()
    finally:
        kill_quietly(lock)
        lock.wait()
        lock.stdout.close()
        lock.stderr.close()


def _signal_masks(pid: int) -> str:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return repr(exc)
    return "; ".join(line for line in lines if line.startswith(("State", "PPid", "Sig", "ShdPnd")))


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT])
def test_signals_are_forwarded_to_cmd(tmp_path, signum):
    script = ("import os, signal, sys, time\n"
              f"signal.signal({int(signum)}, lambda *_: sys.exit(0))\n"
              "print('ready', os.getpid(), flush=True)\n"
              "time.sleep(300)\n")
    lock = start_lock(tmp_path, "fwd", [sys.executable, "-c", script])
    try:
        said, pid = lock.stdout.readline().split()
        assert said == "ready"
        masks = _signal_masks(int(pid))  # what CMD blocks, ignores and catches, should the forward not end it
        lock.send_signal(signum)
        code = lock.wait(timeout=BOUND_S)
        assert code == 0, (code, lock.stderr.read(), masks)  # CMD handled it and exited 0
    finally:
        kill_quietly(lock)
        lock.wait()
        lock.stdout.close()
        lock.stderr.close()


#: Runs `stockade lock` in this process with a SIGINT sent to itself right after CMD is spawned, before the
#: forwarding handler is in place (the window a Ctrl-C once fell into). ``control``: the old handler (interrupt
#: `stockade lock`) is back in that window, as before the fix.
SIGNAL_IN_THE_SPAWN_WINDOW = (
    "import os, signal, sys\n"
    "from stockade.cli import lock\n"
    "real = lock._spawn\n"
    "def spawn_then_signal(command, env):\n"
    "    child = real(command, env)\n"
    "    if sys.argv[1] == 'control':\n"
    "        def interrupt(signum, _frame):\n"
    "            raise lock._Interrupted(signum)\n"
    "        signal.signal(signal.SIGINT, interrupt)\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "    return child\n"
    "lock._spawn = spawn_then_signal\n"
    "sys.exit(lock.run(sys.argv[2:]))\n"
)


@pytest.mark.parametrize("mode", ["fixed", "control"])
def test_a_signal_while_cmd_is_spawned_goes_to_cmd(tmp_path, mode):
    """A SIGINT that lands between CMD's spawn and the forwarding handler is CMD's: CMD ends by it (`stockade
    lock` exits 130 as CMD's status, with no word of its own) and the lease is released after. The control, with
    the old handler in that window, ends `stockade lock` itself ("interrupted by SIGINT") and must be told apart."""
    runs = 5
    said: list[str] = []
    for i in range(runs):
        argv = [sys.executable, "-c", SIGNAL_IN_THE_SPAWN_WINDOW, mode, f"window{i}", "--", "sleep", "300"]
        result = subprocess.run(argv, capture_output=True, text=True, env=env_for(tmp_path), timeout=60)
        assert result.returncode == 130, (result.returncode, result.stderr)
        said.append(result.stderr)
    interrupted = sum("interrupted by SIGINT" in text for text in said)
    if mode == "control":
        assert interrupted == runs, said
        return
    assert interrupted == 0, said  # 0 of 5: CMD got the signal, `stockade lock` did not end by it
    coord = stockade.connect(f"sqlite:///{tmp_path / 'data' / 'coord.db'}")
    try:
        assert all(coord.inspect(f"window{i}").state.value == "free" for i in range(runs))
    finally:
        coord.close()


def test_command_not_executable_126_not_found_127(tmp_path):
    not_executable = tmp_path / "script.sh"
    not_executable.write_text("#!/bin/sh\necho hi\n")
    not_executable.chmod(0o644)
    cases = [
        ([str(not_executable)], 126, "cannot execute"),
        ([str(tmp_path)], 126, "cannot execute"),
        (["stockade-no-such-command-xyz"], 127, "command not found"),
        ([str(tmp_path / "missing")], 127, "no such file"),
    ]
    for cmd, expected, message in cases:
        result = run_lock(tmp_path, "exec", "--", *cmd)
        assert result.returncode == expected, (cmd, result.returncode, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
        said = [line for line in result.stderr.splitlines() if "created a new coordinator" not in line]  # 1st run
        assert len(said) == 1, result.stderr
    # nothing was left held
    assert run_lock(tmp_path, "exec", "--", "true").returncode == 0


def test_ctrl_c_while_waiting_exits_130_without_traceback(tmp_path):
    sleeper = "import time; print('in', flush=True); time.sleep(300)"
    holder = start_lock(tmp_path, "wait", [sys.executable, "-c", sleeper])
    waiter = None
    coord = None
    try:
        assert holder.stdout.readline().strip() == "in"
        waiter = start_lock(tmp_path, "wait", ["true"], "--wait-ms", "120000")
        coord = stockade.connect(f"sqlite:///{tmp_path / 'data' / 'coord.db'}")
        assert poll(lambda: coord.inspect("wait").waiters == 1), "the waiter never queued"
        waiter.send_signal(signal.SIGINT)
        assert waiter.wait(timeout=BOUND_S) == 130
        stderr = waiter.stderr.read()
        assert "Traceback" not in stderr and "interrupted" in stderr, stderr
        assert holder.poll() is None  # the holder is untouched
    finally:
        if coord is not None:
            coord.close()
        for proc in (holder, waiter):
            if proc is not None:
                kill_quietly(proc)
                proc.wait()
                proc.stdout.close()
                proc.stderr.close()


def test_wait_forever_is_granted_and_ctrl_c_ends_it_leaving_no_waiter(tmp_path):
    """``--wait forever`` (and ``--wait-ms forever``) waits until granted: Ctrl-C while queued exits 130 and
    the queue is empty after; a second one runs CMD once the holder's CMD has ended."""
    sleeper = "import time; print('in', flush=True); time.sleep(300)"
    holder = start_lock(tmp_path, "forever", [sys.executable, "-c", sleeper])
    waiters: list[subprocess.Popen[str]] = []
    coord = None
    try:
        assert holder.stdout.readline().strip() == "in"
        coord = stockade.connect(f"sqlite:///{tmp_path / 'data' / 'coord.db'}")
        waiters.append(start_lock(tmp_path, "forever", ["true"], "--wait", "forever"))
        assert poll(lambda: coord.inspect("forever").waiters == 1), "the waiter never queued"
        waiters[0].send_signal(signal.SIGINT)
        assert waiters[0].wait(timeout=BOUND_S) == 130
        assert poll(lambda: coord.inspect("forever").waiters == 0), "the interrupted wait left its waiter"
        waiters.append(start_lock(tmp_path, "forever", [sys.executable, "-c", "print('granted')"],
                                  "--wait-ms", "forever"))
        assert poll(lambda: coord.inspect("forever").waiters == 1), "the second waiter never queued"
        holder.send_signal(signal.SIGTERM)  # forwarded to the sleeper: it ends, and the lease is released
        assert waiters[1].wait(timeout=BOUND_S) == 0, waiters[1].stderr.read()
        assert waiters[1].stdout.read().strip() == "granted"
    finally:
        if coord is not None:
            coord.close()
        for proc in (holder, *waiters):
            kill_quietly(proc)
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
