"""One of several worker processes racing through the same job keys (tests/test_jobs.py).

    python jobs_worker.py DIR WORKER SEED KEYS MODE

MODE ``once``: every job goes through `stockade.recipes.jobs.once`. MODE ``naive``
(the control): a job checks "done?" in the store, then runs, each write under
a short lease of its own, and marks itself done: no lease spans the check and
the run, so nothing fences a second run out.

The job's effect is a fenced transaction in the job's scope that adds a key
``effect/WORKER-PID`` and counts ``count`` up by one: applied twice, the scope
holds two effect keys. The test names the keys whose run kills itself
(SIGKILL) before or after its effect, or stops itself (SIGSTOP, resumed by the
test after the lease ran out) before or after it, in ``JOBS_FAULTS``; the test
restarts killed workers. Each process appends what it did
to its own log, one line per event, written before the next step:
``start KEY TOKEN``, ``end KEY``, ``done KEY``, ``uncertain KEY``, ``stale KEY``, ``timeout KEY``.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import stockade
from stockade.recipes import jobs

data, worker, seed, keys, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
# The keys whose (first) run kills itself before or after its effect, or stops itself: "KEY:kb,KEY:ka,KEY:st".
FAULTS = dict(item.split(":") for item in os.environ.get("JOBS_FAULTS", "").split(",") if item)
TTL_MS, WAIT_MS = 1_000, 6_000
MEET_KEY, MEET_S = "k00000", 60  # the control's sure race: see `naive_once`
rng = random.Random(seed)
pid = os.getpid()
log_fd = os.open(os.path.join(data, f"log-{worker}-{pid}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
coord = stockade.connect(f"sqlite:///{data}/coord.db?process=embedded")
store = stockade.open_store(f"sqlite:///{data}/store.db", cluster_id=coord.cluster_id)


def log(line: str) -> None:
    os.write(log_fd, (line + "\n").encode())


def fault(key: str, before: bool) -> None:
    planned = FAULTS.get(key)
    if planned == ("kb" if before else "ka"):
        os.kill(pid, signal.SIGKILL)
    elif planned == "st" and before == (int(key[1:]) % 2 == 0):
        log(f"stop {key}")
        os.kill(pid, signal.SIGSTOP)  # the test resumes it once the lease has run out


def effect(scope: str, token: object) -> None:
    with store.transaction(scope, token=token) as tx:
        item = tx.get("count")
        tx.put("count", str(int(item.value) + 1 if item else 1))
        tx.put(f"effect/{worker}-{pid}", str(getattr(token, "value", token)))


RAN = [False]  # whether the current `once` called the job


def job(ctx: jobs.JobContext) -> dict[str, object]:
    RAN[0] = True
    log(f"start {ctx.key} {ctx.token.value}")
    fault(ctx.key, before=True)
    time.sleep(rng.random() * 0.003)
    effect(ctx.scope, ctx.token)
    fault(ctx.key, before=False)
    log(f"end {ctx.key}")
    return {"by": f"{worker}-{pid}", "token": ctx.token.value}


def naive_once(key: str) -> bool:
    """The control: check, then run; each write fenced on its own, no lease over the whole job.

    False: a lock was not granted or not kept (timed out, the coordinator's file stayed locked with nothing
    done, the grant came back lapsed: what 8 such processes on a loaded host bring); the key is taken again in
    the next pass. Taken again, its effect lands on this process's own effect key: never a second effect."""
    scope = jobs.job_scope(key)
    if store.get(scope, "done") is not None:
        log(f"done {key}")
        return True
    if key == MEET_KEY:
        meet()
    log(f"start {key} 0")
    time.sleep(rng.random() * 0.003)
    try:
        with coord.lock(scope, ttl_ms=TTL_MS * 10, wait_ms=WAIT_MS) as lease:
            effect(scope, lease.token)
        with coord.lock(scope, ttl_ms=TTL_MS * 10, wait_ms=WAIT_MS) as lease:
            store.put(scope, "done", b"1", token=lease.token)
    except stockade.BackendUnavailable as exc:
        if not exc.certain_no_effect:
            raise
        log(f"timeout {key}")
        return False
    except stockade.LockTimeout:
        log(f"timeout {key}")
        return False
    except (stockade.FenceRejected, stockade.LeaseLost):  # a grant that came back lapsed (a 74 s stall once)
        log(f"stale {key}")
        return False
    log(f"end {key}")
    return True


def meet() -> None:
    """On `MEET_KEY`, a worker that found the job not done waits (at most MEET_S) until a second one found it
    not done too: the check-then-run race happens there for sure, whatever the host's speed (elsewhere it
    happens when the workers' timing makes it)."""
    open(os.path.join(data, f"met-{worker}-{pid}"), "w").close()
    end = time.monotonic() + MEET_S
    while len([n for n in os.listdir(data) if n.startswith("met-")]) < 2 and time.monotonic() < end:
        time.sleep(0.01)


order = list(range(keys))
for i in range(0, keys, 6):  # everyone walks the keys in about the same order: neighbours collide
    window = order[i:i + 6]
    rng.shuffle(window)
    order[i:i + 6] = window
pending = [f"k{n:05d}" for n in order]
for _ in range(4):
    retry = []
    for current in pending:
        if mode == "naive":
            if not naive_once(current):
                retry.append(current)
            continue
        RAN[0] = False
        try:
            jobs.once(coord, store, current, job, ttl_ms=TTL_MS, wait_ms=WAIT_MS, holder=f"{worker}-{pid}")
            log(f"done {current}")
        except jobs.JobUncertain:
            log(f"uncertain {current}")
        except stockade.LockTimeout:
            log(f"timeout {current}")
            retry.append(current)
        except stockade.BackendUnavailable as exc:
            # Before the job ran, with nothing done (the coordinator's file stayed locked for the whole wait: 8
            # processes on a loaded host): like a timeout. Any other such failure ends the worker, as before.
            if RAN[0] or not exc.certain_no_effect:
                raise
            log(f"timeout {current}")
            retry.append(current)
        except (stockade.FenceRejected, stockade.LeaseLost, stockade.NotHolder):
            log(f"stale {current}")
    pending = retry
os.close(log_fd)
