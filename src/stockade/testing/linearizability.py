"""Linearizability of the fenced register (Wing–Gong–Lowe, as Porcupine does it).

The model is one fenced store scope: a high-water mark and a value per key::

    write(token t, key k, value v):  t >= hwm -> hwm := t, k := v, returns "ok"
                                     t <  hwm -> nothing changes,   returns "stale"
    read(k)                       -> the value of k (None if never written)
    restore(hwm, values)          -> the state becomes the restored one

A history is linearizable when every operation can be given one instant
inside its real-time interval so that the sequence of instants replays on
the model with the observed results. Scopes share nothing, so each scope is
checked alone (P-compositionality).

- ``ok`` writes must return ``"ok"``, stale rejections (``fail`` with
  ``error: "stale-token"``) must return ``"stale"``; other ``fail`` writes
  (wrong scope or cluster) do not touch the model and are dropped.
- ``info`` operations (outcome unknown) have no end: they may take effect at
  any instant after their invocation, or never. Writes a restore lists as
  rolled back are treated as ``info``, and may take effect once more after
  the restore (the restore forgot their idempotency keys, so a late copy of
  the request applies again).
- ``restore`` nemesis records set the state of each scope they name, from
  ``value["high_water"]`` and ``value["values"]``.

The search is WGL with Lowe's memoisation of (linearised set, state), with
two reductions that keep unknown writes from exploding the search, both
sound for this model:

1. An ``info`` write whose value no read ever saw, and whose token could not
   explain any stale rejection completing after its invocation, is removed:
   any linearisation that uses it also works without it.
2. Once the model's high-water mark passes an ``info`` write's token, that
   write is a no-op now and forever (the mark never falls): it is linearised
   at once, and never branched on.

`check_linearizable` returns a `LinearizabilityResult` whose violations name
the operation that cannot be placed and the ones that make it impossible.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from stockade.testing.checkers import STALE_ERRORS, Violation
from stockade.testing.history import INFINITY_NS, Op, pair

__all__ = ["LinearizabilityResult", "check_linearizable", "DEFAULT_STEPS_MAX"]

#: Search steps per scope before the checker gives up and reports the scope undecided.
DEFAULT_STEPS_MAX = 2_000_000

_WRITE, _READ, _RESTORE = 0, 1, 2
_OK, _STALE, _UNKNOWN = 0, 1, 2


@dataclass
class LinearizabilityResult:
    """Per-scope verdicts.

    Attributes:
        violations: one per non-linearizable scope, naming the offending operations.
        undecided: scopes whose search ran out of ``steps_max`` (neither proven nor refuted).
        operations: operations checked (after dropping those that cannot matter).
        steps: search steps taken over all scopes.
    """

    violations: list[Violation] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    operations: int = 0
    steps: int = 0
    scopes: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass(slots=True)
class _MOp:
    kind: int
    invoke: float
    complete: float
    key: int = 0
    token: int = 0
    value: Any = None
    result: int = _UNKNOWN
    restore_state: tuple[int, tuple[Any, ...]] | None = None
    source: Op | None = None
    label: str = ""


def _restores(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, int, dict[str, Any]]]]:
    found: dict[str, list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
    for record in records:
        if record.get("process") == "nemesis" and record.get("f") == "restore":
            value = record.get("value") or {}
            high = value.get("high_water", {})
            values = value.get("values", {})
            for scope in set(high) | set(values):
                found[scope].append((record["t_ns"], high.get(scope, 0), values.get(scope, {})))
    return found


def check_linearizable(
    records: list[dict[str, Any]],
    *,
    steps_max: int = DEFAULT_STEPS_MAX,
    initial: dict[str, dict[Any, Any]] | None = None,
) -> LinearizabilityResult:
    """Check that each scope of a history behaves as one fenced register.

    Args:
        records: history records (dicts); acquires, renews and releases are ignored.
        steps_max: search budget per scope; a scope that exhausts it is reported undecided.
        initial: values present before the history began, ``{scope: {key: value}}``.

    Returns:
        A `LinearizabilityResult`.
    """
    ops = pair(records)
    rolled_back: dict[Any, list[int]] = defaultdict(list)
    for record in records:
        if record.get("process") == "nemesis" and record.get("f") == "restore":
            for key in (record.get("value") or {}).get("rolled_back", ()):
                rolled_back[key].append(record["t_ns"])
    by_scope: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.f in ("write", "read") and op.scope is not None:
            by_scope[op.scope].append(op)
    restores = _restores(records)
    result = LinearizabilityResult()
    for scope in sorted(set(by_scope) | set(restores)):
        verdict = _check_scope(scope, by_scope.get(scope, []), restores.get(scope, []), rolled_back,
                               (initial or {}).get(scope, {}), steps_max, result)
        if verdict is not None:
            result.violations.append(verdict)
    return result


def _model_ops(
    ops: list[Op], restores: list[tuple[int, int, dict[str, Any]]], rolled_back: dict[Any, list[int]],
    keys: dict[Any, int],
) -> list[_MOp]:
    def key_index(key: Any) -> int:
        if key not in keys:
            keys[key] = len(keys)
        return keys[key]

    model: list[_MOp] = []
    for op in ops:
        if op.f == "read":
            if op.type != "ok":
                continue  # an unanswered read constrains nothing
            model.append(_MOp(_READ, op.invoke_ns, op.complete_ns, key=key_index(op.key), value=op.value, source=op))
            continue
        if op.token is None:
            continue
        if op.type == "ok":
            outcome = _OK
        elif op.type == "fail":
            if op.error not in STALE_ERRORS:
                continue  # wrong scope/cluster and input errors never touch the model
            outcome = _STALE
        else:
            outcome = _UNKNOWN
        complete = op.complete_ns
        undone = rolled_back.get(op.idempotency_key, ()) if op.idempotency_key is not None else ()
        if undone:
            outcome = _UNKNOWN
        if outcome == _UNKNOWN:
            complete = INFINITY_NS
        model.append(_MOp(_WRITE, op.invoke_ns, complete, key=key_index(op.key), token=op.token,
                          value=op.value, result=outcome, source=op))
        for t_ns in undone:
            # A restore forgot this write and its idempotency key: a late copy of the request
            # may apply it again after the restore (P6 counts that once; so must we).
            model.append(_MOp(_WRITE, max(t_ns, op.invoke_ns), INFINITY_NS, key=key_index(op.key), token=op.token,
                              value=op.value, result=_UNKNOWN, source=op))
    for t_ns, high, values in restores:
        for key in values:
            key_index(key)
        model.append(_MOp(_RESTORE, t_ns, t_ns, restore_state=(high, values), label=f"restore at t={t_ns}"))  # type: ignore[arg-type]
    return model


def _reduce(model: list[_MOp]) -> list[_MOp]:
    """Drop unknown writes that no observation depends on (reduction 1)."""
    observed = {(m.key, m.value) for m in model if m.kind == _READ}
    stale = [m for m in model if m.kind == _WRITE and m.result == _STALE]
    kept = []
    for m in model:
        if m.kind == _WRITE and m.result == _UNKNOWN and (m.key, m.value) not in observed:
            if not any(s.token < m.token and s.complete > m.invoke for s in stale):
                continue
        kept.append(m)
    return kept


def _check_scope(
    scope: str,
    ops: list[Op],
    restores: list[tuple[int, int, dict[str, Any]]],
    rolled_back: dict[Any, list[int]],
    initial: dict[Any, Any],
    steps_max: int,
    result: LinearizabilityResult,
) -> Violation | None:
    keys: dict[Any, int] = {}
    for key in initial:
        keys.setdefault(key, len(keys))
    model = _reduce(_model_ops(ops, restores, rolled_back, keys))
    for m in model:
        if m.kind == _RESTORE:
            high, values = m.restore_state  # type: ignore[misc]
            vals = [None] * len(keys)
            for key, value in values.items():  # type: ignore[union-attr]
                vals[keys[key]] = value
            m.restore_state = (high, tuple(vals))
    result.scopes += 1
    result.operations += len(model)
    if not model:
        return None
    start = [None] * len(keys)
    for key, value in initial.items():
        start[keys[key]] = value
    # The greedy no-op rule needs a high-water mark that never falls: a restore below
    # an earlier token (only a broken restore does that) switches it off.
    top_before_restore = True
    for m in model:
        if m.kind == _RESTORE:
            earlier = max((w.token for w in model if w.kind == _WRITE and w.invoke < m.invoke), default=0)
            if m.restore_state[0] < earlier:  # type: ignore[index]
                top_before_restore = False
    outcome, steps, deepest = _search(model, (0, tuple(start)), steps_max, greedy=top_before_restore)
    result.steps += steps
    if outcome is None:
        result.undecided.append(scope)
        return None
    if outcome:
        return None
    return _explain(scope, model, deepest, keys)


def _search(
    model: list[_MOp], init: tuple[int, tuple[Any, ...]], steps_max: int, *, greedy: bool
) -> tuple[bool | None, int, tuple[int, int, tuple[int, tuple[Any, ...]]] | None]:
    """WGL over a doubly linked list of call/return entries, backed by arrays."""
    n = len(model)
    entries = []
    for i, m in enumerate(model):
        entries.append((m.invoke, 0, i))
        entries.append((m.complete, 1, i))
    entries.sort(key=lambda e: (e[0], e[1]))
    # Op ids follow call order, so every op below the first call in the list is linearised.
    order: dict[int, int] = {}
    for _, kind, i in entries:
        if kind == 0:
            order[i] = len(order)
    ops = [model[i] for i in sorted(order, key=order.__getitem__)]
    size = 2 * n
    head = size
    is_call = [False] * (size + 1)
    op_of = [0] * (size + 1)
    match = [0] * (size + 1)
    nxt = [-1] * (size + 1)
    prv = [-1] * (size + 1)
    call_entry: dict[int, int] = {}
    for position, (_, kind, i) in enumerate(entries):
        op_id = order[i]
        op_of[position] = op_id
        if kind == 0:
            is_call[position] = True
            call_entry[op_id] = position
        else:
            match[call_entry[op_id]] = position
    previous = head
    for position in range(size):
        nxt[previous] = position
        prv[position] = previous
        previous = position
    nxt[previous] = -1

    def lift(e: int) -> None:
        for x in (e, match[e]):
            nxt[prv[x]] = nxt[x]
            if nxt[x] != -1:
                prv[nxt[x]] = prv[x]

    def unlift(e: int) -> None:
        for x in (match[e], e):
            nxt[prv[x]] = x
            if nxt[x] != -1:
                prv[nxt[x]] = x

    state = init
    linearized = 0
    stack: list[tuple[int, tuple[int, tuple[Any, ...]], bool]] = []
    cache: set[tuple[int, int, tuple[int, tuple[Any, ...]]]] = set()
    deepest: tuple[int, int, tuple[int, tuple[Any, ...]]] | None = None
    steps = 0
    entry = nxt[head]

    def backtrack() -> int | None:
        nonlocal state, linearized
        while stack:
            e, previous_state, forced = stack.pop()
            state = previous_state
            linearized &= ~(1 << op_of[e])
            unlift(e)
            if not forced:
                return nxt[e]
        return None

    while nxt[head] != -1:
        steps += 1
        if steps > steps_max:
            return None, steps, deepest
        if entry != -1 and is_call[entry]:
            m = ops[op_of[entry]]
            hwm, vals = state
            forced = False
            if m.kind == _WRITE:
                if m.token >= hwm:
                    valid = m.result != _STALE
                    new_state = (m.token, vals[: m.key] + (m.value,) + vals[m.key + 1 :])
                else:
                    valid = m.result != _OK
                    new_state = state
                    forced = greedy and m.result == _UNKNOWN
            elif m.kind == _READ:
                valid = vals[m.key] == m.value
                new_state = state
            else:
                valid = True
                new_state = m.restore_state  # type: ignore[assignment]
            if valid:
                new_linearized = linearized | (1 << op_of[entry])
                lift(entry)
                first = nxt[head]
                base = op_of[first] if first != -1 else len(ops)
                key = (base, new_linearized >> base, new_state)
                if key not in cache:
                    cache.add(key)
                    stack.append((entry, state, forced))
                    state = new_state
                    linearized = new_linearized
                    entry = nxt[head]
                    continue
                unlift(entry)
                if forced:
                    resumed = backtrack()
                    if resumed is None:
                        return False, steps, _remap(deepest, ops)
                    entry = resumed
                    continue
            entry = nxt[entry]
        else:
            # A return entry (or the end): its operation had to be placed by now and was not.
            if entry != -1 and (deepest is None or len(stack) > deepest[0]):
                deepest = (len(stack), op_of[entry], state)
            resumed = backtrack()
            if resumed is None:
                deepest = _remap(deepest, ops)
                return False, steps, deepest
            entry = resumed
    return True, steps, None


def _remap(deepest: Any, ops: list[_MOp]) -> Any:
    if deepest is None:
        return None
    depth, op_id, state = deepest
    return depth, ops[op_id], state


def _explain(scope: str, model: list[_MOp], deepest: Any, keys: dict[Any, int]) -> Violation:
    names = {index: key for key, index in keys.items()}
    if deepest is None:
        return Violation("linearizability", f"scope {scope!r}: no linearization exists")
    depth, blocked, (hwm, vals) = deepest
    culprits: list[Op] = []
    if blocked.kind == _WRITE and blocked.result == _OK and blocked.token < hwm:
        # Who raised the mark past this token before it was invoked? That write makes it stale.
        higher = [m for m in model if m.kind == _WRITE and m.result == _OK and m.token > blocked.token
                  and m.complete < blocked.invoke]
        if not higher:
            higher = [m for m in model if m.kind == _WRITE and m.result != _STALE and m.token == hwm]
        if higher:
            culprit = max(higher, key=lambda m: m.token)
            culprits.append(culprit.source)  # type: ignore[arg-type]
        message = (f"scope {scope!r}: stale write accepted: token {blocked.token} acknowledged although "
                   f"token {hwm} was accepted before it")
    elif blocked.kind == _WRITE and blocked.result == _STALE:
        message = (f"scope {scope!r}: write with token {blocked.token} rejected as stale, but no higher token "
                   f"can have been accepted before it (high-water {hwm})")
    elif blocked.kind == _READ:
        key = names.get(blocked.key)
        expected = vals[blocked.key] if blocked.key < len(vals) else None
        writers = [
            m for m in model if m.kind == _WRITE and m.key == blocked.key and m.value in (blocked.value, expected)
        ]
        culprits += [m.source for m in writers if m.source is not None][:2]
        message = (f"scope {scope!r}: read of {key!r} returned {blocked.value!r}, which no order of the "
                   f"writes allows (the model had {expected!r})")
    else:
        message = f"scope {scope!r}: operation cannot be linearized"
    ops = []
    if blocked.source is not None:
        ops.append(blocked.source)
    ops += [c for c in culprits if c is not None and c is not blocked.source]
    return Violation(
        "linearizability",
        message + f" (longest linearizable prefix: {depth} operations)",
        tuple(op.describe() for op in ops),
        tuple(op.invoke_index for op in ops),
    )
