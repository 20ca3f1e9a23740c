"""Run worker processes (tests/helpers/jobs_worker.py) racing on job keys, with kill -9 and SIGSTOP, and judge.

`race` starts the workers, resumes a stopped one once its lease has run out
(``pause_ms`` after it stopped), restarts a killed one (up to ``restarts_max``
in all), waits for all to finish, then reads every log and every job scope.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import stockade
from stockade.recipes import jobs

WORKER = Path(__file__).resolve().parent / "jobs_worker.py"
SRC = Path(__file__).resolve().parents[2] / "src"


@dataclass
class Verdict:
    keys: int
    runs: int = 0  # jobs started (fn called)
    effects_twice: int = 0  # keys whose effect landed more than once
    started_twice: int = 0  # keys whose job was started by more than one run
    rerun_after_done: int = 0  # keys started again after a run had finished
    killed_mid_run: int = 0  # runs started by a process that was killed before the run ended
    killed_reported_done: int = 0  # of those, keys the store says are done (must be 0)
    killed_not_uncertain: int = 0  # of those, keys a later once() did not report uncertain (must be 0)
    stopped: int = 0  # runs paused by SIGSTOP past their lease
    stale_refused: int = 0  # writes of a resumed run refused by the fence
    uncertain: int = 0  # keys left uncertain
    unexplained_uncertain: int = 0  # uncertain keys with no kill or stop to explain them (must be 0)
    done: int = 0
    kills: int = 0
    restarts: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def race(
    data: Path, *, workers: int, keys: int, mode: str = "once", pause_ms: int = 1_500, restarts_max: int = 200,
    timeout_s: float = 600, faults_each: int = 0,
) -> Verdict:
    """Race ``workers`` processes on ``keys`` job keys; ``faults_each`` keys each get a kill -9 before
    the effect, a kill -9 after it, and a SIGSTOP (keys spread evenly)."""
    data.mkdir(parents=True, exist_ok=True)
    plan = [f"k{n:05d}" for n in range(1, keys, max(1, keys // max(1, 3 * faults_each)))][:3 * faults_each]
    faults = ",".join(f"{key}:{('kb', 'ka', 'st')[i % 3]}" for i, key in enumerate(plan))
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               JOBS_FAULTS=faults)
    seeds = iter(range(1, 1_000_000))

    def spawn(worker: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, str(WORKER), str(data), worker, str(next(seeds)), str(keys), mode], env=env,
            stderr=subprocess.PIPE,
        )

    # The files exist before the workers race to open them.
    stockade.connect(f"sqlite:///{data}/coord.db?process=embedded").close()
    verdict = Verdict(keys)
    started = time.monotonic()
    procs = {f"w{i}": spawn(f"w{i}") for i in range(workers)}
    killed_pids: set[int] = set()
    stopped_at: dict[int, float] = {}
    try:
        while procs:
            if time.monotonic() - started > timeout_s:
                raise AssertionError(f"the workers did not finish in {timeout_s} s")
            for name, proc in list(procs.items()):
                rc = proc.poll()
                if rc is None:
                    if _state(proc.pid) == "T":
                        first = stopped_at.setdefault(proc.pid, time.monotonic())
                        if time.monotonic() - first >= pause_ms / 1000:
                            os.kill(proc.pid, signal.SIGCONT)
                            stopped_at.pop(proc.pid)
                    continue
                stderr = proc.stderr.read().decode() if proc.stderr else ""
                if rc == -signal.SIGKILL:
                    verdict.kills += 1
                    killed_pids.add(proc.pid)
                    if verdict.restarts < restarts_max:
                        verdict.restarts += 1
                        procs[name] = spawn(name)
                        continue
                elif rc != 0:
                    raise AssertionError(f"worker {name} exited {rc}: {stderr[-3000:]}")
                del procs[name]
            time.sleep(0.01)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
    verdict.seconds = time.monotonic() - started
    _judge(data, verdict, killed_pids, mode)
    return verdict


def _judge(data: Path, verdict: Verdict, killed_pids: set[int], mode: str) -> None:
    starts: Counter[str] = Counter()
    ends: dict[str, int] = defaultdict(int)
    open_runs: dict[tuple[int, str], bool] = {}
    killed_keys: set[str] = set()
    stopped_keys: set[str] = set()
    cut_off: set[str] = set()  # keys of a run whose lease was lost (slow machine) and whose write was refused
    rerun = set()
    for log in sorted(data.glob("log-*")):
        pid = int(log.name.rsplit("-", 1)[1])
        for line in log.read_text().splitlines():
            what, key, *_ = line.split()
            if what == "start":
                starts[key] += 1
                if ends[key]:
                    rerun.add(key)
                open_runs[(pid, key)] = True
            elif what == "end":
                ends[key] += 1
                open_runs.pop((pid, key), None)
            elif what == "stop":
                stopped_keys.add(key)
            elif what == "stale":
                verdict.stale_refused += 1
                cut_off.add(key)
        for (run_pid, key) in list(open_runs):
            if run_pid == pid and pid in killed_pids:
                killed_keys.add(key)
    verdict.runs = sum(starts.values())
    verdict.started_twice = sum(1 for n in starts.values() if n > 1)
    verdict.rerun_after_done = len(rerun)
    verdict.killed_mid_run = len(killed_keys)
    verdict.stopped = len(stopped_keys)
    coord = stockade.connect(f"sqlite:///{data}/coord.db?process=embedded")
    store = stockade.open_store(f"sqlite:///{data}/store.db", cluster_id=coord.cluster_id)
    try:
        listed = set()
        after = ""
        while page := jobs.uncertain(coord, store, after=after, limit=1000):
            listed.update(r.key for r in page)
            after = page[-1].key
        for n in range(verdict.keys):
            key = f"k{n:05d}"
            scope = jobs.job_scope(key)
            effects = [i for i in store.list(scope) if i.key.startswith("effect/")]
            if len(effects) > 1:
                verdict.effects_twice += 1
            if mode != "once":
                continue
            record = jobs.status(store, key)
            if record is not None and record.uncertain:
                verdict.uncertain += 1
                if key not in killed_keys | stopped_keys | cut_off:
                    verdict.unexplained_uncertain += 1
                if key not in listed:
                    verdict.notes.append(f"{key} uncertain but not listed")
            elif record is not None:
                verdict.done += 1
            if key in killed_keys:
                if record is not None and not record.uncertain:
                    verdict.killed_reported_done += 1
                try:
                    jobs.once(coord, store, key, lambda ctx: None, ttl_ms=1_000, wait_ms=5_000)
                    verdict.killed_not_uncertain += 1
                except jobs.JobUncertain:
                    pass
    finally:
        store.close()
        coord.close()


def figure(v: Verdict) -> str:
    return (
        f"jobs: {v.keys} keys, {v.runs} runs, {v.kills} kill -9, {v.stopped} SIGSTOP past the lease, "
        f"{v.seconds:.1f} s: effects applied twice {v.effects_twice} of {v.keys}, started twice {v.started_twice}, "
        f"re-ran after done {v.rerun_after_done}; killed mid-run {v.killed_mid_run}: reported done "
        f"{v.killed_reported_done}, not uncertain on retry {v.killed_not_uncertain}; uncertain {v.uncertain} "
        f"(unexplained {v.unexplained_uncertain}), done {v.done}, runs cut off by a lost lease {v.stale_refused}"
    )
