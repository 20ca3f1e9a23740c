"""A Ctrl-C while the ZooKeeper port hands a request to kazoo's connection thread reaches the caller.

kazoo's hand-off (queue the request, write one byte to wake its connection thread) turns whatever the write
raises into ``ConnectionClosedError``; a ``KeyboardInterrupt`` landing there came out as an unreachable server,
which a wait until granted retries, and the first Ctrl-C was lost
(`stockade.coordinators.zookeeper.session.Client`). The wake-up socket here raises what a SIGINT's handler
raises, at the one place the hand-off could see it; the client is never started, so nothing is sent.
"""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError
from kazoo.protocol.states import KeeperState

from stockade.coordinators.zookeeper.session import Client


class _Interrupted:
    """A wake-up socket whose write a SIGINT interrupts (its handler raised ``KeyboardInterrupt``)."""

    def send(self, data: bytes) -> int:
        raise KeyboardInterrupt


def _handing_off(kind: type[KazooClient], sock: object) -> KazooClient:
    client = kind(hosts="127.0.0.1:1")
    client._state = KeeperState.CONNECTED  # as a connected client hands off a request
    client._connection._write_sock = sock
    return client


def test_a_keyboard_interrupt_in_the_hand_off_reaches_the_caller() -> None:
    client = _handing_off(Client, _Interrupted())
    with pytest.raises(KeyboardInterrupt):
        client.exists_async("/x")
    assert len(client._queue) == 1  # queued before the write: the port's cleanup leaves what it asked for


def test_control_kazoo_turns_it_into_a_closed_connection() -> None:
    result = _handing_off(KazooClient, _Interrupted()).exists_async("/x")  # no KeyboardInterrupt
    with pytest.raises(ConnectionClosedError):
        result.get_nowait()


def test_a_write_that_fails_is_still_a_closed_connection() -> None:
    for sock in (None, _Failing()):
        with pytest.raises(ConnectionClosedError):
            _handing_off(Client, sock).exists_async("/x").get_nowait()


def test_a_closed_client_refuses_as_kazoo_does() -> None:
    client = _handing_off(Client, _Interrupted())
    client._state = KeeperState.CLOSED
    with pytest.raises(ConnectionClosedError):
        client.exists_async("/x").get_nowait()
    assert not client._queue


class _Failing:
    def send(self, data: bytes) -> int:
        raise OSError("socket closed")
