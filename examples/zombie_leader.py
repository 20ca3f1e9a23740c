"""The zombie leader, played by real processes.

    python examples/zombie_leader.py [DIRECTORY]

Leader A is elected and writes. Between checking that it still leads and its
next write, A is frozen (a real SIGSTOP, as a long GC pause or a stopped VM
would freeze it) for longer than its lease. Meanwhile B is elected with a
higher token and writes. Then A wakes (SIGCONT), still sure it leads, and
sends its write: both fenced resources refuse it, stockade's own store
(``open_store``) and the application's own SQLite database (the
`stockade.resources.sqlite_db` adapter). Exit status 0 when A was refused
everywhere, 1 otherwise.

The coordinator and both resources are files in DIRECTORY (a new temporary
directory by default).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import stockade
from stockade.client import Leadership
from stockade.resources import sqlite_db

ELECTION = "orders-leader"
TTL_MS = 1000


def say(who: str, text: str) -> None:
    print(f"{who}: {text}", flush=True)


def open_resources(directory: Path) -> tuple[stockade.Coordinator, stockade.FencedStore, sqlite3.Connection]:
    coord = stockade.connect(f"sqlite:///{directory / 'coord.db'}")
    store = stockade.open_store(f"sqlite:///{directory / 'store.db'}", cluster_id=coord.cluster_id)
    app = sqlite3.connect(directory / "app.db", isolation_level=None, timeout=10)
    app.execute("PRAGMA synchronous=FULL")
    return coord, store, app


def write(who: str, leadership: Leadership, coord: stockade.Coordinator, store: stockade.FencedStore,
          app: sqlite3.Connection) -> int:
    """One write of the leader to each resource, carrying its term's token. Returns how many were refused."""
    text = f"written by {who}, term {leadership.term}"
    refused = 0
    try:
        store.put(ELECTION, "state", text, token=leadership.token)
        say(who, "the store accepted my write")
    except stockade.StaleToken as exc:
        say(who, f"the store REFUSED my write: my token {exc.token.value} < its mark {exc.high_water}")
        refused += 1
    try:
        with sqlite_db.fenced(app, leadership.token, keys=coord.verify_keys()):
            app.execute("INSERT OR REPLACE INTO state VALUES ('owner', ?)", (text,))
        say(who, "the app database accepted my write")
    except stockade.StaleToken:
        say(who, "the app database REFUSED my write")
        refused += 1
    return refused


def stand(who: str, coord: stockade.Coordinator) -> Leadership:
    """Elected. On a loaded host a grant can come back after its short TTL has run out (`LeaseLost`): that
    term shows nothing, so the candidate stands again (at most 10 times)."""
    for attempt in range(10):
        try:
            return coord.elect(ELECTION, ttl_ms=TTL_MS, wait_ms=30_000, identity=f"{who}:{os.getpid()}")
        except stockade.LeaseLost:
            if attempt == 9:
                raise
            say(who, "my grant came back after its lease ran out; standing again")
    raise AssertionError("unreachable")


def leader(who: str, directory: Path, pause: bool) -> int:
    coord, store, app = open_resources(directory)
    leadership = stand(who, coord)
    say(who, f"elected, term {leadership.term}")
    write(who, leadership, coord, store, app)
    if not pause:
        say(who, "I lead on (until the narrator is done)")
        sys.stdin.read()
        leadership.resign()
        return 0
    leadership.raise_if_lost()
    say(who, "I checked: I still lead. Writing again... (frozen right here)")
    os.kill(os.getpid(), signal.SIGSTOP)  # the pause: the whole process stops, keepalive included
    say(who, "woke up; sending the write I was about to send")
    refused = write(who, leadership, coord, store, app)
    say(who, f"and now I know: lost={leadership.lost} ({leadership.lost_cause})")
    leadership.resign()
    return 0 if refused == 2 else 1


def narrate(directory: Path) -> int:
    coord, store, app = open_resources(directory)
    sqlite_db.install(app, cluster_id=coord.cluster_id)
    app.execute("CREATE TABLE IF NOT EXISTS state (k TEXT PRIMARY KEY, v TEXT)")
    me = [sys.executable, os.path.abspath(__file__)]
    a = subprocess.Popen([*me, "--leader", "A", str(directory), "pause"])
    _, status = os.waitpid(a.pid, os.WUNTRACED)  # until A freezes itself
    if not os.WIFSTOPPED(status):
        say("narrator", "A ended before its pause")
        return 1
    say("narrator", f"A is frozen; its lease lapses in about {TTL_MS} ms. B stands.")
    b = subprocess.Popen([*me, "--leader", "B", str(directory)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert b.stdin is not None and b.stdout is not None
    for line in b.stdout:  # B's story, until it has written and leads on
        print(line, end="", flush=True)
        if "I lead on" in line:
            break
    shown = coord.leader(ELECTION)
    say("narrator", f"leader now: {shown.holder if shown else 'nobody'}; waking A (SIGCONT)")
    a.send_signal(signal.SIGCONT)
    code = a.wait(60)
    b.stdin.close()
    b.wait(60)
    final = store.get(ELECTION, "state")
    say("narrator", f"store holds: {final.value.decode() if final else None!r}")
    say("narrator", f"app holds: {app.execute('SELECT v FROM state').fetchone()[0]!r}")
    say("narrator", "the zombie was refused" if code == 0 else "the zombie's write got in")
    return code


def main(argv: list[str]) -> int:
    if argv[:1] == ["--leader"]:
        return leader(argv[1], Path(argv[2]), pause=argv[3:] == ["pause"])
    if argv:
        Path(argv[0]).mkdir(parents=True, exist_ok=True)
        return narrate(Path(argv[0]))
    with tempfile.TemporaryDirectory() as directory:
        return narrate(Path(directory))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
