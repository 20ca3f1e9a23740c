"""What the sync and async Redis fences share without I/O of their own (`stockade.resources.redis`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stockade.core.errors import BackendUnavailable, InvalidArgument, InvariantViolation
from stockade.core.limits import validate_int, validate_scope, validate_value
from stockade.core.tokens import FencingToken
from stockade.resources._verify import check_keys_given
from stockade.resources.redis import _script as script
from stockade.resources.redis._batch import PX_MS_MAX, Commands, FenceCore, scoped_key

try:
    import redis as redis_py
    from redis.cluster import RedisCluster
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError("stockade.resources.redis needs redis-py: pip install 'stockade[redis]'") from error

#: How many keys a handle remembers as checked (`_FenceBase._set_call`); past it, it starts again.
CHECKED_KEYS_MAX = 1024
#: The code of the errors the script's first pass reports before any write: Redis would refuse a command
#: of the batch (its data's type, an integer it cannot read or that would overflow), so nothing is applied.
_REFUSED_BY_SCRIPT = "FENCEBATCH"
#: The code the script answers with if a command fails all the same after a write: a bug in its first pass.
_PARTIAL = "FENCEPARTIAL"



def _translate(error: Exception, resource: str) -> Exception:
    """A redis-py error as stockade's: the user's data refused the batch, or Redis failed."""
    text = str(error)
    if isinstance(error, redis_py.ResponseError) and text.startswith(_REFUSED_BY_SCRIPT):
        return InvalidArgument("batch", f"refused by {resource}, nothing applied: {text}")
    if isinstance(error, redis_py.ResponseError) and text.startswith(_PARTIAL):
        return InvariantViolation(f"{resource}: a fenced batch failed halfway, its first pass missed it: {text}")
    return BackendUnavailable(f"{resource}: {text}")


def _resource_name(client: Any) -> str:
    if isinstance(client, RedisCluster) or not hasattr(client, "connection_pool"):
        node = client.get_default_node() if hasattr(client, "get_default_node") else None
        return f"redis-cluster:{getattr(node, 'host', '?')}:{getattr(node, 'port', '?')}"
    kwargs = getattr(client.connection_pool, "connection_kwargs", {})
    if "path" in kwargs:
        return f"redis:unix:{kwargs['path']}/{kwargs.get('db', 0)}"
    return f"redis:{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


class _Batch:
    """The buffered commands of one fenced unit; applied at the end of its ``with`` block."""

    def __init__(self, token: FencingToken, scope: str | None, value_bytes_max: int) -> None:
        self.token = token
        self._commands = Commands(scope, value_bytes_max=value_bytes_max)
        #: The commands' results in order (True for SET, ints for DEL/HSET/INCRBY, ids for XADD),
        #: set when the batch was applied.
        self.results: list[Any] = []

    @property
    def scope(self) -> str | None:
        """The batch's scope: named at its opening, or the hash tag of its first key."""
        return self._commands.scope

    def set(self, key: str, value: bytes | str, *, px_ms: int | None = None) -> None:
        """Buffer ``SET key value [PX px_ms]``."""
        self._commands.set(key, value, px_ms=px_ms)

    def delete(self, key: str) -> None:
        """Buffer ``DEL key`` (its result: 1 if the key existed)."""
        self._commands.delete(key)

    def hset(self, key: str, mapping: Mapping[str, bytes | str]) -> None:
        """Buffer ``HSET key field value ...`` (its result: how many fields were new)."""
        self._commands.hset(key, mapping)

    def incrby(self, key: str, amount: int) -> None:
        """Buffer ``INCRBY key amount`` (its result: the new value)."""
        self._commands.incrby(key, amount)

    def xadd(self, key: str, fields: Mapping[str, bytes | str], *, maxlen: int | None = None) -> None:
        """Buffer ``XADD key [MAXLEN ~ maxlen] * field value ...`` (its result: the entry's id)."""
        self._commands.xadd(key, fields, maxlen=maxlen)

    def _buffered(self, key: str) -> tuple[bool, bytes | None]:
        key = self._commands.check_key(key)
        if key not in self._commands.written:
            return False, None
        value = self._commands.written[key]
        if value is ...:
            raise InvalidArgument("key", f"{key!r} has a buffered HSET, INCRBY or XADD: read it after the batch")
        return True, value


class _FenceBase(FenceCore):
    def __init__(self, client: Any, *, keys: object, cluster_id: str | None, value_bytes_max: int) -> None:
        check_keys_given(keys)  # L2: None never means unsigned
        super().__init__(keys=keys, cluster_id=cluster_id, value_bytes_max=value_bytes_max,
                         resource=_resource_name(client))
        self.client = client
        self._cluster = isinstance(client, RedisCluster)
        self._write = client.register_script(script.FENCED_WRITE)
        self._set = client.register_script(script.FENCED_SET)
        self._raise = client.register_script(script.RAISE_MARKS)
        self._read = client.register_script(script.READ_CHECKED)
        #: The keys `_set_call` found good: each one's scope and `FENCED_SET`'s KEYS for it (a key checked once).
        self._checked_keys: dict[str, tuple[str, tuple[bytes, ...]]] = {}

    def _open(self, token: object, scope: str | None) -> tuple[FencingToken, str | None]:
        return self._tokens.check(token)[0], None if scope is None else validate_scope(scope)

    def _single(self, token: object) -> tuple[FencingToken, Commands]:
        # One command: a batch of one, without the context manager (the common, fast path).
        # The token validated as `coerce_token` does, from the memory of tokens that verified when it is there.
        return self._tokens.check(token)[0], Commands(None, value_bytes_max=self.value_bytes_max)

    def _set_call(self, token: object, key: object, value: object, px_ms: int | None
                  ) -> tuple[FencingToken, str | None, str, tuple[bytes, ...], list[bytes]]:
        """One SET's checked token, why it is forged (None: it verified), its scope, and `FENCED_SET`'s KEYS
        and ARGV: what a batch of that one SET checks, without building the batch (the hot path).

        Raises:
            InvalidArgument: a bad token, value, PX or key (nothing is sent).
        """
        checked, why = self._tokens.check(token)
        data = validate_value(value, self.value_bytes_max)
        # Bytes, each of them: redis-py then sends them as they are (its encoding of a str costs a write ~6 us).
        args = [b"%d" % checked.value, (self._compare + self.memory).encode(), data]
        if px_ms is not None:
            args.append(b"%d" % validate_int("px_ms", px_ms, 1, PX_MS_MAX))
        known = self._checked_keys.get(key) if type(key) is str else None
        if known is None:
            key, scope = scoped_key(key, None)
            known = scope, (*script.set_keys(scope, self._cluster), key.encode())
            if len(self._checked_keys) >= CHECKED_KEYS_MAX:
                self._checked_keys.clear()
            self._checked_keys[key] = known
        return checked, why, known[0], known[1], args

    def _info_call(self) -> Any:
        """``INFO memory`` of the server, or of every primary of a cluster (a dict per node)."""
        if self._cluster:
            return self.client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        return self.client.info("memory")


def _policy_unread(error: Exception, resource: str) -> Exception:
    """The eviction policy could not be read: say why the fence needs it when the user may not run INFO."""
    if isinstance(error, redis_py.exceptions.NoPermissionError):
        return BackendUnavailable(f"{resource}: a fence reads INFO memory before it writes, to make sure Redis cannot "
                                  f"evict its marks (maxmemory-policy), and this user may not: grant it +info "
                                  f"(docs/fence-redis.md)", certain_no_effect=True)
    return _translate(error, resource)


def _infos(answer: Any) -> list[Any]:
    """The ``INFO memory`` answers, one per server, from one server's or from a cluster's (keyed by node)."""
    if isinstance(answer, Mapping) and "maxmemory_policy" not in answer:
        return list(answer.values())
    return [answer]


