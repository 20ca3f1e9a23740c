"""Threads opening one ``memory://`` name at once share one keyring.

Before, each thread that found the coordinator without keys made its own, and
the last one written won: a token signed with an earlier thread's keys was
refused as forged by a store opened next to the coordinator. The key making
is slowed here so the threads overlap every time.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

import stockade.keys
from stockade.coordinators import memory
from stockade.core.leases import LeasePolicy

THREADS = 8


def _slow_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    real = stockade.keys.ephemeral_keyring

    def slow(cluster_id: str):  # type: ignore[no-untyped-def]
        time.sleep(0.05)
        return real(cluster_id)

    monkeypatch.setattr(stockade.keys, "ephemeral_keyring", slow)


def _open_at_once(open_one) -> set[int]:  # type: ignore[no-untyped-def]
    """The distinct keys (signers) the threads got from opening one name together."""
    name = f"race-{uuid.uuid4().hex}"
    barrier = threading.Barrier(THREADS)
    seen: list[int] = []

    def run() -> None:
        barrier.wait()
        seen.append(id(open_one(name)))

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return set(seen)


def test_threads_opening_one_name_share_one_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_keyring(monkeypatch)
    assert len(_open_at_once(lambda name: memory.open_engine(name, LeasePolicy()).signer)) == 1


def test_control_keys_given_without_the_lock_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_keyring(monkeypatch)

    def unlocked(name: str) -> object:  # the old body; the keys this thread gave or found
        coordinator = memory.named(name, policy=LeasePolicy())
        if coordinator.signer is None:
            coordinator.signer = stockade.keys.FixedKeys(stockade.keys.ephemeral_keyring(coordinator.cluster_id))
            return coordinator.signer
        return coordinator.signer

    assert len(_open_at_once(unlocked)) > 1
