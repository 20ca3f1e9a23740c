"""A candidate process for tests/test_election.py.

``election_candidate.py zombie COORD_URL STORE_PATH NAME``: for each line
``round`` (or ``round fencing-off``) on stdin, it is elected (waiting its turn), checks that it
still leads, prints ``leader EPOCH`` and reads one more line: the test
SIGSTOPs it meanwhile, lets its lease lapse, elects another leader that
writes, then SIGCONTs it and sends ``write``. It then writes with its
leadership's token, as a leader that checked before its pause would, and
prints ``accepted`` or ``rejected``; it resigns and waits for the next round.
``fencing-off``: that round writes through a store whose fence is swapped out
(the control, on the same file).

``election_candidate.py stand COORD_URL NAME``: waits its turn, prints
``leader EPOCH PID`` once elected, and keeps leading until killed (if its
leadership is lost, it prints ``lost`` and stands again).
"""

import os
import sys
import time
from pathlib import Path

import stockade
from stockade.client import Leadership

TTL_MS = 1000
WAIT_MS = 60_000
TRIES = 20  # elections a loaded host spoiled, taken again


def _elected(coord: stockade.Coordinator, name: str, identity: str) -> Leadership:
    """Elected and still leading. A grant that came back lapsed (`LeaseLost`: the TTL is 1 s and a loaded host
    can answer later than that), or no answer in time (`BackendUnavailable`: a grant it may have made lapses
    by its TTL, nobody renews it), shows nothing: the candidate stands again (at most TRIES times)."""
    for attempt in range(TRIES):
        try:
            leadership = coord.elect(name, ttl_ms=TTL_MS, wait_ms=WAIT_MS, identity=identity)
            leadership.raise_if_lost()  # it leads: the check a careful leader makes before writing
            return leadership
        except (stockade.LeaseLost, stockade.BackendUnavailable) as exc:
            if attempt == TRIES - 1:
                raise
            print(f"standing again after {exc!r}", file=sys.stderr, flush=True)
            time.sleep(0.1)
    raise AssertionError("unreachable")


def zombie(coord_url: str, store_path: str, name: str) -> None:
    from stockade.testing.mutants import FencingOffStore

    coord = stockade.connect(coord_url)
    fenced = stockade.open_store(f"sqlite:///{store_path}", cluster_id=coord.cluster_id)
    beside = str(Path(store_path).with_name("coord.keys"))  # the keyring the test left beside the store
    unfenced = FencingOffStore(store_path, cluster_id=coord.cluster_id, keys=beside)
    while (command := sys.stdin.readline().split())[:1] == ["round"]:
        store = unfenced if command[1:] == ["fencing-off"] else fenced
        # Right after its session expired (the pause), the coordinator waits for the next one itself.
        leadership = _elected(coord, name, f"zombie:{os.getpid()}")
        print(f"leader {leadership.term}", flush=True)
        sys.stdin.readline()  # paused here (SIGSTOP), past its lease
        try:
            store.put(name, "state", f"written by term {leadership.term}", token=leadership.token)
            print("accepted", flush=True)
        except stockade.StaleToken:
            print("rejected", flush=True)
        try:
            leadership.resign()
        except stockade.BackendUnavailable as exc:  # a session that expired in the pause may still be reconnecting
            print(f"resign failed, the lease lapses instead: {exc!r}", file=sys.stderr, flush=True)
    coord.close()


def stand(coord_url: str, name: str) -> None:
    coord = stockade.connect(coord_url)
    while True:
        try:
            leadership = _elected(coord, name, f"candidate:{os.getpid()}")
        except stockade.LockTimeout:
            continue
        print(f"leader {leadership.term} {os.getpid()}", flush=True)
        while not leadership.wait_lost(timeout_ms=60_000):
            pass
        print("lost", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "zombie":
        zombie(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        stand(sys.argv[2], sys.argv[3])
