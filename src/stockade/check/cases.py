"""The orchestrator of `stockade check`: real worker processes, the cases, their verdicts and the timeline.

Each case drives the workers (`stockade.check.worker`) one command at a time
and judges by what the resource answered and what it holds afterwards, never
by how long anything took:

- ``pause`` (the long pause): worker A takes the lease (token n) and writes;
  A is frozen with SIGSTOP and its next write is already in its pipe; B takes
  the lease once A's expired at the coordinator (token m) and writes; A is
  resumed and its write, with n, reaches the resource. Held when it is refused
  and B's value is what the resource holds. Figure: stale writes applied, of N.
- ``delay`` (a delayed request): A's write leaves A under a valid lease and is
  held in a TCP proxy the check runs between A and the resource; A is frozen
  so its lease runs out; B takes the lease and writes; the held bytes are
  released. Held when the resource refuses them. Only for resources reached
  over TCP (PostgreSQL, Redis, stockade serve over http).
- ``retries`` (concurrent writers with retries): three holders in turn, each
  writing every key and retrying each write with the same token (and the same
  operation id, where the resource keeps them, R3); after the next holder
  wrote, the previous one retries its last write once more. Held when no
  retry applied a write a second time (the resource's count) and no newer
  write was lost (a late retry applied, a current holder refused, or a key
  not holding its last holder's value at the end of a round).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from stockade.check._proxy import HoldProxy
from stockade.check.targets import Target, scratch_scope
from stockade.timeline import Event, Verdict

__all__ = ["Run", "WorkerFailed", "pause_case", "delay_case", "retries_case"]

#: How long one answer of a worker may take (an acquire waits at most its wait_ms within it).
ANSWER_S = 30.0


class WorkerFailed(Exception):
    """A worker died, answered an error, or did not answer in time: the case could not run."""


@dataclass
class Run:
    """The workers and the timeline of one check run.

    Args:
        coordinator_url, resource_url: the user's urls.
        scratch: the scratch id.
        control: the control the workers run with, or None.
        ttl_ms: the lease TTL the workers take.

    Attributes:
        coord: the orchestrator's own coordinator client (reopened after a restart).
        target: the orchestrator's own view of the resource (reopened after a restore).
        command_timeout_s: how long one of the user's restart or restore commands may take (``--seconds``).
        floor_url: where the restore case raises the marks (``--resource-floor``), or None: the resource's own.
        history: where every event and verdict is written as a JSON line as it happens (``--history``), or None.
    """

    coordinator_url: str
    resource_url: str
    scratch: str
    control: str | None = None
    ttl_ms: int = 500
    events: list[Event] = field(default_factory=list)
    workers: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    case: str = ""
    coord: Any = None
    target: Any = None
    command_timeout_s: float = 60.0
    floor_url: str | None = None
    history: TextIO | None = None

    def __post_init__(self) -> None:
        self.t0 = time.monotonic()

    def reopen_target(self) -> None:
        """Close the orchestrator's view of the resource and open it again (its connections may have died with
        the resource, or point at files a restore replaced)."""
        from stockade.check.targets import open_target

        self.target.close()
        self.target = open_target(self.resource_url, self.scratch, coord=self.coord, control=self.target.control)
        self.target.create_scratch()

    def note(self, lane: str, kind: str, **fields: Any) -> None:
        event = Event(at_ms=(time.monotonic() - self.t0) * 1000, lane=lane, kind=kind, case=self.case, **fields)
        self.events.append(event)
        self._record(dataclasses.asdict(event))

    def judged(self, verdict: Verdict) -> None:
        """A case ended: its verdict goes to the history (``kind`` ``verdict``) as its events did."""
        self._record({"at_ms": (time.monotonic() - self.t0) * 1000, "kind": "verdict", "case": verdict.case,
                      "verdict": verdict.status, "figure": verdict.figure})

    def _record(self, line: dict[str, Any]) -> None:
        """One line of ``--history``, written and flushed at once: what was measured is kept whatever ends the
        run."""
        if self.history is not None:
            self.history.write(json.dumps(line) + "\n")
            self.history.flush()

    def start(self, name: str, resource_url: str | None = None) -> None:
        """Start worker ``name``; it reaches the resource at ``resource_url`` (default: the user's url)."""
        argv = [sys.executable, "-m", "stockade", "check", "--worker", name, "--coordinator", self.coordinator_url,
                "--resource", resource_url or self.resource_url, "--scratch", self.scratch]
        if self.control:
            argv += ["--control", self.control]
        worker = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
        self.workers[name] = worker
        self.receive(name)  # "ready": it opened the coordinator and the resource

    def send(self, name: str, **command: Any) -> None:
        stdin = self.workers[name].stdin
        assert stdin is not None
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()

    def receive(self, name: str) -> dict[str, Any]:
        worker = self.workers[name]
        assert worker.stdout is not None
        ready, _, _ = select.select([worker.stdout], [], [], ANSWER_S)
        line = worker.stdout.readline() if ready else ""
        if not line:
            worker.kill()
            detail = (worker.stderr.read() if worker.stderr else "").strip().splitlines()
            raise WorkerFailed(f"worker {name} {'exited' if ready else 'did not answer'}"
                               f"{': ' + detail[-1] if detail else ''}")
        answer: dict[str, Any] = json.loads(line)
        if answer.get("ev") == "error":
            raise WorkerFailed(f"worker {name}: {answer['error']}")
        return answer

    def call(self, name: str, **command: Any) -> dict[str, Any]:
        self.send(name, **command)
        return self.receive(name)

    def acquire(self, name: str, scope: str) -> int:
        token = int(self.call(name, do="acquire", scope=scope, ttl_ms=self.ttl_ms,
                              wait_ms=min(20 * self.ttl_ms + 5000, 25_000))["token"])
        self.note(name, "grant", token=token)
        return token

    def write(self, name: str, scope: str, key: str, value: str, op: str | None = None) -> dict[str, Any]:
        return self.written(name, self.call(name, do="write", scope=scope, key=key, value=value, op=op), key)

    def freeze_a_sending(self, scope: str, value: str, op: str, *, why: str = "SIGSTOP") -> None:
        """Freeze worker A (SIGSTOP) with one more write to ``scope`` queued to it: the zombie's late write."""
        os.kill(self.workers["A"].pid, signal.SIGSTOP)
        self.note("A", "pause", text=why)
        self.send("A", do="write", scope=scope, key="value", value=value, op=op)

    def newer_holder_writes(self, scope: str, value: str, op: str) -> int:
        """B is granted ``scope`` (A's lease ran out at the coordinator), writes ``value``, releases; its token."""
        token = self.acquire("B", scope)
        self.note("A", "expire", text="A's lease expired at the coordinator (B was granted)")
        self.write("B", scope, "value", value, op=op)
        self.release("B", scope)
        return token

    def thaw_a(self) -> dict[str, Any]:
        """Wake worker A (SIGCONT); the answer to the late write it was frozen with."""
        os.kill(self.workers["A"].pid, signal.SIGCONT)
        self.note("A", "resume", text="SIGCONT")
        return self.written("A", self.receive("A"), "value")

    def written(self, name: str, answer: dict[str, Any], key: str) -> dict[str, Any]:
        result = {"mismatch": "refused", "applied": "accepted"}.get(answer["result"], answer["result"])
        self.note(name, "write", token=answer["token"], outcome=result, mark=answer.get("mark"), text=key)
        return answer

    def release(self, name: str, scope: str) -> None:
        answer = self.call(name, do="release", scope=scope)
        self.note(name, "expire" if answer.get("lost") else "release")

    def stop(self) -> None:
        """End every worker this run started (resumed first, so a frozen one can exit), and reap it; `start`
        starts them anew."""
        for worker in self.workers.values():
            if worker.poll() is None:
                try:
                    os.kill(worker.pid, signal.SIGCONT)
                    assert worker.stdin is not None
                    worker.stdin.write(json.dumps({"do": "exit"}) + "\n")
                    worker.stdin.close()
                except OSError:
                    pass
        for worker in self.workers.values():
            try:
                worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            for stream in (worker.stdout, worker.stderr):
                if stream is not None:
                    stream.close()
        self.workers.clear()


def pause_case(run: Run, target: Target, *, rounds: int, deadline: float) -> Verdict:
    """The long pause (see the module docstring); at most ``rounds`` rounds, none begun after ``deadline``."""
    scope = scratch_scope(run.scratch, "pause")
    run.case = "pause"
    run.note("", "note", text="case: pause")
    stale_applied = done = 0
    for round_ in range(rounds):
        if done and time.monotonic() > deadline:
            break
        token_a = run.acquire("A", scope)
        run.write("A", scope, "value", f"A{round_}", op=f"pause-{round_}-a1")
        run.freeze_a_sending(scope, f"A{round_}-late", f"pause-{round_}-a2")
        token_b = run.newer_holder_writes(scope, f"B{round_}", f"pause-{round_}-b1")
        late = run.thaw_a()
        run.call("A", do="release", scope=scope)  # the lease is gone: A forgets it
        value, _ = target.read(scope, "value")
        held = late["result"] in ("refused", "mismatch") and value == f"B{round_}" and token_b > token_a
        stale_applied += not held
        done += 1
    return Verdict("pause", stale_applied == 0,
                   f"{stale_applied} of {done} stale writes applied (a holder frozen past its lease wrote after "
                   f"a newer holder)")


def delay_case(run: Run, target: Target, proxy: HoldProxy, *, rounds: int, deadline: float) -> Verdict:
    """The delayed request: A's write leaves A while its lease is valid and is held in the proxy until a
    newer holder wrote; A is frozen meanwhile, so its lease expires (bounded as `pause_case`)."""
    scope = scratch_scope(run.scratch, "delay")
    run.case = "delay"
    run.note("", "note", text="case: delay")
    stale_applied = done = 0
    for round_ in range(rounds):
        if done and time.monotonic() > deadline:
            break
        token_a = run.acquire("A", scope)
        run.write("A", scope, "value", f"A{round_}", op=f"delay-{round_}-a1")
        proxy.hold()
        run.send("A", do="write", scope=scope, key="value", value=f"A{round_}-late", op=f"delay-{round_}-a2")
        if not proxy.wait_held(ANSWER_S):
            raise WorkerFailed("worker A's write never reached the proxy")
        run.note("A", "delay", text="write held in the proxy")
        os.kill(run.workers["A"].pid, signal.SIGSTOP)  # so that its lease runs out while the write is in flight
        token_b = run.newer_holder_writes(scope, f"B{round_}", f"delay-{round_}-b1")
        proxy.release()
        run.note("A", "deliver", text="the held write released to the resource")
        os.kill(run.workers["A"].pid, signal.SIGCONT)
        late = run.written("A", run.receive("A"), "value")
        run.call("A", do="release", scope=scope)
        value, _ = target.read(scope, "value")
        held = late["result"] in ("refused", "mismatch") and value == f"B{round_}" and token_b > token_a
        stale_applied += not held
        done += 1
    return Verdict("delay", stale_applied == 0,
                   f"{stale_applied} of {done} delayed writes applied (sent under a valid lease, delivered after "
                   f"a newer holder wrote)")


HOLDERS = ("A", "B", "C")
KEYS = ("k0", "k1")


def retries_case(run: Run, target: Target, *, rounds: int, deadline: float) -> Verdict:
    """Concurrent writers with retries (see the module docstring); bounded as `pause_case`."""
    scope = scratch_scope(run.scratch, "retries")
    run.case = "retries"
    run.note("", "note", text="case: retries")
    twice = lost = retries = checks = done = 0
    for round_ in range(rounds):
        if done and time.monotonic() > deadline:
            break
        applied: dict[str, int] = dict.fromkeys(KEYS, 0)  # first writes the resource accepted, per key
        before = {key: target.read(scope, key)[1] for key in KEYS}
        previous: tuple[str, str, str, str] | None = None  # the last holder's name and last (key, value, op)
        for holder in HOLDERS:
            run.acquire(holder, scope)
            for key in KEYS:
                op, value = f"r{round_}-{holder}-{key}", f"{holder}{round_}-{key}"
                first = run.write(holder, scope, key, value, op=op)
                checks += 1
                lost += first["result"] != "applied"  # the current holder's write must land
                applied[key] += first["result"] == "applied"
                again = run.write(holder, scope, key, value, op=op)  # the retry: same token, same operation id
                retries += 1
                if target.op_ids:  # R3: the retry returns the first write's result and applies nothing
                    twice += again["result"] == "applied"
            if previous is not None:  # the previous holder's late retry, after this holder wrote
                name, key, value, op = previous
                late = run.write(name, scope, key, value, op=op)
                retries += 1
                checks += 1
                lost += late["result"] == "applied"
            run.release(holder, scope)
            previous = (holder, KEYS[-1], f"{holder}{round_}-{KEYS[-1]}", f"r{round_}-{holder}-{KEYS[-1]}")
        for key in KEYS:  # the end of the round: the last holder's value, applied once per accepted write
            final, count = target.read(scope, key)
            checks += 1
            lost += final != f"{HOLDERS[-1]}{round_}-{key}"
            twice += count >= 0 and count - max(before[key], 0) > applied[key]
        done += 1
    counted = "" if target.op_ids else " (this resource keeps no operation ids: retries are whole-value writes)"
    return Verdict("retries", twice == 0 and lost == 0,
                   f"{twice} of {retries} retries applied a write twice; {lost} of {checks} checks found a newer "
                   f"write lost; {done} rounds{counted}")
