"""The documents of the HTTP API, both directions: what the server writes is what the client reads.

Encoders (server side) turn core values into JSON-ready dicts; decoders
(client side) check every field they read and raise `BackendUnavailable` for
an answer that is not what docs/http-api.md says (a proxy's page, a wrong
port, an incompatible server), never a bare ``KeyError``.

    document     encoder            decoder              schema (OpenAPI)
    grant        grant_doc          grant_from           Grant
    renewal      renewal_doc        lease_from           Renewal
    lock info    lock_doc           scope_info_from      LockInfo
    lock list    lock_list_doc      scope_infos_from     LockList
    write        write_doc          write_result_from    WriteResult
    key list     key_list_doc       keys_from            ItemList
    value        item_headers       item_from            (raw bytes + headers)
    high water   high_water_doc     high_water_from      HighWater
    transaction  tx_body            (the server's)       TransactionRequest
    tx result    tx_doc             tx_results_from      TransactionResult
    cluster      cluster_doc        cluster_id_from,     Cluster
                                    dense_tokens_from
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from stockade.core import leases as core_leases
from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.core.tokens import FencingToken, validate_cluster_id
from stockade.core.values import FenceFloors, Grant, Item, WriteResult

__all__ = [
    "FENCING_TOKEN_HEADER",
    "IDEMPOTENCY_KEY_HEADER",
    "TOKEN_VALUE_HEADER",
    "COMMIT_SEQ_HEADER",
    "JSON",
    "PROBLEM_JSON",
    "OCTETS",
    "dumps",
    "grant_doc",
    "renewal_doc",
    "lock_doc",
    "lock_list_doc",
    "contenders_doc",
    "contenders_from",
    "write_doc",
    "key_list_doc",
    "item_headers",
    "high_water_doc",
    "cluster_doc",
    "dense_tokens_from",
    "decode_json",
    "lease_from",
    "grant_from",
    "scope_info_from",
    "scope_infos_from",
    "write_result_from",
    "keys_from",
    "item_from",
    "high_water_from",
    "cluster_id_from",
    "TX_BODY_BYTES_MAX",
    "tx_step_doc",
    "tx_step_bytes",
    "tx_body",
    "tx_body_bytes_max",
    "tx_doc",
    "tx_results_from",
]

FENCING_TOKEN_HEADER = "Fencing-Token"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
TOKEN_VALUE_HEADER = "Token-Value"
COMMIT_SEQ_HEADER = "Commit-Seq"
JSON = "application/json"
PROBLEM_JSON = "application/problem+json"
OCTETS = "application/octet-stream"

# A transaction's JSON body: room for a value of the default 1 MiB bound (base64: 4/3 of it) and
# several smaller ones, yet small enough that the server's 64 MiB of request bytes hold 16 at once.
TX_BODY_BYTES_MAX = 4 * 1024 * 1024
_TX_OPEN, _TX_CLOSE = b'{"steps":[', b"]}"
# The bytes of a step's document around its key and its base64 value (compact JSON, as `dumps` writes).
_TX_PUT_FRAME = len('{"op":"put","key":,"value_b64":""}')
_TX_DELETE_FRAME = len('{"op":"delete","key":}')

_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False, check_circular=False)
# The C encoder `json.JSONEncoder.iterencode` builds on each call, built once (documents are never circular).
_c_encode = None if c_make_encoder is None else c_make_encoder(
    None, _ENCODER.default, encode_basestring_ascii, None, ":", ",", False, False, False)


def dumps(document: Any) -> bytes:
    """Compact ASCII JSON; NaN and Infinity refused (they are not JSON)."""
    if _c_encode is None:  # no C accelerator: the encoder's own path
        return _ENCODER.encode(document).encode("ascii")
    return "".join(_c_encode(document, 0)).encode("ascii")


# -- encoders (the server's answers) --------------------------------------------------------------


def grant_doc(lease: core_leases.Lease, scope: str) -> dict[str, Any]:
    return {"scope": scope, "token": lease.token.encode(), "token_value": lease.token.value,
            "lease_id": lease.lease_id, "ttl_ms": lease.ttl_ms}


def renewal_doc(lease: core_leases.Lease) -> dict[str, Any]:
    return {"scope": lease.scope, "token": lease.token.encode(), "token_value": lease.token.value,
            "ttl_ms": lease.ttl_ms}


def lock_doc(info: core_leases.ScopeInfo) -> dict[str, Any]:
    """A scope's state. ``token`` is the current holder's token, or None when free."""
    return {
        "scope": info.scope,
        "state": info.state.value,
        "holder": info.holder,
        "token": info.token.encode() if info.token else None,
        "token_value": info.token.value if info.token else None,
        "last_token": info.last_token,
        "remaining_ms": info.remaining_ms,
        "waiters": info.waiters,
    }


def lock_list_doc(infos: Sequence[core_leases.ScopeInfo], next_after: str | None) -> dict[str, Any]:
    return {"locks": [lock_doc(info) for info in infos], "next_after": next_after}


def contenders_doc(scope: str, line: Sequence[core_leases.Contender]) -> dict[str, Any]:
    """Who holds ``scope`` and who waits, in serving order: holder names only (no lease id, no token)."""
    return {"scope": scope, "contenders": [{"holder": c.holder, "holding": c.holding} for c in line]}


def write_doc(result: WriteResult) -> dict[str, Any]:
    return {"scope": result.scope, "key": result.key, "token_value": result.token_value,
            "high_water": result.high_water, "commit_seq": result.commit_seq, "replayed": result.replayed}


def key_list_doc(rows: Sequence[tuple[str, int, int, int]], next_after: str | None) -> dict[str, Any]:
    """A page of keys from ``(key, token_value, commit_seq, size)`` rows."""
    items = [{"key": k, "token_value": t, "commit_seq": c, "size": n} for k, t, c, n in rows]
    return {"items": items, "next_after": next_after}


def item_headers(item: Item) -> list[tuple[str, str]]:
    """The headers that go with a value's raw bytes."""
    return [(TOKEN_VALUE_HEADER, str(item.token_value)), (COMMIT_SEQ_HEADER, str(item.commit_seq))]


def high_water_doc(scope: str, high_water: int) -> dict[str, Any]:
    return {"scope": scope, "high_water": high_water}


def cluster_doc(cluster_id: str, *, dense_tokens: bool = True) -> dict[str, Any]:
    """``dense_tokens``: each grant's token is the scope's previous + 1 (false behind
    ``serve --coordinator etcd://``, whose tokens only strictly increase)."""
    return {"cluster_id": cluster_id, "dense_tokens": dense_tokens}


def fence_floors_doc(floors: FenceFloors) -> dict[str, Any]:
    return {"floors": dict(floors.floors), "default": floors.default}


def tx_step_doc(op: str, key: str, value: bytes) -> dict[str, Any]:
    """One step of a transaction body: ``{"op": "put", "key", "value_b64"}`` or ``{"op": "delete", "key"}``."""
    if op == "put":
        return {"op": "put", "key": key, "value_b64": base64.b64encode(value).decode("ascii")}
    return {"op": "delete", "key": key}


def tx_step_bytes(op: str, key: str, value_bytes: int) -> int:
    """The exact length of ``dumps(tx_step_doc(op, key, value))`` plus its separating comma, for a value
    of ``value_bytes`` bytes, without encoding the value: what a client counts against `TX_BODY_BYTES_MAX`."""
    key_bytes = len(_ENCODER.encode(key))
    if op == "put":
        return _TX_PUT_FRAME + key_bytes + 4 * ((value_bytes + 2) // 3) + 1
    return _TX_DELETE_FRAME + key_bytes + 1


def tx_body_bytes_max() -> int:
    """What the steps of one body may add up to in `tx_step_bytes` (the last step has no comma)."""
    return TX_BODY_BYTES_MAX - len(_TX_OPEN) - len(_TX_CLOSE) + 1


def tx_body(steps: Iterable[tuple[str, str, bytes]]) -> bytes:
    """The body of ``POST /v1/tx/{scope}`` for ``(op, key, value)`` steps, in order."""
    return _TX_OPEN + b",".join(dumps(tx_step_doc(op, key, value)) for op, key, value in steps) + _TX_CLOSE


def tx_doc(scope: str, token_value: int, high_water: int, results: Sequence[WriteResult]) -> dict[str, Any]:
    """A committed transaction: what its steps share, and each step's ``commit_seq`` in step order.

    The keys are not echoed: the caller has them, and an answer of 10,000
    steps stays small (at most 20 bytes a step) whatever the keys' length.
    """
    return {"scope": scope, "token_value": token_value, "high_water": high_water,
            "commit_seqs": [result.commit_seq for result in results]}


# -- decoders (the client's reading) --------------------------------------------------------------


_DECODER = json.JSONDecoder()  # what ``json.loads`` uses without arguments


def decode_json(body: bytes, status: int) -> Any:
    """The JSON document of a success answer.

    Raises:
        BackendUnavailable: the body is not JSON (a proxy's error page, a wrong port).
    """
    try:
        if body[:1] == b"{" and body[1:2] != b"\x00":  # what ``json.loads`` reads as UTF-8, decoded without its detour
            text = body.decode("utf-8", "surrogatepass")
            document, end = _DECODER.raw_decode(text)
            return document if end == len(text) else _DECODER.decode(text)  # after the document: spaces, or an error
        return json.loads(body)
    except ValueError as exc:
        raise BackendUnavailable(f"server sent a malformed JSON body (HTTP {status})") from exc


def _field(doc: Any, name: str, kind: type) -> Any:
    value = doc.get(name) if isinstance(doc, dict) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BackendUnavailable(f"server response lacks a valid {name!r}")
    return value


def _token(doc: Any, name: str = "token") -> FencingToken:
    try:
        return FencingToken.decode(_field(doc, name, str))
    except InvalidArgument as exc:
        raise BackendUnavailable(f"server sent a malformed {name!r}") from exc


def lease_from(doc: Any, *, lease_id: str, holder: str, sent_ns: int) -> core_leases.Lease:
    """A core `Lease` from a grant or renewal.

    ``granted_ns``/``expires_ns`` are on *this* host's monotonic clock (the send
    time, and send time + TTL): the server's clock is never seen (C3).
    """
    token = _token(doc)
    ttl_ms = _field(doc, "ttl_ms", int)
    return core_leases.Lease(
        lease_id=lease_id,
        holder=holder,
        token=token,
        ttl_ms=ttl_ms,
        granted_ns=sent_ns,
        expires_ns=sent_ns + ttl_ms * 1_000_000,
    )


def grant_from(doc: Any, *, holder: str, sent_ns: int) -> Grant:
    """The port's `Grant` from a grant document: its lease id, token and TTL, checked.

    ``holder`` is the one asked for and ``sent_ns`` the request's send time on *this* host's
    monotonic clock (K2): the server's clock is never seen (C3).
    """
    if type(doc) is dict:  # the usual document, read without a call a field
        lease_id, text, ttl_ms = doc.get("lease_id"), doc.get("token"), doc.get("ttl_ms")
        if type(lease_id) is str and lease_id and type(text) is str and type(ttl_ms) is int:
            try:
                token = FencingToken.decode(text)
            except InvalidArgument as exc:
                raise BackendUnavailable("server sent a malformed 'token'") from exc
            return Grant(lease_id, holder, token, ttl_ms, sent_ns)
    lease_id = _field(doc, "lease_id", str)
    if not lease_id:
        raise BackendUnavailable("server response lacks a valid 'lease_id'")
    return Grant(lease_id, holder, _token(doc), _field(doc, "ttl_ms", int), sent_ns)


def fence_floors_from(doc: Any) -> FenceFloors:
    floors = doc.get("floors") if isinstance(doc, dict) else None
    if not isinstance(floors, dict):
        raise BackendUnavailable("server sent fence floors without a floors object")
    try:
        return FenceFloors(floors, _field(doc, "default", int))
    except InvalidArgument as exc:
        raise BackendUnavailable(f"server sent bad fence floors: {exc}") from exc


def scope_info_from(doc: Any) -> core_leases.ScopeInfo:
    try:
        state = core_leases.ScopeState(_field(doc, "state", str))
    except ValueError as exc:
        raise BackendUnavailable("server sent an unknown scope state") from exc
    holder = doc.get("holder")
    return core_leases.ScopeInfo(
        scope=_field(doc, "scope", str),
        state=state,
        holder=holder if isinstance(holder, str) else None,
        token=_token(doc) if doc.get("token") is not None else None,
        last_token=_field(doc, "last_token", int),
        remaining_ms=_field(doc, "remaining_ms", int),
        waiters=_field(doc, "waiters", int),
    )


def scope_infos_from(doc: Any) -> list[core_leases.ScopeInfo]:
    locks = doc.get("locks") if isinstance(doc, dict) else None
    if not isinstance(locks, list):
        raise BackendUnavailable("server answer lacks 'locks'")
    return [scope_info_from(entry) for entry in locks]


def contenders_from(doc: Any) -> list[core_leases.Contender]:
    line = doc.get("contenders") if isinstance(doc, dict) else None
    if not isinstance(line, list):
        raise BackendUnavailable("server answer lacks 'contenders'")
    return [core_leases.Contender(_field(entry, "holder", str), _field(entry, "holding", bool)) for entry in line]


def write_result_from(doc: Any) -> WriteResult:
    return WriteResult(
        scope=_field(doc, "scope", str),
        key=_field(doc, "key", str),
        token_value=_field(doc, "token_value", int),
        high_water=_field(doc, "high_water", int),
        commit_seq=_field(doc, "commit_seq", int),
        replayed=bool(doc.get("replayed", False)),
    )


def tx_results_from(doc: Any, *, scope: str, keys: Sequence[str]) -> list[WriteResult]:
    """The results of a committed transaction whose steps wrote ``keys``, in step order."""
    seqs = doc.get("commit_seqs") if isinstance(doc, dict) else None
    if (not isinstance(seqs, list) or len(seqs) != len(keys)
            or not all(isinstance(seq, int) and not isinstance(seq, bool) for seq in seqs)):
        raise BackendUnavailable(f"server transaction answer lacks the commit_seq of its {len(keys)} steps")
    if _field(doc, "scope", str) != scope:
        raise BackendUnavailable("server transaction answer is for another scope")
    token_value, high_water = _field(doc, "token_value", int), _field(doc, "high_water", int)
    return [WriteResult(scope, key, token_value, high_water, seq, replayed=False)
            for key, seq in zip(keys, seqs, strict=True)]


def keys_from(doc: Any) -> list[str]:
    """The keys of a key-list page, in order."""
    entries = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise BackendUnavailable("server answer lacks 'items'")
    keys = []
    for entry in entries:
        key = entry.get("key") if isinstance(entry, dict) else None
        if not isinstance(key, str):
            raise BackendUnavailable("server list entry lacks a key")
        keys.append(key)
    return keys


def item_from(headers: Mapping[str, str], body: bytes, *, scope: str, key: str) -> Item:
    """An `Item` from a value's answer; ``headers`` keys are lowercase."""
    try:
        token_value = int(headers[TOKEN_VALUE_HEADER.lower()])
        commit_seq = int(headers[COMMIT_SEQ_HEADER.lower()])
    except (KeyError, ValueError) as exc:
        raise BackendUnavailable("server response lacks Token-Value or Commit-Seq") from exc
    return Item(scope=scope, key=key, value=body, token_value=token_value, commit_seq=commit_seq)


def high_water_from(doc: Any) -> int:
    high_water = doc.get("high_water") if isinstance(doc, dict) else None
    if not isinstance(high_water, int) or isinstance(high_water, bool):
        raise BackendUnavailable("server answer lacks 'high_water'")
    return high_water


def dense_tokens_from(doc: Any) -> bool:
    """Whether the server's grants are dense (absent: a server from before the field, whose always are)."""
    value = doc.get("dense_tokens", True) if isinstance(doc, dict) else True
    if not isinstance(value, bool):
        raise BackendUnavailable("server sent a malformed dense_tokens flag")
    return value


def cluster_id_from(doc: Any) -> str:
    try:
        return validate_cluster_id(doc.get("cluster_id") if isinstance(doc, dict) else None, "cluster_id")
    except InvalidArgument as exc:
        raise BackendUnavailable("server sent a malformed cluster id") from exc
