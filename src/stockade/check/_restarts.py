"""The cases of `stockade check` that take a server down: coordinator failover and resource restore.

- ``failover``: A takes the lease (token n) and writes; A is frozen with its
  next write in its pipe, so it holds the lease across the restart; the
  coordinator is restarted (the user's ``--coordinator-restart`` command, or,
  for a SQLite coordinator file, the check closes and reopens it in every
  process, and first stops the file's host process when the url reaches the
  file through it, the default, so that the next connect starts a new one);
  B is granted the lease (token m) and writes; A resumes and its
  write with n reaches the resource. Held when the coordinator came back as
  the same cluster, m is above every token of the scope before the restart
  (C1), A's write is refused and the resource holds B's value.
- ``restore``: A takes the lease (n), writes, lets it go (a zombie keeps n);
  B takes it (m) and writes; the resource is restored from a backup (the
  user's ``--resource-restore`` command, or, for a directory, a copy of the
  check's scratch subdirectory taken at the start of the round); A writes
  with n: *without* a floor the restored resource accepts it, which is what
  the floor is for, reported and not counted; then the check raises the
  scope's mark to the coordinator's floor (`stockade.resources.floor`, for
  its scratch scopes only) and A writes again, B too. Held when A is refused
  and B accepted (R4: holders from before the restore are refused, the
  current holder continues). The ``restore-no-floor`` control skips the floor.

A command runs in ``sh -c`` with no input, its output to a file, in its own
process group (ended whole when it overruns), for at most ``--seconds``. A
command that fails or overruns is bad input: `InvalidArgument` naming the
option (``stockade check`` exits 2 with its one line).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from stockade.check.cases import Run
from stockade.check.targets import Target, scratch_scope
from stockade.check.worker import close_quietly, connect_again
from stockade.coordinators.registry import coordinator_backend
from stockade.coordinators.sqlite._host import stop_host_process
from stockade.core.errors import InvalidArgument
from stockade.timeline import Verdict
from stockade.transport.sqlite_url import sqlite_path

__all__ = ["run_command", "failover_case", "restore_case", "self_restart", "SelfRestore",
           "command_timeout_s"]


def run_command(option: str, command: str, *, timeout_s: float, scratch: str) -> None:
    """Run ``command`` (``sh -c``) and wait at most ``timeout_s``; its output goes to a temporary file.

    Raises:
        InvalidArgument: it exited non-zero (the line quotes its last line of output) or overran (its process
            group is ended).
    """
    env = {**os.environ, "STOCKADE_CHECK_SCRATCH": scratch}
    with tempfile.TemporaryFile() as output:  # a file, not a pipe: a daemon it starts must not hold us
        process = subprocess.Popen(["sh", "-c", command], stdin=subprocess.DEVNULL, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            status = process.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its own group: it and whatever it started, nothing else
            process.wait()
            raise InvalidArgument(option, f"{command!r} did not end within {max(timeout_s, 1.0):.0f} s "
                                          "(--seconds)") from None
        output.seek(0)
        lines = output.read()[-4000:].decode(errors="replace").strip().splitlines()
    if status != 0:
        raise InvalidArgument(option, f"{command!r} exited {status}" + (f": {lines[-1]}" if lines else ""))


def self_restart(run: Run, *, own: bool = False) -> None:
    """The orchestrator closes its coordinator and opens it again (the embedded file's restart, as every
    worker's ``reconnect`` is; after a command, a connection that may have died with the old coordinator), as a
    worker does: a close that fails with the old connection is let be, and the connect is retried (for
    `stockade.check.worker.RECONNECT_S`) while the coordinator is still coming back. ``own``: the check
    restarts the coordinator itself; a file reached through its host process has that process stopped first
    (the next connect, this one or a worker's, starts a new one)."""
    close_quietly(run.coord)
    host_file = _host_file(run.coordinator_url) if own else None
    if host_file is not None:
        stop_host_process(host_file)
    run.coord = connect_again(run.coordinator_url)


def _host_file(url: str) -> Path | None:
    """The file of a ``sqlite://`` url reached through its host process (``process=host``, the default)."""
    if not url.startswith("sqlite:"):
        return None
    backend, location = coordinator_backend(url, "coordinator")
    path, params = backend.url_query(location, "coordinator")
    return sqlite_path(path) if params.get("process") == "host" else None


def failover_case(run: Run, target: Target, *, restart: str | None, rounds: int, deadline: float) -> Verdict:
    """The coordinator failover (see the module docstring); at most ``rounds`` rounds, none begun after
    ``deadline``; ``restart``: the user's command, or None for the embedded file's own restart."""
    scope = scratch_scope(run.scratch, "failover")
    run.case = "failover"
    run.note("", "note", text="case: failover")
    cluster = run.coord.cluster_id
    back = stale_applied = other_cluster = done = 0
    issued: list[int] = []
    for round_ in range(rounds):
        if done and time.monotonic() > deadline:
            break
        issued.append(run.acquire("A", scope))
        run.write("A", scope, "value", f"A{round_}", op=f"failover-{round_}-a1")
        run.freeze_a_sending(scope, f"A{round_}-late", f"failover-{round_}-a2",
                             why="SIGSTOP (holds its lease across the restart)")
        if restart is not None:
            run_command("--coordinator-restart", restart, timeout_s=command_timeout_s(run), scratch=run.scratch)
        self_restart(run, own=restart is None)  # the orchestrator's own connection too
        found = {run.call(name, do="reconnect")["cluster"] for name in ("B", "C")} | {run.coord.cluster_id}
        run.note("", "fault", text="coordinator restarted" + (f": {restart}" if restart else " (file reopened)"))
        token_b = run.newer_holder_writes(scope, f"B{round_}", f"failover-{round_}-b1")
        late = run.thaw_a()
        run.call("A", do="reconnect")  # its connection may have died with the old coordinator
        value, _ = target.read(scope, "value")
        other_cluster += found != {cluster}
        back += token_b <= max(issued)
        stale_applied += not (late["result"] in ("refused", "mismatch") and value == f"B{round_}")
        issued.append(token_b)
        done += 1
    came_back = f"; {other_cluster} of {done} came back as another cluster" if other_cluster else ""
    return Verdict("failover", back == stale_applied == other_cluster == 0,
                   f"{back} of {done} restarts let a token go back (C1); {stale_applied} of {done} rounds where the "
                   f"holder from before won after the restart (its write applied, or the newer one lost){came_back}")


def command_timeout_s(run: Run) -> float:
    """The time one command may take: ``--seconds`` (not what is left of it: a round begun before the bound
    finishes, as every case's does, and a restart that fits the bound must not be cut short by it)."""
    return run.command_timeout_s


class SelfRestore:
    """A directory's own backup and restore, within the check's scratch area: a copy of the scratch subdirectory
    (beside it, named ``<scratch>.backup``) taken at the start of a round and put back in place of it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.backup = root.with_name(root.name + ".backup")

    def snapshot(self) -> None:
        shutil.rmtree(self.backup, ignore_errors=True)
        shutil.copytree(self.root, self.backup, symlinks=True)

    def restore(self) -> None:
        shutil.rmtree(self.root)
        shutil.copytree(self.backup, self.root, symlinks=True)


def _floor(run: Run, target: Target, scope: str) -> int:
    """`stockade floor` for the scratch scope only: its mark raised to the coordinator's last issued token."""
    from stockade.resources.floor import open_floor_target

    floors = run.coord.fence_floors()
    floor_target = open_floor_target(run.floor_url or target.floor_url(), cluster_id=run.coord.cluster_id)
    try:
        after = floor_target.raise_high_waters({scope: floors.floor(scope)}, default=0)
    finally:
        floor_target.close()
    return int(after.get(scope, floors.floor(scope)))


def restore_case(run: Run, *, restore: str | None, own: SelfRestore | None, rounds: int,
                 deadline: float) -> Verdict:
    """The resource restore (see the module docstring); bounded as `failover_case`."""
    scope = scratch_scope(run.scratch, "restore")
    run.case = "restore"
    run.note("", "note", text="case: restore")
    skip_floor = run.control == "restore-no-floor"
    without = stale_applied = current_refused = done = 0
    for round_ in range(rounds):
        if done and time.monotonic() > deadline:
            break
        if own is not None:
            own.snapshot()
        run.acquire("A", scope)
        run.write("A", scope, "value", f"A{round_}", op=f"restore-{round_}-a1")
        run.release("A", scope)  # A keeps its token: a zombie from before the restore
        run.acquire("B", scope)
        run.write("B", scope, "value", f"B{round_}", op=f"restore-{round_}-b1")
        if restore is not None:
            run_command("--resource-restore", restore, timeout_s=command_timeout_s(run), scratch=run.scratch)
        else:
            assert own is not None
            own.restore()
        run.reopen_target()
        for name in run.workers:
            run.call(name, do="reopen")
        run.note("", "fault", text="resource restored" + (f": {restore}" if restore else " (scratch copy)"))
        early = run.write("A", scope, "value", f"A{round_}-early", op=f"restore-{round_}-a2")
        without += early["result"] == "applied"
        if skip_floor:
            run.note("", "note", text="CONTROL: no floor")
        else:
            mark = _floor(run, run.target, scope)
            run.note("", "note", text=f"stockade floor: mark raised to {mark}", mark=mark)
        late = run.write("A", scope, "value", f"A{round_}-late", op=f"restore-{round_}-a3")
        current = run.write("B", scope, "value", f"B{round_}-after", op=f"restore-{round_}-b2")
        run.release("B", scope)
        stale_applied += late["result"] not in ("refused", "mismatch")
        current_refused += current["result"] != "applied"
        done += 1
    return Verdict("restore", stale_applied == current_refused == 0,
                   f"{stale_applied} of {done} stale writes applied after the restore and the floor; "
                   f"{current_refused} of {done} current holders refused; without the floor {without} of {done} "
                   f"stale writes were accepted (what the floor is for)")
