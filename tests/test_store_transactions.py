"""`store.transaction(scope)` on the client handle (``open_store``), embedded and over HTTP (``POST /v1/tx``).

Each kind of store the client opens (`STORES`: ``sqlite://``, ``memory://``, a real
`stockade serve` over ``http://``), sync and async: the steps are buffered in
the client and applied all or none in one call that checks the token again
(R6). S20 through the public API: a newer holder writes while the block is
open; the commit raises `StaleToken` and nothing of the transaction lands,
counted as ``0 of N`` over a loop, beside its control (a client that sends the
same steps as separate puts), whose interleavings must show. Then the bounds,
and bad input over HTTP, which answers 4xx, never 5xx, and changes nothing
(S23), beside a control server that applies the well-formed steps before it
validates the rest. Run with ``-s`` to see the figure lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from conftest import HELPERS, PYTHON, ServeProcess, free_port, python_env

import stockade
from stockade.core.limits import TX_WRITES_MAX
from stockade.resources.store.sqlite_store import TX_BUFFER_BYTES_MAX
from stockade.wire import codecs

sys.path.insert(0, str(HELPERS))
from server_fixtures import request  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

LONG = os.environ.get("STOCKADE_LONG") == "1"
S20_ROUNDS = 1000 if LONG else 200
MIB = 1024 * 1024


#: The stores a transaction runs on, as the conftest's ``backend`` names them: the SQLite file (``embedded``), the
#: in-memory store and a served one. The other coordinator backends (PostgreSQL, etcd, ZooKeeper) would only mint
#: the tokens for the same SQLite store; their tokens on a store are the conformance suite's
#: (tests/test_coordinator_conformance.py: the lock block, stale tokens, another scope's token, idempotent replays).
STORES = ["embedded", "memory", "http"]


@pytest.fixture(params=STORES)
def backend(request: pytest.FixtureRequest) -> str:
    """The conftest's ``backend``, over the kinds of store only (`STORES`)."""
    return str(request.param)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """The conftest's ``http_server``, one per module and test worker: a case here writes only what the next one
    expects to find (a fresh scope where it reads what is not yet written: `test_steps_are_buffered_read_back_and_
    committed_together`), so the ``http`` cases share one `stockade serve` instead of starting one each."""
    server = ServeProcess(tmp_path_factory.mktemp("tx-serve"))
    yield server
    server.stop()


class Boom(Exception):
    """Raised inside a transaction's block by a test."""


@pytest.fixture
def opened(backend, coord_url, store_url, client):
    """``(coord, store, writer)``: a sync coordinator for tokens, the store handle under test (sync or
    async), and a second sync handle on the same store: the newer holder's own client."""
    coord = stockade.connect(coord_url)
    cluster = None if backend == "http" else coord.cluster_id
    store = client.open_store(store_url, cluster_id=cluster)
    writer = stockade.open_store(store_url, cluster_id=cluster)
    yield coord, store, writer
    if client.mode == "async":
        client.run(store.aclose())
    else:
        store.close()
    writer.close()
    coord.close()


def play(client, store, scope, script, *, token=None):
    """Run ``script`` (a list of steps, as data) inside one ``store.transaction``; returns ``(tx, reads)``.

    Steps: ``("put", key, value)``, ``("delete", key)``, ``("get", key)`` (its result
    goes to ``reads``), ``("call", function)`` (runs while the block is open),
    ``("raise",)`` (the block raises `Boom`).
    """
    reads: list = []

    def step(tx, item):
        if item[0] == "put":
            tx.put(item[1], item[2])
        elif item[0] == "delete":
            tx.delete(item[1])
        elif item[0] == "call":
            item[1]()
        elif item[0] == "raise":
            raise Boom()
        else:
            return True
        return False

    if client.mode == "sync":
        with store.transaction(scope, token=token) as tx:
            for item in script:
                if step(tx, item):
                    reads.append(tx.get(item[1]))
        return tx, reads

    async def run():
        async with store.transaction(scope, token=token) as tx:
            for item in script:
                if step(tx, item):
                    reads.append(await tx.get(item[1]))
        return tx

    return client.run(run()), reads


def lease_token(coord, scope):
    """A fresh token of ``scope`` (the lease released at once: its token stays what a zombie carries)."""
    lease = coord.acquire(scope, ttl_ms=10_000, keepalive=False)
    lease.release()
    return lease.token


def value_of(writer, scope, key):
    item = writer.get(scope, key)
    return None if item is None else item.value


# -- what a transaction does ----------------------------------------------------------------------


def test_steps_are_buffered_read_back_and_committed_together(opened, client):
    coord, store, writer = opened
    scope = f"steps-{client.mode}"  # a scope of its own: the http cases share a server (`http_server`)
    first = lease_token(coord, scope)
    writer.put(scope, "old", b"before", token=first)
    writer.put(scope, "gone", b"to delete", token=first)
    token = lease_token(coord, scope)
    script = [("put", "daily.csv", b"day,total"), ("get", "daily.csv"), ("get", "old"), ("delete", "gone"),
              ("get", "gone"), ("put", "daily.csv", b"day,total,2"), ("get", "daily.csv"),
              ("call", lambda: reads_meanwhile.append(value_of(writer, scope, "daily.csv")))]
    reads_meanwhile: list = []
    tx, reads = play(client, store, scope, script, token=token)
    own, through, deleted, latest = reads
    assert own.value == b"day,total" and own.commit_seq == 0 and own.token_value == token.value
    assert through.value == b"before" and through.commit_seq > 0
    assert deleted is None and latest.value == b"day,total,2"
    assert reads_meanwhile == [None]  # nothing left the client before the end of the block
    assert [r.key for r in tx.results] == ["daily.csv", "gone", "daily.csv"]
    seqs = [r.commit_seq for r in tx.results]
    assert seqs == sorted(seqs) and seqs[0] > 0 and len(set(seqs)) == 3
    assert all(r.token_value == token.value == r.high_water and not r.replayed for r in tx.results)
    assert value_of(writer, scope, "daily.csv") == b"day,total,2"
    assert writer.get(scope, "gone") is None and value_of(writer, scope, "old") == b"before"
    assert writer.high_water(scope) == token.value


def test_the_token_defaults_to_the_enclosing_lease_k1(opened, client, coord_url):
    _, store, writer = opened
    if client.mode == "sync":
        coord = stockade.connect(coord_url)
        with coord.lock("reports", ttl_ms=10_000) as lease, store.transaction("reports") as tx:
            tx.put("k", b"v")
        coord.close()
    else:
        async def run():
            async with stockade.connect_async(coord_url) as coord, coord.lock("reports", ttl_ms=10_000) as lease:
                async with store.transaction("reports") as tx:
                    tx.put("k", b"v")
                return lease, tx
        lease, tx = client.run(run())
    assert tx.token == lease.token and tx.results[0].token_value == lease.token.value
    assert value_of(writer, "reports", "k") == b"v"
    with pytest.raises(stockade.InvalidArgument):
        store.transaction("reports")  # no token, no lease on the scope in this context


def test_a_block_that_raises_sends_nothing(opened, client):
    coord, store, writer = opened
    writer.put("reports", "k", b"kept", token=lease_token(coord, "reports"))
    mark = writer.high_water("reports")
    newer = lease_token(coord, "reports")  # above the mark: had anything been sent, the mark would move
    with pytest.raises(Boom):
        play(client, store, "reports", [("put", "k", b"lost"), ("put", "k2", b"lost"), ("raise",)], token=newer)
    assert writer.high_water("reports") == mark
    assert value_of(writer, "reports", "k") == b"kept" and writer.get("reports", "k2") is None


def test_a_stale_token_is_refused_before_the_body_runs(opened, client):
    coord, store, writer = opened
    zombie = lease_token(coord, "reports")
    writer.put("reports", "k", b"newer", token=lease_token(coord, "reports"))
    ran: list = []
    with pytest.raises(stockade.StaleToken) as refused:
        play(client, store, "reports", [("call", lambda: ran.append(1)), ("put", "k", b"zombie")], token=zombie)
    assert ran == [] and refused.value.high_water == writer.high_water("reports")
    with pytest.raises(stockade.TokenMismatch):
        play(client, store, "reports", [("put", "k", b"x")], token=lease_token(coord, "other"))
    assert value_of(writer, "reports", "k") == b"newer"


def test_a_refused_commit_is_reported_to_the_hooks(backend, coord_url, store_url):
    from stockade.client import Hooks

    coord = stockade.connect(coord_url)
    cluster = None if backend == "http" else coord.cluster_id
    seen: list = []
    store = stockade.open_store(store_url, cluster_id=cluster, hooks=Hooks(on_reject=seen.append))
    writer = stockade.open_store(store_url, cluster_id=cluster)
    try:
        zombie, newer = lease_token(coord, "hooked"), lease_token(coord, "hooked")
        with pytest.raises(stockade.StaleToken), store.transaction("hooked", token=zombie) as tx:
            tx.put("k", b"zombie")
            writer.put("hooked", "k", b"newer", token=newer)
        assert [type(e) for e in seen] == [stockade.StaleToken] and seen[0].high_water == newer.value
        assert value_of(writer, "hooked", "k") == b"newer"
    finally:
        store.close(), writer.close(), coord.close()


# -- S20: a newer holder writes while the transaction is open --------------------------------------


class SeparatePuts:
    """The control: the same steps, each sent as its own ``put`` as soon as it is made."""

    def __init__(self, store, scope, token):
        self.store, self.scope, self.token = store, scope, token

    def put(self, key, value):
        self.store.put(self.scope, key, value, token=self.token)


def s20_round(store, writer, coord, scope, *, control):
    """One round: A opens a transaction on ``scope`` and writes 3 steps; after the first, a newer
    holder B writes. Returns ``(interleaved, newer_lost, refused)``: A's steps landed beside B's
    write (some of them, or all of them after B's), B's write missing, and A told `StaleToken`."""
    a_token = lease_token(coord, scope)
    b_token = lease_token(coord, scope)
    steps = [(f"a{i}", b"A") for i in range(3)]

    def newer_holder_writes():
        writer.put(scope, "b", b"B", token=b_token)

    try:
        if control:
            tx = SeparatePuts(store, scope, a_token)
            for i, (key, value) in enumerate(steps):
                tx.put(key, value)
                if i == 0:
                    newer_holder_writes()
        else:
            with store.transaction(scope, token=a_token) as tx:
                for i, (key, value) in enumerate(steps):
                    tx.put(key, value)
                    if i == 0:
                        newer_holder_writes()
    except stockade.StaleToken:
        refused = 1
    else:
        refused = 0
    landed = [key for key, _ in steps if writer.get(scope, key) is not None]
    return int(bool(landed)), int(value_of(writer, scope, "b") != b"B"), refused


def test_s20_newer_holder_during_the_block_never_interleaves(backend, coord_url, store_url):
    coord = stockade.connect(coord_url)
    cluster = None if backend == "http" else coord.cluster_id
    store = stockade.open_store(store_url, cluster_id=cluster)
    writer = stockade.open_store(store_url, cluster_id=cluster)
    figures = {}
    try:
        for control in (False, True):
            rounds = S20_ROUNDS if not control else 50
            interleaved = lost = refused = 0
            for n in range(rounds):
                i, missing, r = s20_round(store, writer, coord, f"s20-{int(control)}-{n}", control=control)
                interleaved, lost, refused = interleaved + i, lost + missing, refused + r
            figures[control] = (interleaved, lost, refused, rounds)
    finally:
        store.close(), writer.close(), coord.close()
    (i, lost, refused, n), (ci, _, _, cn) = figures[False], figures[True]
    print(f"\nS20 via open_store ({backend}): interleavings {i} of {n}, newer writes lost {lost} of {n}, "
          f"commits refused StaleToken {refused} of {n}; control (separate puts): interleavings {ci} of {cn}")
    assert (i, lost, refused) == (0, 0, n)
    assert ci == cn  # the control's first step always lands before the newer write


def test_s20_async_commit_after_a_newer_write_applies_nothing(backend, coord_url, store_url):
    """The async handle, a few rounds (the loop above runs the sync one)."""
    import asyncio

    coord = stockade.connect(coord_url)
    cluster = None if backend == "http" else coord.cluster_id
    writer = stockade.open_store(store_url, cluster_id=cluster)

    async def run():
        refused = landed = 0
        async with stockade.open_store_async(store_url, cluster_id=cluster) as store:
            for n in range(20):
                scope = f"s20a-{n}"
                a_token, b_token = lease_token(coord, scope), lease_token(coord, scope)
                try:
                    async with store.transaction(scope, token=a_token) as tx:
                        tx.put("a0", b"A")
                        await asyncio.to_thread(writer.put, scope, "b", b"B", token=b_token)
                        tx.put("a1", b"A")
                except stockade.StaleToken:
                    refused += 1
                landed += sum(writer.get(scope, k) is not None for k in ("a0", "a1"))
        return refused, landed

    try:
        refused, landed = asyncio.run(run())
    finally:
        writer.close(), coord.close()
    assert (refused, landed) == (20, 0)


# -- bounds: refused at the step, before anything is sent -----------------------------------------


def test_step_count_bound(opened, client):
    coord, store, writer = opened
    token = lease_token(coord, "bound")
    script = [("delete", f"k{i}") for i in range(TX_WRITES_MAX)]
    tx, _ = play(client, store, "bound", script, token=token)
    assert len(tx.results) == TX_WRITES_MAX
    newer = lease_token(coord, "bound")
    with pytest.raises(stockade.LimitExceeded) as refused:
        play(client, store, "bound", [*script, ("put", "one-too-many", b"x")], token=newer)
    assert refused.value.limit == "TX_WRITES_MAX"
    assert writer.high_water("bound") == token.value and writer.get("bound", "one-too-many") is None


def test_byte_bound_of_each_port(backend, opened, client):
    coord, store, writer = opened
    token = lease_token(coord, "bytes")
    value = b"v" * MIB
    if backend == "http":
        # Exactly what the body holds passes; one byte more is refused at its step.
        room = codecs.tx_body_bytes_max() - codecs.tx_step_bytes("put", "k0", MIB) * 2
        last = room - codecs.tx_step_bytes("put", "k2", 0)
        fits = [("put", "k0", value), ("put", "k1", value), ("put", "k2", b"x" * (last // 4 * 3))]
        limit = "TX_BODY_BYTES_MAX"
        too_many = [*fits[:2], ("put", "k2", b"x" * (last // 4 * 3 + 3))]
    else:
        count = TX_BUFFER_BYTES_MAX // MIB
        fits = [("put", f"k{i}", value) for i in range(count)]
        limit = "TX_BUFFER_BYTES_MAX"
        too_many = [*fits, ("put", "one-more", b"x")]
    tx, _ = play(client, store, "bytes", fits, token=token)
    assert len(tx.results) == len(fits)
    newer = lease_token(coord, "bytes")
    with pytest.raises(stockade.LimitExceeded) as refused:
        play(client, store, "bytes", [*too_many, ("put", "marker", b"x")], token=newer)
    assert refused.value.limit == limit
    assert writer.high_water("bytes") == token.value and writer.get("bytes", "marker") is None


def test_bad_steps_are_refused_at_the_step(opened, client):
    coord, store, _ = opened
    token = lease_token(coord, "bad")
    for script in ([("put", "", b"x")], [("put", "k\x00", b"x")], [("put", "k" * 1025, b"x")],
                   [("put", "k", 5)], [("put", "k", b"x" * (MIB + 1))], [("delete", None)]):
        with pytest.raises(stockade.InvalidArgument):
            play(client, store, "bad", script, token=token)
    tx, _ = play(client, store, "bad", [("put", "k", b"x")], token=token)
    with pytest.raises(stockade.InvalidArgument):
        tx.put("late", b"x")  # the block has ended
    with pytest.raises(stockade.InvalidArgument):
        store.transaction("bad scope", token=token)


def test_tx_step_bytes_is_the_exact_encoded_length():
    for key in ["k", "daily.csv", "é/ü", "\x01\x1f\"\\", "日本" * 100, "\U0001f600"]:
        for value in [b"", b"a", b"ab", b"abc", b"\xff" * 1000]:
            for op in ("put", "delete"):
                v = value if op == "put" else b""
                assert codecs.tx_step_bytes(op, key, len(v)) == len(codecs.dumps(codecs.tx_step_doc(op, key, v))) + 1
    steps = [("put", "a", b"1"), ("delete", "b", b"")]
    body = codecs.tx_body(steps)
    assert json.loads(body) == {"steps": [{"op": "put", "key": "a", "value_b64": "MQ=="}, {"op": "delete", "key": "b"}]}
    frame = codecs.TX_BODY_BYTES_MAX - codecs.tx_body_bytes_max() + 1  # '{"steps":[' and ']}'
    assert len(body) == frame + sum(codecs.tx_step_bytes(op, key, len(value)) for op, key, value in steps) - 1


# -- bad input over HTTP (S23 style): 4xx, never 5xx, nothing changed --------------------------------


def _call(url, method, path, headers=None, body=None):
    status, head, raw = request(url, method, path, headers=headers, body=body)
    doc = json.loads(raw) if head.get("content-type", "").startswith(("application/json",
                                                                       "application/problem+json")) else raw
    return status, doc


def _tx_corpus(token, other_scope_token, stale_token):
    js = {"Content-Type": "application/json", "Fencing-Token": token}
    ok_step = {"op": "put", "key": "applied", "value_b64": "QQ=="}

    def body(*steps, **extra):
        return json.dumps({"steps": list(steps), **extra}).encode()

    cases = [
        ("/v1/tx/s", {"Content-Type": "application/json"}, body(ok_step)),  # no token
        ("/v1/tx/s", {**js, "Fencing-Token": "stk1.0.1.s"}, body(ok_step)),
        ("/v1/tx/s", {**js, "Fencing-Token": token + "x"}, body(ok_step)),
        ("/v1/tx/s", {**js, "Fencing-Token": other_scope_token}, body(ok_step)),
        ("/v1/tx/s", {**js, "Fencing-Token": stale_token}, body(ok_step)),
        ("/v1/tx/s", {"Fencing-Token": token, "Content-Type": "text/plain"}, body(ok_step)),
        ("/v1/tx/s", {"Fencing-Token": token}, body(ok_step)),  # no content type
        ("/v1/tx/s", js, b"not json"),
        ("/v1/tx/s", js, b""),
        ("/v1/tx/s", js, b"[]"),
        ("/v1/tx/s", js, b'{"steps": [], "steps": []}'),
        ("/v1/tx/s", js, b'{"steps": [{"op": "put", "key": "k", "value_b64": "QQ==", "key": "j"}]}'),
        ("/v1/tx/s", js, b'{"steps": 5}'),
        ("/v1/tx/s", js, b"{}"),
        ("/v1/tx/s", js, body(ok_step, extra=1)),
        ("/v1/tx/s", js, body(ok_step, 7)),
        ("/v1/tx/s", js, body(ok_step, {"op": "rename", "key": "k"})),
        ("/v1/tx/s", js, body(ok_step, {"op": "put", "key": "k"})),
        ("/v1/tx/s", js, body(ok_step, {"op": "put", "key": "k", "value_b64": "!!"})),
        ("/v1/tx/s", js, body(ok_step, {"op": "put", "key": "k", "value_b64": "QQ="})),
        ("/v1/tx/s", js, body(ok_step, {"op": "put", "key": "k", "value_b64": 5})),
        ("/v1/tx/s", js, body(ok_step, {"op": "delete", "key": "k", "value_b64": "QQ=="})),
        ("/v1/tx/s", js, body(ok_step, {"op": "delete"})),
        ("/v1/tx/s", js, body(ok_step, {"op": "delete", "key": ""})),
        ("/v1/tx/s", js, body(ok_step, {"op": "delete", "key": "k\x00"})),
        ("/v1/tx/s", js, body(ok_step, {"op": "delete", "key": "k" * 1025})),
        ("/v1/tx/s", js, body(ok_step, {"op": "delete", "key": 5})),
        ("/v1/tx/s", js, b'{"steps": [{"op": "put", "key": "applied", "value_b64": "QQ=="},'
                         b' {"op": "delete", "key": "\\ud800"}]}'),  # a lone surrogate
        ("/v1/tx/s", js, body(ok_step, {"op": "put", "key": "big", "value_b64": "QUFB" * (MIB // 3 + 1)})),
        ("/v1/tx/s", js, body(ok_step, *[{"op": "delete", "key": "k"}] * TX_WRITES_MAX)),
        ("/v1/tx/s", js, b'{"steps": [' + b"1," * (codecs.TX_BODY_BYTES_MAX // 2) + b"1]}"),
        ("/v1/tx/s", js, b"[" * 5000),
        ("/v1/tx/s?x=1", js, body(ok_step)),
        ("/v1/tx/bad%20scope", js, body(ok_step)),
        ("/v1/tx/" + "s" * 201, js, body(ok_step)),
        ("/v1/tx/", js, body(ok_step)),
    ]
    return [("POST", *case) for case in cases] + [("GET", "/v1/tx/s", {}, None), ("PUT", "/v1/tx/s", js, b"{}")]


def _state(url):
    hwm = _call(url, "GET", "/v1/hwm/s")[1]["high_water"]
    return hwm, _call(url, "GET", "/v1/kv/s")[1]["items"]


def _corpus_run(url):
    coord = stockade.connect(url)
    try:
        stale, token = lease_token(coord, "s"), lease_token(coord, "s")
        store = stockade.open_store(url)
        store.put("s", "k", b"original", token=token)
        store.close()
        cases = _tx_corpus(token.encode(), lease_token(coord, "other").encode(), stale.encode())
    finally:
        coord.close()
    before = _state(url)
    answers = [(c[0], c[1][:40], *_call(url, c[0], c[1], headers=c[2], body=c[3])) for c in cases]
    return answers, before, _state(url)


def test_bad_transactions_over_http_get_4xx_and_change_nothing(serve):
    server = serve()
    answers, before, after = _corpus_run(server.url)
    not_4xx = [(method, path, status) for method, path, status, _ in answers if not 400 <= status < 500]
    for _, _, status, doc in answers:
        assert isinstance(doc, dict) and doc["status"] == status, doc
        assert doc["type"].startswith("https://stockade.invalid/problems/") and "Traceback" not in json.dumps(doc)
    statuses = sorted({status for _, _, status, _ in answers})
    print(f"\ntx bad input: non-4xx {len(not_4xx)} of {len(answers)} requests (statuses {statuses}); "
          f"state changed {int(before != after)}")
    assert not_4xx == [] and before == after
    assert {400, 405, 409, 413, 415, 422} <= set(statuses)


_CONTROL_SERVER = """
import sys
from stockade.cli import serve
from stockade.resources.store import BatchWrite
from stockade.server import app

original = app.App.transaction

def transaction(self, request, raw_scope):
    # The control: each well-formed put is applied as it is read, before the rest is validated.
    try:
        token = app.FencingToken.decode(request.headers["fencing-token"])
        for step in app.json.loads(request.body)["steps"]:
            if step.get("op") == "put" and isinstance(step.get("key"), str):
                self.store_writer.submit(BatchWrite("put", raw_scope, step["key"], b"control", token))
    except Exception:
        pass
    return original(self, request, raw_scope)

app.App.transaction = transaction
sys.exit(serve.run(sys.argv[1:]))
"""


def test_bad_transactions_control_is_caught(tmp_path):
    """A server that applies steps before validating the rest: the state check must see it."""
    script = tmp_path / "control_server.py"
    script.write_text(_CONTROL_SERVER)
    port = free_port()
    with open(tmp_path / "control.log", "wb") as log:
        proc = subprocess.Popen([PYTHON, str(script), "--data-dir", str(tmp_path / "data"), "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=python_env())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "control.log").read_text()
                time.sleep(0.05)
        _, before, after = _corpus_run(url)
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"\ntx bad input control (apply before validate): state changed {int(before != after)}")
    assert before != after


def test_scoped_bearer_tokens_cover_transactions_as_they_cover_kv(serve, tmp_path):
    admin, scoped = "admin-token-0123456789abcdef", "scoped-token-0123456789abcdef"
    (tmp_path / "tokens").write_text(f"{admin}\n{scoped} reports.*\n")
    server = serve("--auth-tokens", str(tmp_path / "tokens"))
    coord = stockade.connect(server.url, auth_token=admin)
    tokens = {scope: lease_token(coord, scope).encode() for scope in ("reports.daily", "billing")}
    coord.close()
    body = json.dumps({"steps": [{"op": "put", "key": "k", "value_b64": "QQ=="}]}).encode()

    def tx(scope, bearer):
        headers = {"Content-Type": "application/json", "Fencing-Token": tokens[scope]}
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        return _call(server.url, "POST", f"/v1/tx/{scope}", headers=headers, body=body)[0]

    answers = {"scoped, own scope": tx("reports.daily", scoped), "scoped, other scope": tx("billing", scoped),
               "no token": tx("billing", None), "admin": tx("billing", admin)}
    assert answers == {"scoped, own scope": 200, "scoped, other scope": 403, "no token": 401, "admin": 200}
    store = stockade.open_store(server.url, auth_token=scoped)
    assert store.get("reports.daily", "k").value == b"A"
    store.close()


# -- the server's loop never waits on the store's file lock for a transaction -------------------------


def _tx_order_while_locked(path, *, inline_control: bool):
    """Hold the store's write lock elsewhere, submit a transaction, and record what the loop did first."""
    import asyncio
    import sqlite3

    from stockade.core.tokens import FencingToken
    from stockade.resources.store.sqlite_store import SQLiteStore
    from stockade.server._groupcommit import GroupCommitter
    from stockade.server._store_tx import StoreWrites, TxWrite

    cluster = "0123456789abcdef"
    store = SQLiteStore(path, cluster_id=cluster, busy_timeout_ms=1_000, keys="unsigned")
    writes = StoreWrites(store)
    holder = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock

    async def main():
        loop = asyncio.get_running_loop()
        # The control commits whatever comes inline on the loop, transactions included.
        committer = GroupCommitter("store", writes.run_batch, loop,
                                   try_batch=writes.run_batch if inline_control else writes.try_batch)
        committer.start()
        order: list[str] = []
        steps = (("put", "k1", b"v"), ("delete", "k2", b""))
        pending = committer.submit(TxWrite("a", FencingToken(cluster, "a", 1), steps))
        pending.add_done_callback(lambda _: order.append("transaction answered"))
        for i in range(5):  # other requests the loop serves meanwhile
            await asyncio.sleep(0)
            order.append(f"other request {i}")
        order.append("lock released")
        holder.execute("ROLLBACK")
        outcome = await pending
        committer.stop()
        return order, outcome

    try:
        return asyncio.run(main())
    finally:
        holder.close()
        store.close()


def test_the_loop_serves_others_while_a_transaction_waits_for_the_store_lock(tmp_path):
    order, outcome = _tx_order_while_locked(tmp_path / "store.db", inline_control=False)
    assert order[:6] == [f"other request {i}" for i in range(5)] + ["lock released"]
    assert order[-1] == "transaction answered"
    assert [r.key for r in outcome] == ["k1", "k2"] and outcome[0].commit_seq == 1


def test_control_a_transaction_committed_inline_blocks_the_loop(tmp_path):
    order, outcome = _tx_order_while_locked(tmp_path / "store.db", inline_control=True)
    assert isinstance(outcome, stockade.BackendUnavailable)  # it sat in BEGIN IMMEDIATE on the loop
    assert order.index("transaction answered") < order.index("lock released")
