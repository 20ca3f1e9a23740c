"""The Snowflake fault run: worker processes, kill -9, SIGSTOP past the lease, clock steps; then a duplicate count.

`run(...)` starts ``workers`` processes of ids_worker.py against one
coordinator (and store), injects faults in rounds until both ``rounds`` are
done and ``target`` ids are on disk, stops everyone and returns the figures.
Each generator session's file is ascending, so duplicates are counted by
merging the files (heapq.merge) without holding the ids in memory.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
CHUNK = 1 << 16


def faketime_available() -> bool:
    return os.path.exists(LIBFAKETIME)


@dataclass
class Figures:
    ids: int = 0
    duplicates: int = 0
    unordered_sessions: int = 0
    sessions: int = 0
    kills: int = 0
    crashes: int = 0
    stops: int = 0
    steps_back: int = 0
    steps_forward: int = 0
    events: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def line(self, label: str) -> str:
        return (f"{label}: duplicate ids {self.duplicates} of {self.ids} ({self.sessions} sessions, "
                f"crashes {self.crashes}, "
                f"unordered sessions {self.unordered_sessions}); kill -9 {self.kills}, SIGSTOP {self.stops}, "
                f"clock steps back {self.steps_back} / forward {self.steps_forward}; events {self.events}; "
                f"{self.seconds:.1f} s")


def _read_session(path: Path) -> Iterator[int]:
    with open(path, "rb") as f:
        while True:
            data = f.read(CHUNK * 8)
            data = data[: len(data) // 8 * 8]  # a kill -9 may leave a partial record
            if not data:
                return
            yield from array("q", data)


def count_duplicates(out: Path, figures: Figures) -> None:
    runs = []
    for path in sorted(out.glob("*.bin")):
        figures.sessions += 1
        previous = -1
        ordered = True
        for value in _read_session(path):
            if value <= previous:
                ordered = False
                break
            previous = value
        if not ordered:  # a generator bug; still count its duplicates (small files only)
            figures.unordered_sessions += 1
            runs.append(iter(sorted(_read_session(path))))
        else:
            runs.append(_read_session(path))
    previous = None
    for value in heapq.merge(*runs):
        figures.ids += 1
        if value == previous:
            figures.duplicates += 1
        previous = value


class Worker:
    def __init__(self, label: str, config: dict, env: dict[str, str], clock_file: Path | None) -> None:
        self.label = label
        self.config = dict(config, label=label)
        self.env = env
        self.clock_file = clock_file
        self.offset_s = 0
        self.proc: subprocess.Popen | None = None
        self.events: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        env = dict(self.env)
        if self.clock_file is not None:
            self.set_offset(self.offset_s)
            env.update(LD_PRELOAD=LIBFAKETIME, FAKETIME_TIMESTAMP_FILE=str(self.clock_file),
                       FAKETIME_DONT_FAKE_MONOTONIC="1", FAKETIME_NO_CACHE="1")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "ids_worker.py"), json.dumps(self.config)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            try:
                record = json.loads(line)
                detail = str(record.get("cause") or record.get("error") or "")[:40]
                self.events.append(record["event"] + (f" ({detail})" if detail else ""))
            except (ValueError, KeyError):
                self.events.append("stderr")
                sys.stderr.write(f"[{self.label}] {line}")

    def set_offset(self, offset_s: int) -> None:
        assert self.clock_file is not None
        self.offset_s = offset_s
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}s\n")
        os.replace(tmp, self.clock_file)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)


def _active(pool: list[Worker], out: Path) -> list[Worker]:
    """The workers whose session file grew last (they hold a worker number), most recent first."""
    newest: dict[str, float] = {}
    for path in out.glob("*.bin"):
        label = path.name.split(".")[0]
        newest[label] = max(newest.get(label, 0.0), path.stat().st_mtime)
    ranked = sorted(newest, key=newest.__getitem__, reverse=True)[: max(1, len(pool) // 2)]
    return [worker for worker in pool if worker.label in ranked]


def _grows(out: Path, worker: Worker, wait_s: float) -> None:
    """Wait (at most wait_s) until the worker's files grew: it made ids since now."""
    def size() -> int:
        return sum(path.stat().st_size for path in out.glob(f"{worker.label}.*.bin"))
    before, end = size(), time.monotonic() + wait_s
    while size() == before and time.monotonic() < end:
        time.sleep(0.05)


def on_disk(out: Path) -> int:
    return sum(path.stat().st_size for path in out.glob("*.bin")) // 8


def run(tmp: Path, env: dict[str, str], *, coord: str, store: str | None, workers: int, target: int, rounds: int,
        faults: tuple[str, ...], control: str = "", ttl_ms: int = 3_000, layout: dict | None = None,
        pace_ids_s: int | None = 5_000, block: int = 64, ahead_s: int = 5, seed: int = 13,
        deadline_s: float = 600.0) -> Figures:
    """Start the workers, inject ``faults`` (kill, stop, back, forward, ahead_kill) for ``rounds``, count duplicates."""
    out = tmp / "ids"
    out.mkdir()
    rng = random.Random(seed)
    config = {
        "coord": coord, "store": store, "name": "run", "out": str(out), "control": control, "ttl_ms": ttl_ms,
        "layout": layout or {"worker_bits": 3}, "skew_ms": 20, "reserve_ms": 400, "max_behind_ms": 200,
        "max_handoff_wait_ms": 5_000, "block": block, "pace_ids_s": pace_ids_s,
    }
    clocks = any(fault in ("back", "forward", "ahead_kill") for fault in faults)
    pool = [Worker(f"w{i}", config, env, tmp / f"clock-w{i}.txt" if clocks else None) for i in range(workers)]
    figures = Figures()
    started = time.monotonic()
    for worker in pool:
        worker.start()
    try:
        # Warm up: faults start once every worker number is held (a spare waits), whatever
        # the machine's load does to the workers' start-up.
        numbers = 1 << config["layout"].get("worker_bits", 10)
        while len(list(out.glob("*.bin"))) < min(workers, numbers):
            if time.monotonic() - started > deadline_s:
                raise AssertionError("the workers did not start")
            time.sleep(0.1)
        done_rounds = 0
        settled_at = None  # after the last fault, a takeover needs a TTL and the handoff: wait that long too
        while done_rounds < rounds or on_disk(out) < target or time.monotonic() < (settled_at or 0):
            if time.monotonic() - started > deadline_s:
                raise AssertionError(f"the run passed {deadline_s} s: {done_rounds} rounds, {on_disk(out)} ids")
            time.sleep(0.15)
            for worker in pool:  # a worker that died on its own is a finding: count it, start it again
                if worker.proc is not None and worker.proc.poll() is not None:
                    figures.crashes += 1
                    worker.start()
            if done_rounds >= rounds:
                continue
            done_rounds += 1
            if done_rounds == rounds:
                ahead = ahead_s if "ahead_kill" in faults else 0  # until the real clock passes the victim's
                settled_at = time.monotonic() + ttl_ms * 1.5 / 1000 + 4 + ahead
            worker = rng.choice(_active(pool, out) or pool)
            fault = faults[done_rounds % len(faults)]
            if fault == "kill":
                worker.signal(signal.SIGKILL)
                assert worker.proc is not None
                worker.proc.wait()
                worker.start()
                figures.kills += 1
            elif fault == "stop":
                worker.signal(signal.SIGSTOP)
                time.sleep(ttl_ms * 1.5 / 1000 + 0.5)  # past the lease: a spare worker takes the number meanwhile
                worker.signal(signal.SIGCONT)
                figures.stops += 1
            elif fault == "ahead_kill":  # ids from a clock ahead_s ahead, then kill -9: the next holder must wait
                worker.set_offset(ahead_s)
                time.sleep(0.5)
                _grows(out, worker, 5.0)
                time.sleep(0.5)
                worker.signal(signal.SIGKILL)
                assert worker.proc is not None
                worker.proc.wait()
                worker.offset_s = 0
                worker.start()
                figures.kills += 1
                figures.steps_forward += 1
            elif fault == "back":
                worker.set_offset(max(-1, worker.offset_s - 1))
                figures.steps_back += 1
            elif fault == "forward":
                worker.set_offset(min(1, worker.offset_s + 1))
                figures.steps_forward += 1
    finally:
        for worker in pool:
            worker.stop()
    figures.seconds = time.monotonic() - started
    for worker in pool:
        for kind in worker.events:
            figures.events[kind] = figures.events.get(kind, 0) + 1
    count_duplicates(out, figures)
    return figures
