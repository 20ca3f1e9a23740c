"""The part of `stockade.resources.redis` that does no I/O: checking commands, encoding, judging replies.

`RedisFence` and `AsyncRedisFence` share it, so the two differ only in
``await``. A batch buffers validated commands (`Commands`); committing it is
one call of `stockade.resources.redis._script.FENCED_WRITE` whose KEYS and
ARGV `Commands.script_call` builds and whose reply `FenceCore.judge` turns
into results, or into a rejection through `stockade.resources._observe.reject`
(R5: counted, logged, typed).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import EllipsisType
from typing import Any, Final

import stockade.keys
from stockade.core.errors import BackendUnavailable, InvalidArgument
from stockade.core.fence import Reject, decide
from stockade.core.limits import (
    TOKEN_VALUE_MAX,
    TX_WRITES_MAX,
    VALUE_BYTES_MAX,
    validate_int,
    validate_key,
    validate_scope,
    validate_value,
)
from stockade.core.tokens import FencingToken
from stockade.core.values import FenceFloors
from stockade.resources._inputs import check_floors_and_default
from stockade.resources._observe import reject
from stockade.resources._verified_tokens import VerifiedTokens
from stockade.resources._verify import UNSIGNED, Verification, refuse_unsigned_after_signed
from stockade.resources.redis import _script as script

__all__ = ["Commands", "FenceCore", "ARGS_PER_COMMAND_MAX", "INCREMENT_MAX", "SCAN_SCOPES_MAX", "EVICTION_CHECK_NS",
           "EVICTING_POLICIES", "as_bytes"]

ARGS_PER_COMMAND_MAX: Final = 1000  # arguments of one command (Lua's unpack has a stack limit)
INCREMENT_MAX: Final = 2**62  # |INCRBY amount|; the script refuses a sum past signed 64 bits, as Redis does
PX_MS_MAX: Final = 2**46  # a SET's PX, about 2,000 years
SCAN_SCOPES_MAX: Final = 100_000  # marks `high_waters` lists before it refuses
#: How often a fence reads Redis's eviction policy again before a write (an operator can change it any time).
EVICTION_CHECK_NS: Final = 10_000_000_000
#: The ``maxmemory-policy`` values under which Redis may evict a key that has no expiry, a mark among them.
#: A mark evicted reads as none, and a stale token would then write (R1): a fence refuses to write there.
#: ``noeviction`` and the ``volatile-*`` policies evict no mark (marks never expire).
EVICTING_POLICIES: Final = frozenset({"allkeys-lru", "allkeys-lfu", "allkeys-random"})


def as_bytes(value: object) -> bytes | None:
    """A Redis reply as bytes (clients opened with ``decode_responses=True`` answer str)."""
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def scoped_key(key: object, scope: str | None) -> tuple[str, str]:
    """``key`` and its scope, if it carries ``scope`` as its hash tag (None: the key's tag names the scope).

    Raises:
        InvalidArgument: a bad key, a fence mark's, or one outside the scope's hash slot.
    """
    key = validate_key(key)
    if key.startswith((script.HWM_PREFIX, script.FLOOR_PREFIX, script.VERIFIED_KEY)):
        raise InvalidArgument("key", f"{key!r} is a fence mark: only the fence writes it")
    tag = script.key_tag(key)
    if scope is None:
        if tag is None:
            raise InvalidArgument("key", f"{key!r} has no hash tag: a fenced key carries {{scope}}")
        scope = validate_scope(tag)
    if tag != scope:
        raise InvalidArgument("key", f"{key!r} is not in scope {scope!r}: its hash tag must be {{{scope}}}")
    return key, scope


class Commands:
    """The commands of one batch, checked as they are added; nothing is sent until `script_call`.

    The batch's scope is the one named at its opening, else the hash tag of its
    first key; every key must carry ``{scope}`` as its hash tag, so all of them,
    and the scope's mark, share one Redis Cluster slot.
    """

    def __init__(self, scope: str | None, *, value_bytes_max: int) -> None:
        self.scope = None if scope is None else validate_scope(scope)
        self.value_bytes_max = value_bytes_max
        self.keys: list[str] = []
        self._key_index: dict[str, int] = {}
        self.args: list[str | bytes] = []
        self.kinds: list[str] = []
        #: key -> the bytes a SET left (None: deleted) or ... (another command made it unknown).
        self.written: dict[str, bytes | None | EllipsisType] = {}

    def __len__(self) -> int:
        return len(self.kinds)

    def check_key(self, key: object) -> str:
        """``key`` if it carries the batch's scope as its hash tag (the first key names the scope).

        Raises:
            InvalidArgument: a bad key, or one outside the scope's hash slot.
        """
        key, self.scope = scoped_key(key, self.scope)
        return key

    def _add(self, kind: str, key: object, args: list[str | bytes]) -> str:
        if len(self.kinds) >= TX_WRITES_MAX:
            raise InvalidArgument("batch", f"holds at most {TX_WRITES_MAX} commands")
        if len(args) > ARGS_PER_COMMAND_MAX:
            raise InvalidArgument("batch", f"a command takes at most {ARGS_PER_COMMAND_MAX} arguments")
        key = self.check_key(key)
        index = self._key_index.setdefault(key, len(self.keys) + 4)  # KEYS[1..3]: mark, floor, memory
        if index == len(self.keys) + 4:
            self.keys.append(key)
        self.args += [kind, str(index), str(len(args)), *args]
        self.kinds.append(kind)
        return key

    def set(self, key: object, value: object, *, px_ms: int | None = None) -> None:
        data = validate_value(value, self.value_bytes_max)
        extra: list[str | bytes] = [] if px_ms is None else ["PX", str(validate_int("px_ms", px_ms, 1, PX_MS_MAX))]
        self.written[self._add("SET", key, [data, *extra])] = data

    def delete(self, key: object) -> None:
        self.written[self._add("DEL", key, [])] = None

    def hset(self, key: object, mapping: object) -> None:
        if not isinstance(mapping, Mapping) or not mapping:
            raise InvalidArgument("mapping", "must be a non-empty mapping of field to value")
        args: list[str | bytes] = []
        for field, value in mapping.items():
            args += [validate_key(field), validate_value(value, self.value_bytes_max)]
        self.written[self._add("HSET", key, args)] = ...

    def incrby(self, key: object, amount: object) -> None:
        by = validate_int("amount", amount, -INCREMENT_MAX, INCREMENT_MAX)
        self.written[self._add("INCRBY", key, [str(by)])] = ...

    def xadd(self, key: object, fields: object, *, maxlen: int | None = None) -> None:
        if not isinstance(fields, Mapping) or not fields:
            raise InvalidArgument("fields", "must be a non-empty mapping of field to value")
        args: list[str | bytes] = []
        if maxlen is not None:
            args += ["MAXLEN", "~", str(validate_int("maxlen", maxlen, 1, TOKEN_VALUE_MAX))]
        # An id Redis picks fails only on a stream at its last id, which the script's first pass checks.
        # The entry stays far below Redis's 1 GiB (ARGS_PER_COMMAND_MAX values of at most 1 MiB each).
        args.append("*")
        for field, value in fields.items():
            args += [validate_key(field), validate_value(value, self.value_bytes_max)]
        self.written[self._add("XADD", key, args)] = ...

    def script_call(self, token: FencingToken, compare: str, memory: str, cluster: bool
                    ) -> tuple[list[str], list[str | bytes]]:
        """KEYS and ARGV of `FENCED_WRITE` for this batch under ``token`` (``memory``: `script.MEMORY_MODES`)."""
        assert self.scope is not None
        keys = [*script.mark_keys(self.scope), script.verified_key(self.scope, cluster), *self.keys]
        return keys, [str(token.value), compare, memory, *self.args]


class FenceCore:
    """What both fences hold and decide without I/O: verification, the seams, the mapping of replies."""

    #: The Python half of the rule: MAC first, then R2 (cluster, scope) with `decide`;
    #: the script does R1. A control swaps this and `_compare` together.
    fence_rule = staticmethod(decide)

    def __init__(self, *, keys: object, cluster_id: str | None, value_bytes_max: int, resource: str) -> None:
        self._verification = Verification()
        if cluster_id is None:
            cluster_id = getattr(keys, "cluster_id", None)
            if not isinstance(cluster_id, str):
                raise InvalidArgument("cluster_id", "is required unless keys= carries it")
        self._verification.use_keys(keys, cluster_id)
        #: The tokens that passed the MAC check, remembered (`stockade.resources._verified_tokens` says for how long).
        self._tokens = VerifiedTokens(self._verification)
        self.cluster_id = cluster_id
        self.value_bytes_max = validate_int("value_bytes_max", value_bytes_max, 0, VALUE_BYTES_MAX)
        self.resource = resource
        #: The script's comparison (`_redis_script.COMPARE_MODES`): private, for the controls only.
        self._compare = "ge"
        #: The last (token, scope, rule) `rule_passes` passed.
        self._rule_passed: tuple[FencingToken, str, Any] | None = None
        #: When the eviction policy was last read and found safe (`policy_due`), monotonic ns.
        self._policy_read_ns: int | None = None
        #: Whether the cluster-wide memory of verifying (`script.VERIFIED_KEY`) was written or checked: on
        #: Redis Cluster, before a handle's first write (each slot's own, the script checks on every write).
        self._memory_seen = False

    def admit(self, token: FencingToken, scope: str, high_water: int) -> None:
        """Refuse, before any script runs, a token the keys do not verify or of another cluster or scope.

        ``high_water`` is the mark to report (read only on the way to a rejection).
        """
        why = self._verification.forged(token)
        if why is not None:
            self.refuse(token, scope, Reject("forged", high_water, why))
        decision = self.fence_rule(token, cluster=self.cluster_id, scope=scope, high_water=0)
        if isinstance(decision, Reject) and decision.reason != "stale":
            self.refuse(token, scope, Reject(decision.reason, high_water, decision.detail))

    def policy_due(self, now_ns: int) -> bool:
        """Whether the eviction policy must be read before the next write (never read, or `EVICTION_CHECK_NS` ago)."""
        return self._policy_read_ns is None or now_ns - self._policy_read_ns >= EVICTION_CHECK_NS

    def judge_policy(self, infos: list[Any], now_ns: int) -> None:
        """Refuse to write when a server's ``INFO memory`` shows a policy that may evict a mark; else note the read.

        Raises:
            BackendUnavailable: an evicting ``maxmemory-policy`` (``certain_no_effect``: nothing was sent).
        """
        for info in infos:
            policy = _text(info.get("maxmemory_policy", b"")) if isinstance(info, Mapping) else ""
            if policy in EVICTING_POLICIES:
                raise BackendUnavailable(
                    f"{self.resource}: maxmemory-policy is {policy}, which may evict the fence's marks; an evicted "
                    f"mark reads as none and would let a stale token write. Use noeviction or a volatile-* policy "
                    f"(docs/fence-redis.md)", certain_no_effect=True)
        self._policy_read_ns = now_ns

    def premise(self, token: FencingToken, scope: str) -> bool:
        """Whether `admit` would pass without needing the mark (the common path: no extra read)."""
        return self._tokens.check(token)[1] is None and self.rule_passes(token, scope)

    def rule_passes(self, token: FencingToken, scope: str) -> bool:
        """Whether the rule's cluster and scope checks (R2) pass ``token`` (its MAC is `premise`'s).

        The last pass is remembered with its token, scope and rule: under one lease the next write asks the
        same question of the same token (the one object `VerifiedTokens` keeps), and the rule is a function
        of them alone.
        """
        rule, passed = self.fence_rule, self._rule_passed
        if passed is not None and passed[0] is token and passed[1] == scope and passed[2] is rule:
            return True
        decision = rule(token, cluster=self.cluster_id, scope=scope, high_water=0)
        if isinstance(decision, Reject) and decision.reason != "stale":
            return False
        self._rule_passed = (token, scope, rule)
        return True

    def refuse(self, token: FencingToken, scope: str, decision: Reject, key: str | None = None) -> None:
        reject(decision, resource=self.resource, cluster=self.cluster_id, token=token, scope=scope, key=key)

    @property
    def memory(self) -> str:
        """The script's part in L2 (`script.MEMORY_MODES`) for this handle."""
        if self._verification.verifies:
            return "v"
        return "u" if self._verification.verifier is None and not stockade.keys.LEGACY_NONE_MEANS_UNSIGNED else "-"

    def judge(self, token: FencingToken, commands: Commands, reply: Any) -> list[Any]:
        """The results of the batch's commands from the script's reply, or the rejection it reports.

        Raises:
            InvalidArgument: this handle is unsigned and Redis remembers verifying (L2; nothing written).
        """
        assert commands.scope is not None
        self.judge_status(token, commands.scope, reply)
        results: list[Any] = []
        for kind, value in zip(commands.kinds, reply[2:], strict=True):
            if kind == "SET":
                results.append(True)
            elif kind == "INCRBY":
                results.append(int(_text(value)))
            elif kind == "XADD":
                results.append(_text(value))
            else:
                results.append(int(value))
        return results

    def judge_status(self, token: FencingToken, scope: str, reply: Any) -> None:
        """Raise the rejection a script's reply reports ({0, mark} stale, {2, mark} L2), if it reports one."""
        status = int(reply[0])
        if status == 2:
            refuse_unsigned_after_signed(self.resource, True, UNSIGNED)
        if status == 0:
            self.refuse(token, scope, Reject("stale", int(_text(reply[1]))))

    def judge_read(self, token: FencingToken, scope: str, key: str, reply: Any) -> bytes | None:
        """A batch's checked read: the value, or the rejection if the mark already passed the token."""
        mark = max(int(_text(reply[0])), int(_text(reply[1])))
        decision = self.fence_rule(token, cluster=self.cluster_id, scope=scope, high_water=mark)
        if isinstance(decision, Reject):
            self.refuse(token, scope, decision, key)
        return as_bytes(reply[2])

    @staticmethod
    def floors_call(
        floors: Mapping[str, int] | FenceFloors, default: int, *, every_slot: bool
    ) -> tuple[list[str], list[str], list[str], list[int]]:
        """KEYS and ARGV of `RAISE_MARKS`, the named scopes, and which slots' floors are raised.

        Each named scope brings its own mark (raised to its floor) and its slot's
        floor (raised to ``default``, or only read); ``every_slot`` adds the floor
        of every slot so that scopes never seen are covered.

        Raises:
            InvalidArgument: a bad floor or default (nothing is sent).
        """
        checked, default = check_floors_and_default(floors, default)
        keys: list[str] = []
        args: list[str] = []
        named = sorted(checked)
        for scope in named:
            keys += [script.hwm_key(scope), script.floor_key(scope)]
            args += [str(checked[scope]), str(default)]
        slots = list(range(script.SLOTS)) if every_slot and default > 0 else []
        for slot in slots:
            keys.append(f"{script.FLOOR_PREFIX}{{{script.slot_tag(slot)}}}")
            args.append(str(default))
        return keys, args, named, slots

    @staticmethod
    def marks_after(named: list[str], reply: Any) -> dict[str, int]:
        """Each named scope's mark (own or its slot's floor, the greater) from `RAISE_MARKS`'s reply."""
        return {scope: max(int(_text(reply[2 * i])), int(_text(reply[2 * i + 1]))) for i, scope in enumerate(named)}


def scope_of_mark_key(key: object) -> str | None:
    """The scope whose mark ``key`` holds (from SCAN), or None for another key."""
    text = _text(key)
    if not text.startswith(script.HWM_PREFIX):
        return None
    return script.key_tag(text)
