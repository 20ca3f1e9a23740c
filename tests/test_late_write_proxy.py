"""S05 in real processes: an old holder's write held in a proxy until a newer holder's write was acknowledged.

The set-up of finding 11 of issue 26 (a late write once reported accepted, 1 of
24, in one of 16 runs; never reproduced): the store is the one behind
``stockade serve --coordinator sqlite:///.../coord.db``, and the holders are
embedded clients of that same coordinator file.

Each round: holder A acquires (token ``t1``) and PUTs to the server through
`stockade.check._proxy.HoldProxy` (the proxy of ``stockade check``'s delay case,
framing HTTP), which holds the request; A's lease ends
(released, or left to expire); holder B acquires (``t2 > t1``), writes, and is
acknowledged; then the proxy lets A's write go. It must be refused (409
stale-token, with the high-water mark ``t2``), and the key must hold B's value.

What varies, round by round (every value of every axis is covered):

- where A's write is held: before the server saw any of it (``head``), after it
  read the head (``body``), or all but the body's last byte (``tail``);
- how A's lease ends: released with its keepalive on or off, or expired (B's
  grant then waits for the expiry, judged on the coordinator file's clock);
- the server: one whose store is in a directory of its own, one whose data
  directory is the coordinator file's (both serve that one coordinator file);
- A and B in the test process, or each in a process of its own;
- B's grant from the embedded coordinator, or through the server's lease routes;
- B's write straight to the server, through the proxy (not held), or into the
  server's store file by B itself (another writer of that file on the host).

Every request's timings and outcome go into a history (JSON lines, the form of
`stockade.testing.history`, kept as ``late-writes.jsonl`` in the test's
tmp_path, also when it passes; the proxy's timings ride on A's write records),
and the shared checkers (P1-P7) judge it together with the stores' audit
trails. The control is the same rounds against a server whose store has
fencing off (``fencing-off`` in tests/helpers/server_controls.py): its late
writes are accepted, and the checkers say P2.

Default: 12 rounds with one busy loop beside them. ``STOCKADE_LONG=1``: 240
rounds under load (two busy loops, and lock/put/release traffic on other scopes
of both servers). ``STOCKADE_LATE_ROUNDS=N`` sets the count.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS, python_env
from helpers.late_holder import Holder
from helpers.server_fixtures import ServerProcess, start_server

from stockade.check._proxy import MODES, HoldProxy
from stockade.core.limits import LIST_PAGE_MAX
from stockade.resources._inputs import make_write
from stockade.resources.store import SQLiteStore
from stockade.testing.checkers import check
from stockade.testing.history import dump_jsonl
from stockade.testing.servers import reaper

LONG = os.environ.get("STOCKADE_LONG") == "1"
ROUNDS = int(os.environ.get("STOCKADE_LATE_ROUNDS") or (240 if LONG else 12))
CONTROL_ROUNDS = 6
SCOPES_PER_SERVER = 3  # scopes are reused across rounds: tokens keep growing on each
HOLD_TTL_MS = 5_000  # A's lease when it is released
EXPIRE_TTL_MS = 300  # A's lease when it is left to expire
WAIT_MS = 15_000
ACQUIRE_TRIES = 5
WAIT_S = 30.0
LOAD_SECONDS = 1_200  # the bound on every load process (they are stopped at the end of the test anyway)


@dataclass(frozen=True)
class Variant:
    mode: str  # where the proxy holds A's write: head | body | tail
    end: str  # how A's lease ends: release | release-keepalive | expire
    server: str  # own: the store in a directory of its own; coord: in the coordinator file's directory
    processes: str  # same: A and B in the test process; separate: each in a process of its own
    b_grant: str  # embedded | server
    b_write: str  # direct | proxy | file (B opens the server's store file itself, another writer on the host)


AXES: dict[str, tuple[str, ...]] = {
    "mode": MODES, "end": ("release", "release-keepalive", "expire"), "server": ("own", "coord"),
    "processes": ("same", "separate"), "b_grant": ("embedded", "server"),
    "b_write": ("direct", "proxy", "file"),
}


def variants(count: int, seed: int) -> list[Variant]:
    """``count`` variants: every value of every axis within the first three, the rest from the shuffled product."""
    product = [Variant(*values) for values in itertools.product(*AXES.values())]
    random.Random(seed).shuffle(product)
    first = [Variant(**{axis: values[i % len(values)] for axis, values in AXES.items()}) for i in range(3)]
    return (first + product * (count // len(product) + 1))[:count]


class Handle:
    """A holder in this process (calls run in threads) or in a process of its own (`helpers.late_holder`)."""

    def __init__(self, coord_url: str, name: str, *, process: bool) -> None:
        self.name = name
        self._pool = ThreadPoolExecutor(4, thread_name_prefix=name)
        self._proc: subprocess.Popen[str] | None = None
        self._holder: Holder | None = None
        if not process:
            self._holder = Holder(coord_url, name)
            return
        self._proc = subprocess.Popen([sys.executable, str(HELPERS / "late_holder.py"), "serve", coord_url, name],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=python_env())
        reaper.watch(self._proc.pid)
        assert self._proc.stdout is not None
        assert json.loads(self._proc.stdout.readline()) == {"ready": True}
        self._next = 0
        self._waiting: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read_answers, daemon=True).start()

    def _read_answers(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            answer = json.loads(line)
            with self._lock:
                future = self._waiting.pop(answer["id"])
            future.set_result(answer["result"])

    def call(self, cmd: str, **args: Any) -> Future[dict[str, Any]]:
        if self._holder is not None:
            return self._pool.submit(getattr(self._holder, cmd), **args)
        assert self._proc is not None and self._proc.stdin is not None
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            self._next += 1
            self._waiting[self._next] = future
            self._proc.stdin.write(json.dumps({"id": self._next, "cmd": cmd, "args": args}) + "\n")
            self._proc.stdin.flush()
        return future

    def __call__(self, cmd: str, **args: Any) -> dict[str, Any]:
        return self.call(cmd, **args).result(WAIT_S)

    def close(self) -> None:
        if self._holder is not None:
            self._holder.close()
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._pool.shutdown(wait=False)


class Recorder:
    """The history: an invocation and a completion record per call, from the call's own timings."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def op(self, process: str, f: str, result: dict[str, Any], **fields: Any) -> None:
        common = {k: v for k, v in fields.items() if v is not None}
        invoke = {"t_ns": result["invoke_ns"], "process": process, "type": "invoke", "f": f, **common}
        if "token" in result and f in ("write", "release"):  # an acquire learns its token on completion
            invoke["token"] = result["token"]
        done = {**invoke, **{k: v for k, v in result.items() if k not in ("invoke_ns", "complete_ns")},
                "t_ns": result["complete_ns"], "type": result["type"]}
        self.records += [invoke, done]


@dataclass
class Servers:
    """The servers of one run (``own`` and ``coord``, or the control), each behind its own proxy."""

    coord_url: str
    processes: dict[str, ServerProcess]
    proxies: dict[str, HoldProxy]

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()
        for server in self.processes.values():
            server.stop()


def start_servers(tmp_path: Path, *, control: str | None = None, both: bool = True) -> Servers:
    coord_dir = tmp_path / "coord"
    coord_dir.mkdir()
    coord_url = f"sqlite:///{coord_dir / 'coord.db'}?process=embedded"  # the servers and the holders in process
    dirs = {"own": tmp_path / "serve-own"}
    if both and not control:
        dirs["coord"] = coord_dir
    processes: dict[str, ServerProcess] = {}
    proxies: dict[str, HoldProxy] = {}
    try:
        for name, data_dir in dirs.items():
            processes[name] = start_server(data_dir, "--coordinator", coord_url, control=control)
            host, port = processes[name].url.rsplit("/", 1)[1].split(":")
            proxies[name] = HoldProxy((host, int(port)), http=True)
    except BaseException:
        Servers(coord_url, processes, proxies).close()
        raise
    return Servers(coord_url, processes, proxies)


def round_of(r: int, v: Variant, holders: dict[str, Handle], servers: Servers, history: Recorder) -> dict[str, Any]:
    """One delayed request; returns what happened to A's write and the round's timings."""
    server = servers.processes["own" if v.server == "own" or "coord" not in servers.processes else "coord"]
    proxy = servers.proxies["own" if server is servers.processes["own"] else "coord"]
    a, b = (holders["A"], holders["B"]) if v.processes == "same" else (holders["PA"], holders["PB"])
    scope = f"late-{v.server}-{r % SCOPES_PER_SERVER}"
    fields = {"scope": scope, "round": r, "variant": asdict(v)}
    ttl_ms = EXPIRE_TTL_MS if v.end == "expire" else HOLD_TTL_MS
    for _ in range(ACQUIRE_TRIES):  # a 300 ms lease granted on a busy host may have lapsed on arrival
        granted = a("acquire", scope=scope, ttl_ms=ttl_ms, wait_ms=WAIT_MS, keepalive=v.end == "release-keepalive")
        history.op(f"{a.name}:lease", "acquire", granted, **fields)
        if granted.get("error") != "lease-lost":
            break
    assert granted["type"] == "ok", granted
    hold = proxy.hold_next(v.mode)
    late = a.call("write", store_url=proxy.url, scope=scope, key="k", value=f"A{r}", idempotency_key=f"A{r}")
    try:
        held = hold.wait_caught(WAIT_S)
    except TimeoutError:
        proxy.disarm()
        raise
    if v.end != "expire":
        history.op(f"{a.name}:lease", "release", a("release"), **fields)
    b_granted = b("acquire", scope=scope, ttl_ms=HOLD_TTL_MS, wait_ms=WAIT_MS, keepalive=False,
                  via=server.url if v.b_grant == "server" else None)
    history.op(f"{b.name}:lease", "acquire", b_granted, **fields)
    assert b_granted["type"] == "ok", (b_granted, v)
    store_file = f"sqlite:///{server.data_dir / 'store.db'}"
    store_url = {"direct": server.url, "proxy": proxy.url, "file": store_file}[v.b_write]
    written = b("write", store_url=store_url, scope=scope, key="k", value=f"B{r}", idempotency_key=f"B{r}")
    history.op(f"{b.name}:write", "write", written, key="k", value=f"B{r}", idempotency_key=f"B{r}", **fields)
    hold.release()
    outcome = late.result(WAIT_S)
    history.op(f"{a.name}:write", "write", outcome, key="k", value=f"A{r}", idempotency_key=f"A{r}",
               proxy=held.as_dict(), **fields)
    read = b("read", store_url=server.url, scope=scope, key="k")
    history.op("reader", "read", read, key="k", **fields)
    history.op(f"{b.name}:lease", "release", b("release"), **fields)
    if v.end == "expire":
        a("release")  # the client's handle; the coordinator expired it long ago (not part of the history)
    return {"round": r, "variant": v, "a": outcome, "b": written, "read": read, "proxy": held.as_dict(),
            "t1": granted["token_value"], "t2": b_granted["token_value"], "b_granted": b_granted,
            "a_granted": granted}


# -- load --------------------------------------------------------------------------------------------

BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


class Load:
    """Busy loops (CPU) and lock/put/release traffic on other scopes of each server, each bounded in time."""

    def __init__(self, servers: Servers, *, busy: int, traffic: bool) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        commands = [[sys.executable, "-c", BUSY_LOOP.format(seconds=LOAD_SECONDS)] for _ in range(busy)]
        if traffic:
            commands += [[sys.executable, str(HELPERS / "late_holder.py"), "traffic", servers.coord_url, server.url,
                          f"traffic-{name}-", str(LOAD_SECONDS)] for name, server in servers.processes.items()]
        for command in commands:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=python_env())
            reaper.watch(proc.pid)
            self.procs.append(proc)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


# -- a run ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    results: list[dict[str, Any]]
    records: list[dict[str, Any]]
    verdict: Any
    history_path: Path

    @property
    def accepted(self) -> list[dict[str, Any]]:
        """Late writes that applied (a replay of an applied idempotency key is answered 200 too: R3)."""
        return [r for r in self.results if r["a"]["type"] == "ok" and not r["a"].get("replayed")]

    @property
    def not_late(self) -> list[dict[str, Any]]:
        """Rounds whose held write reached the server before B's ack (the hold leaked): none may count."""
        return [r for r in self.results if r["proxy"]["released_ns"] < r["b"]["complete_ns"]]

    @property
    def refused(self) -> list[dict[str, Any]]:
        return [r for r in self.results if r["a"]["type"] == "fail" and r["a"].get("error") == "stale-token"]

    def early_grants(self) -> list[dict[str, Any]]:
        """Expiry rounds in which B was granted before A's TTL could have run out (C2: must be none)."""
        return [r for r in self.results if r["variant"].end == "expire"
                and r["b_granted"]["complete_ns"] - r["a_granted"]["invoke_ns"] < EXPIRE_TTL_MS * 1_000_000]

    def not_b(self) -> list[dict[str, Any]]:
        return [r for r in self.results if r["read"].get("value") != f"B{r['round']}"]


def all_audit(path: Path) -> list[tuple[str, int, Any, int]]:
    store = SQLiteStore(path, keys="tokenless")  # a reader of the audit: admits no token
    try:
        entries, after = [], 0
        while True:
            page = store.audit(after_seq=after, limit=LIST_PAGE_MAX)
            entries += [(a.scope, a.token_value, a.idempotency_key, a.commit_seq) for a in page]
            if len(page) < LIST_PAGE_MAX:
                return entries
            after = page[-1].commit_seq
    finally:
        store.close()


def run_rounds(tmp_path: Path, servers: Servers, count: int, *, seed: int, load: Load | None) -> Run:
    history = Recorder()
    results: list[dict[str, Any]] = []
    holders = {"A": Handle(servers.coord_url, "A", process=False), "B": Handle(servers.coord_url, "B", process=False),
               "PA": Handle(servers.coord_url, "PA", process=True), "PB": Handle(servers.coord_url, "PB", process=True)}
    history_path = tmp_path / "late-writes.jsonl"
    try:
        for r, variant in enumerate(variants(count, seed)):
            results.append(round_of(r, variant, holders, servers, history))
        scopes = {(record["scope"], record["variant"]["server"]) for record in history.records}
        for scope, where in sorted(scopes):
            url = servers.processes.get(where, servers.processes["own"]).url
            history.op("final", "read", holders["A"]("read", store_url=url, scope=scope, key="k"),
                       scope=scope, key="k", final=True)
    finally:
        if load is not None:
            load.stop()
        for holder in holders.values():
            holder.close()
        with open(history_path, "w") as out:
            dump_jsonl(sorted(history.records, key=lambda record: record["t_ns"]), out)
    audit = [entry for server in servers.processes.values() for entry in all_audit(server.data_dir / "store.db")]
    verdict = check(history.records, audit=audit)
    with open(tmp_path / "late-writes-audit.jsonl", "w") as out:
        dump_jsonl([dict(zip(("scope", "token", "idempotency_key", "commit_seq"), e, strict=True)) for e in audit], out)
    return Run(results, history.records, verdict, history_path)


def _ms(values: list[int]) -> str:
    if not values:
        return "-"
    ms = sorted(v / 1e6 for v in values)
    return (f"p50 {statistics.median(ms):.1f} p90 {ms[int(0.9 * (len(ms) - 1))]:.1f} "
            f"max {ms[-1]:.1f} ms")


def timings(run: Run) -> str:
    """The distribution of each round's steps (ms)."""
    held = [r["proxy"]["released_ns"] - r["proxy"]["prefix_sent_ns"] for r in run.results]
    b_wait = [r["b_granted"]["complete_ns"] - r["b_granted"]["invoke_ns"] for r in run.results]
    b_write = [r["b"]["complete_ns"] - r["b"]["invoke_ns"] for r in run.results]
    answer = [r["a"]["complete_ns"] - r["proxy"]["released_ns"] for r in run.results]
    gap = [r["proxy"]["released_ns"] - r["b"]["complete_ns"] for r in run.results]
    return (f"held {_ms(held)}; B's grant {_ms(b_wait)}; B's write {_ms(b_write)}; B's ack to release {_ms(gap)}; "
            f"release to A's answer {_ms(answer)}")


def by_axis(run: Run) -> str:
    parts = []
    for axis, values in AXES.items():
        counts = Counter(getattr(r["variant"], axis) for r in run.results)
        parts.append(f"{axis}: " + " ".join(f"{value} {counts[value]}" for value in values))
    return "; ".join(parts)


def figure(capsys: Any, line: str) -> None:
    with capsys.disabled():
        print(f"\n{line}")


# -- the tests -----------------------------------------------------------------------------------------


def test_s05_late_writes_through_a_proxy_are_refused(tmp_path: Path, capsys: Any) -> None:
    """Finding 11 of issue 26: 0 late writes accepted, with every variant, the checkers clean."""
    servers = start_servers(tmp_path)
    try:
        load = Load(servers, busy=2 if LONG else 1, traffic=LONG)
        run = run_rounds(tmp_path, servers, ROUNDS, seed=26_11, load=load)
    finally:
        servers.close()
    other = Counter(f"{r['a']['type']}:{r['a'].get('error')}" for r in run.results
                    if r not in run.accepted and r not in run.refused)
    figure(capsys, f"S05 (serve --coordinator sqlite://, embedded holders): late writes accepted "
                   f"{len(run.accepted)} of {len(run.results)}; held past B's ack "
                   f"{len(run.results) - len(run.not_late)} of {len(run.results)}; refused stale "
                   f"{len(run.refused)}; other "
                   f"{dict(other) or 0}; key not B's after the round {len(run.not_b())}; checkers: "
                   f"{dict(run.verdict.by_property()) or 'no violations'}\n  {timings(run)}\n"
                   f"  rounds by axis: {by_axis(run)}\n  history: {run.history_path}")
    assert not run.early_grants(), [(r["round"], r["a_granted"], r["b_granted"]) for r in run.early_grants()]
    assert not run.not_late, [(r["round"], r["proxy"], r["b"]) for r in run.not_late]
    assert not run.accepted, [(r["round"], r["variant"], r["a"], r["proxy"]) for r in run.accepted]
    assert not run.not_b(), [(r["round"], r["variant"], r["read"]) for r in run.not_b()]
    assert run.verdict.ok, str(run.verdict)
    assert all(r["t2"] > r["t1"] and r["b"]["type"] == "ok" for r in run.results)
    assert all(r["a"]["high_water"] >= r["t2"] for r in run.refused)
    assert len(run.refused) >= len(run.results) * 0.9, other  # a hold past the server's body bounds is rare


def test_s05_control_fencing_off_accepts_the_late_writes(tmp_path: Path, capsys: Any) -> None:
    """The same rounds against a store with fencing off: the late writes land, and P2 says so."""
    servers = start_servers(tmp_path, control="fencing-off")
    try:
        run = run_rounds(tmp_path, servers, CONTROL_ROUNDS, seed=26_11, load=None)
    finally:
        servers.close()
    figure(capsys, f"S05 control (fencing off): late writes accepted {len(run.accepted)} of {len(run.results)}; "
                   f"checkers: {dict(run.verdict.by_property())}")
    assert len(run.accepted) == len(run.results)
    assert run.verdict.by_property()["P2"] >= len(run.results)


@pytest.mark.parametrize("mode", MODES)
def test_hold_proxy_holds_a_request_until_released(tmp_path: Path, mode: str) -> None:
    """The proxy itself: a held PUT is not applied until released (the server's mark shows it)."""
    servers = start_servers(tmp_path, both=False)
    holder = Holder(servers.coord_url, "solo")
    try:
        proxy = servers.proxies["own"]
        holder.acquire("solo", ttl_ms=HOLD_TTL_MS, wait_ms=0, keepalive=False)
        hold = proxy.hold_next(mode)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(holder.write, proxy.url, "solo", "k", "v", "solo-1")
            held = hold.wait_caught(WAIT_S)
            time.sleep(0.2)  # a window in which the server could apply it if the hold leaked
            assert not pending.done()
            assert holder.read(servers.processes["own"].url, "solo", "k")["value"] is None
            hold.release()
            assert pending.result(WAIT_S)["type"] == "ok"
        assert held.held == mode and held.received_ns <= held.prefix_sent_ns <= held.released_ns
        assert held.released_ns <= held.forwarded_ns <= held.answered_ns
    finally:
        holder.close()
        servers.close()


def test_s05_a_late_retry_of_an_applied_write_is_answered_as_a_replay(tmp_path: Path, capsys: Any) -> None:
    """R3 comes before R1: a delayed copy of a write that already applied is answered 200 ``replayed``.

    That answer is not an acceptance: the key keeps B's value and the mark B's
    token. A harness that counts 200s as accepted late writes counts it (one way
    to read finding 11). The same key with another value is refused (422), unchanged.
    """
    servers = start_servers(tmp_path, both=False)
    a, b = Holder(servers.coord_url, "A"), Holder(servers.coord_url, "B")
    server, proxy = servers.processes["own"], servers.proxies["own"]
    answers = []
    try:
        with ThreadPoolExecutor(1) as pool:
            for r, (key, value) in enumerate([("A", "A"), ("B", "A")]):
                scope = f"retry-{r}"
                t1 = a.acquire(scope, ttl_ms=HOLD_TTL_MS, wait_ms=0, keepalive=False)["token_value"]
                assert a.write(server.url, scope, "k", "A", "A")["type"] == "ok"
                hold = proxy.hold_next("head")
                late = pool.submit(a.write, proxy.url, scope, "k", value, key)
                hold.wait_caught(WAIT_S)
                a.release()
                t2 = b.acquire(scope, ttl_ms=HOLD_TTL_MS, wait_ms=WAIT_MS, keepalive=False)["token_value"]
                assert b.write(server.url, scope, "k", "B", "B")["type"] == "ok"
                hold.release()
                answer = late.result(WAIT_S)
                read = b.read(server.url, scope, "k")
                b.release()
                answers.append((answer, read, t1, t2))
    finally:
        a.close()
        b.close()
        servers.close()
    (replay, read_1, t1, _), (collision, read_2, _, _) = answers
    figure(capsys, f"S05 retry of an applied key: answered {replay['type']} replayed={replay.get('replayed')} "
                   f"(high-water {replay.get('high_water')} = t1 {t1}), key holds {read_1['value']}; "
                   f"B's key with A's value: {collision['type']} {collision.get('error')}, key holds {read_2['value']}")
    assert replay["type"] == "ok" and replay["replayed"] and replay["high_water"] == t1
    assert read_1["value"] == "B" and read_2["value"] == "B"
    assert collision["type"] == "fail" and collision["error"] == "invalid-argument"


# -- A's write in the server's hands while B writes ------------------------------------------------------

IN_SERVER_ROUNDS = 100 if LONG else 6
IN_HAND_NS = 100_000_000  # A's request reached the server this long before B's commit: the server had read it


def in_server_rounds(tmp_path: Path, count: int, *, control: str | None) -> tuple[list[dict[str, Any]], Any, Path]:
    """A's late write waits inside the server (parsed, queued, blocked on the store file's write lock) while B,
    another writer of that file, holds the lock from its fence check to its commit; then the server goes on."""
    servers = start_servers(tmp_path, control=control, both=False)
    server, proxy = servers.processes["own"], servers.proxies["own"]
    a, b = Holder(servers.coord_url, "A"), Holder(servers.coord_url, "B")
    b_store = SQLiteStore(server.data_dir / "store.db", keys=b.coordinator(None).verify_keys())
    history, results = Recorder(), []
    try:
        with ThreadPoolExecutor(1) as pool:
            for r in range(count):
                scope, fields = f"in-server-{r % SCOPES_PER_SERVER}", {"round": r}
                granted = a.acquire(scope, ttl_ms=HOLD_TTL_MS, wait_ms=WAIT_MS, keepalive=False)
                history.op("A:lease", "acquire", granted, scope=scope, **fields)
                history.op("A:lease", "release", a.release(), scope=scope, **fields)
                b_granted = b.acquire(scope, ttl_ms=HOLD_TTL_MS, wait_ms=WAIT_MS, keepalive=False)
                history.op("B:lease", "acquire", b_granted, scope=scope, **fields)
                token = b.lease.token
                written: dict[str, Any] = {"invoke_ns": time.monotonic_ns(), "token": token.encode()}
                seen = len(proxy.passed)
                with b_store.admitted(token, scope) as unit:  # the file's write lock, from B's check to its commit
                    late = pool.submit(a.write, proxy.url, scope, "k", f"A{r}", f"A{r}")
                    deadline = time.monotonic() + WAIT_S
                    while not any(p.method == "PUT" and p.forwarded_ns for p in proxy.passed[seen:]):
                        assert time.monotonic() < deadline, "A's write never reached the server"
                        time.sleep(0.001)
                    passed = next(p for p in proxy.passed[seen:] if p.method == "PUT")
                    time.sleep(IN_HAND_NS / 1e9)  # the server reads it meanwhile (counted below, not assumed)
                    write = make_write(scope, "k", "put", f"B{r}", f"B{r}", value_bytes_max=b_store.value_bytes_max)
                    result = unit.apply(write, token_value=token.value)
                written.update(type="ok", high_water=result.high_water, complete_ns=time.monotonic_ns())
                history.op("B:write", "write", written, scope=scope, key="k", value=f"B{r}",
                           idempotency_key=f"B{r}", **fields)
                outcome = late.result(WAIT_S)
                history.op("A:write", "write", outcome, scope=scope, key="k", value=f"A{r}",
                           idempotency_key=f"A{r}", proxy=passed.as_dict(), **fields)
                read = b.read(server.url, scope, "k")
                history.op("reader", "read", read, scope=scope, key="k", **fields)
                history.op("B:lease", "release", b.release(), scope=scope, **fields)
                results.append({"a": outcome, "read": read, "b": written, "proxy": passed.as_dict(), "round": r})
    finally:
        b_store.close()
        a.close()
        b.close()
        servers.close()
        path = tmp_path / "in-server.jsonl"
        with open(path, "w") as out:
            dump_jsonl(sorted(history.records, key=lambda record: record["t_ns"]), out)
    return results, check(history.records, audit=all_audit(server.data_dir / "store.db")), path


def test_s05_late_write_waiting_inside_the_server_is_refused(tmp_path: Path, capsys: Any) -> None:
    """The delay after the server read the request: it waits on the store's lock while B commits."""
    results, verdict, path = in_server_rounds(tmp_path, IN_SERVER_ROUNDS, control=None)
    accepted = [r for r in results if r["a"]["type"] == "ok"]
    in_hand = [r for r in results if r["b"]["complete_ns"] - r["proxy"]["forwarded_ns"] >= IN_HAND_NS]
    answered_after = [r for r in results if r["proxy"]["answered_ns"] > r["b"]["complete_ns"]]
    figure(capsys, f"S05 in the server's hands: late writes accepted {len(accepted)} of {len(results)}; "
                   f"in the server {IN_HAND_NS // 1_000_000} ms or more before B's commit {len(in_hand)} of "
                   f"{len(results)}; answered after B's commit {len(answered_after)} of {len(results)}; checkers: "
                   f"{dict(verdict.by_property()) or 'no violations'}; history: {path}")
    assert not accepted, accepted
    assert len(answered_after) == len(results)  # the server did wait for the lock: its answer came after B's
    assert all(r["a"].get("error") == "stale-token" and r["read"]["value"] == f"B{r['round']}" for r in results)
    assert verdict.ok, str(verdict)


def test_s05_late_write_waiting_inside_the_server_control(tmp_path: Path, capsys: Any) -> None:
    """Control: the server's store with fencing off applies the write that waited, after B's."""
    results, verdict, _ = in_server_rounds(tmp_path, 3, control="fencing-off")
    accepted = [r for r in results if r["a"]["type"] == "ok"]
    figure(capsys, f"S05 in the server's hands, control (fencing off): late writes accepted {len(accepted)} of "
                   f"{len(results)}; checkers: {dict(verdict.by_property())}")
    assert len(accepted) == len(results) and verdict.by_property()["P2"] >= len(results)
