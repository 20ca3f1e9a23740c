"""The memory of verified tokens (`stockade.resources._verified_tokens`) that the files, SQLite and Redis fences keep.

A remembered verdict must tell nothing the verifier would not: a key dropped
from the keyring file, a key past its ``verify_until_s`` and a token whose MAC
differs are refused at the same look as without the memory. Each test has a
control: a mutant memory (blind to the keyring's change, to the key's
retirement, to the MAC) that the same steps catch accepting the token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.core.errors import TokenMismatch
from stockade.core.signing import Keyring
from stockade.core.tokens import FencingToken
from stockade.keys import FixedKeys, KeyFile, ephemeral_keyring, save_keyring
from stockade.resources import _verified_tokens as memory
from stockade.resources._verified_tokens import VerifiedTokens
from stockade.resources._verify import Verification

CLUSTER = "a1b2c3d4e5f60718"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _memory(keys: object, clock: Clock | None = None) -> tuple[VerifiedTokens, Verification, list[FencingToken]]:
    """A memory over ``keys`` and the list of tokens its verifier was asked about (a miss each)."""
    verification = Verification()
    verification.use_keys(keys, CLUSTER)
    asked: list[FencingToken] = []
    forged = verification.forged

    def counting(token: FencingToken) -> str | None:
        asked.append(token)
        return forged(token)

    verification.forged = counting  # type: ignore[method-assign]
    return VerifiedTokens(verification, clock or Clock()), verification, asked


@pytest.fixture
def keyfile(tmp_path: Path) -> Iterator[tuple[Path, Keyring]]:
    path = tmp_path / "keyring"
    keyring = ephemeral_keyring(CLUSTER)
    save_keyring(path, keyring)
    yield path, keyring


def _drop_every_key(path: Path) -> None:
    save_keyring(path, ephemeral_keyring(CLUSTER))  # a new key only: the old one is gone from the file


def test_a_remembered_token_costs_no_verification_and_is_asked_again_after_the_ttl() -> None:
    keys = FixedKeys(ephemeral_keyring(CLUSTER))
    clock = Clock()
    tokens, _, asked = _memory(keys, clock)
    token = keys.sign(FencingToken(CLUSTER, "a", 5))
    for _ in range(3):
        assert tokens.check(token) == (token, None)
        assert tokens.check(token.encode()) == (token, None)
    assert len(asked) == 2  # once as an object, once as its string
    clock.now += memory.TTL_S
    assert tokens.check(token) == (token, None)
    assert len(asked) == 3


@pytest.mark.parametrize("blind", [False, True], ids=["memory", "control-blind-to-the-keyring"])
def test_a_key_dropped_from_the_file_is_refused_at_the_files_next_look(
        keyfile: tuple[Path, Keyring], blind: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    path, keyring = keyfile
    keys = KeyFile(path)
    keys.reload_check_s = 0.0  # look at the file before every verification
    tokens, _, _ = _memory(keys)
    token = keyring.sign(FencingToken(CLUSTER, "a", 5))
    assert tokens.check(token)[1] is None
    keyring_then = keys.keyring
    if blind:  # the mutant: a memory that keeps using the keyring the token passed with
        monkeypatch.setattr(keys, "in_force", lambda: (keyring_then, 0.0))
    _drop_every_key(path)
    assert keys.why_forged(token) == "unknown-key"  # what the verifier says without the memory
    why = tokens.check(token)[1]
    if blind:
        assert why is None, "the control: a memory blind to the keyring accepts a dropped key's token"
    else:
        assert why == "unknown-key"


@pytest.mark.parametrize("blind", [False, True], ids=["memory", "control-blind-to-retirement"])
def test_a_retired_key_is_refused_at_the_instant_the_verifier_refuses_it(blind: bool) -> None:
    old = ephemeral_keyring(CLUSTER)
    new = ephemeral_keyring(CLUSTER)
    wall = Clock(5_000.0)
    retiring = dataclasses.replace(old.current, verify_until_s=5_010)
    keys = FixedKeys(Keyring(CLUSTER, [new.current, retiring]), now_s=wall)
    tokens, _, asked = _memory(keys)
    token = old.sign(FencingToken(CLUSTER, "a", 5))
    assert tokens.check(token)[1] is None
    if blind:  # the mutant: the entry forgets when its key retires
        entry = tokens._passed[(token.cluster, token.scope, token.value, token.kid, token.mac)]
        tokens._passed[(token.cluster, token.scope, token.value, token.kid, token.mac)] = (*entry[:3], None)
    wall.now = 5_010.0  # well within TTL_S of the monotonic clock, which has not moved
    why = tokens.check(token)[1]
    if blind:
        assert why is None, "the control: a memory blind to retirement accepts a retired key's token"
    else:
        assert why == "retired-key"
        assert len(asked) == 2


class _MacBlind(dict[object, object]):
    """The mutant: a memory that finds a token by cluster, scope and value, whatever its key id and MAC."""

    def get(self, key: object, default: object = None) -> object:
        if isinstance(key, tuple):
            for known, entry in self.items():
                if isinstance(known, tuple) and known[:3] == key[:3]:
                    return entry
        return default


@pytest.mark.parametrize("blind", [False, True], ids=["memory", "control-blind-to-the-mac"])
def test_a_forged_mac_beside_a_remembered_token_is_refused(blind: bool) -> None:
    keys = FixedKeys(ephemeral_keyring(CLUSTER))
    tokens, _, _ = _memory(keys)
    token = keys.sign(FencingToken(CLUSTER, "a", 5))
    if blind:
        tokens._passed = _MacBlind()  # type: ignore[assignment]
    assert tokens.check(token)[1] is None
    forged = dataclasses.replace(token, mac="A" * 22)
    why = tokens.check(forged)[1]
    if blind:
        assert why is None, "the control: a memory blind to the MAC accepts a forged one"
    else:
        assert why == "bad-mac"
        assert tokens.check(forged)[1] == "bad-mac"  # never remembered


@pytest.mark.parametrize("blind", [False, True], ids=["memory", "control-blind-to-the-keyring"])
def test_the_redis_fence_refuses_a_dropped_keys_token_at_the_files_next_look(
        keyfile: tuple[Path, Keyring], blind: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("redis")
    from stockade.resources.redis import RedisFence
    from stockade.testing.servers.redis import RedisServer, require_redis

    require_redis()
    path, keyring = keyfile
    server = RedisServer(path.parent / "redis")
    try:
        verifier = KeyFile(path)
        verifier.reload_check_s = 0.0
        fence = RedisFence.from_url(server.url, keys=verifier)
        token = keyring.sign(FencingToken(CLUSTER, "a", 5))
        for _ in range(3):
            assert fence.set(token, "{a}:k", b"v") is True
        if blind:
            then = verifier.keyring
            monkeypatch.setattr(verifier, "in_force", lambda: (then, 0.0))
        _drop_every_key(path)
        if blind:
            assert fence.set(token, "{a}:k", b"w") is True, "the control: a blind memory lets the dropped key write"
        else:
            with pytest.raises(TokenMismatch):
                fence.set(token, "{a}:k", b"w")
            assert fence.client.get("{a}:k") == b"v"
        fence.close()
    finally:
        server.stop()


@pytest.mark.parametrize("blind", [False, True], ids=["memory", "control-blind-to-the-keyring"])
def test_postgres_keys_check_refuses_a_dropped_keys_token_at_the_files_next_look(
        keyfile: tuple[Path, Keyring], blind: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fenced(conn, token, keys=KeyFile)`` checks the MAC in Python first, with one memory per KeyFile."""
    pytest.importorskip("psycopg")
    from stockade.resources.postgres import _fenced

    path, keyring = keyfile
    verifier = KeyFile(path)
    verifier.reload_check_s = 0.0
    token = keyring.sign(FencingToken(CLUSTER, "a", 5))
    for _ in range(3):
        assert _fenced._prepare(token.encode(), None, verifier) == (token, "a")
    assert _fenced._memory_of(verifier) is _fenced._memory_of(verifier)
    if blind:
        then = verifier.keyring
        monkeypatch.setattr(verifier, "in_force", lambda: (then, 0.0))
    _drop_every_key(path)
    if blind:
        assert _fenced._prepare(token, None, verifier) == (token, "a"), "the control: a blind memory admits it"
    else:
        with pytest.raises(TokenMismatch):
            _fenced._prepare(token, None, verifier)
