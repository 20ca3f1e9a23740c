"""A Redis batch is all or nothing by Redis's own rules (issue 26, finding 2).

Redis does not undo a script that fails halfway, so the fenced script runs a
first pass over a model of the keys before its first write, and refuses the
batch wherever Redis would refuse one of its commands. These tests hold that
model to the real redis-server:

- five triggers of the old first pass (two ``INCRBY k 2**62`` in one batch; an
  increment of a stored ``01``, ``-0``, ``007``; an 18-digit value incremented
  past 2**63), each three ways: 0 of 15 batches half-applied, each refused as
  `InvalidArgument` with nothing applied (the control, the script before the
  fix: 15 of 15 half-applied, reported as `BackendUnavailable`);
- a refused batch retried applies once (the control counts twice);
- generated batches over generated data, each run by Redis itself command by
  command on a copy: the fence refuses exactly the batches Redis refuses
  somewhere, and otherwise leaves exactly what Redis leaves;
- a stream at the last possible id, and a command the first pass missed
  (forced by a mutated script) reported as a bug, never as an unknown outcome;
- the shared suite's "partial failure inside a unit" tests
  (`stockade.testing.conformance.fence_partial`) catch the control too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stockade.core.errors import BackendUnavailable, InvalidArgument, InvariantViolation
from stockade.resources.redis import RedisFence
from stockade.resources.redis import _script as script
from stockade.testing.conformance import fence_partial as partial
from stockade.testing.conformance.fence import CLUSTER, KEYS, tok
from stockade.testing.fences.partial import REDIS as REDIS_WAYS
from stockade.testing.fences.redis import make_redis_harness, old_first_pass, redis_state
from stockade.testing.servers.redis import RedisServer, require_redis

LONG = os.environ.get("STOCKADE_LONG") == "1"
GENERATED_BATCHES = 2000 if LONG else 150
BIG = 2**62  # INCREMENT_MAX


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    require_redis()
    started = RedisServer(tmp_path_factory.mktemp("redis-batch"))
    yield started
    started.stop()


@pytest.fixture
def plain(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def fence(server: RedisServer, plain: redis.Redis) -> Iterator[RedisFence]:
    opened = RedisFence.from_url(server.url, keys=KEYS)
    yield opened
    opened.close()


@pytest.fixture
def control(server: RedisServer, plain: redis.Redis) -> Iterator[RedisFence]:
    opened = old_first_pass(RedisFence.from_url(server.url, keys=KEYS))
    yield opened
    opened.close()


# -- the five triggers, three ways each ------------------------------------------------------------------

#: name -> (the counter's value before its increments, the increments): Redis refuses the last one.
TRIGGERS: dict[str, tuple[str, list[int]]] = {
    "two-increments-of-2**62": ("0", [BIG, BIG]),
    "stored-01": ("01", [1]),
    "stored-minus-0": ("-0", [1]),
    "stored-007": ("007", [1]),
    "18-digits-past-2**63": ("999999999999999999", [BIG, BIG]),
}
WAYS = ("set-in-the-batch", "stored-before", "stored-before-after-other-commands")


def _trigger_batch(fence: RedisFence, scope: str, trigger: str, way: str) -> type[Exception]:
    """One batch with a higher token: SET a, then the trigger; the error it raised."""
    value, increments = TRIGGERS[trigger]
    try:
        with fence.batch(tok(5, scope)) as batch:
            batch.set(f"{{{scope}}}:a", b"new")
            if way == "set-in-the-batch":
                batch.set(f"{{{scope}}}:n", value)
            if way == "stored-before-after-other-commands":
                batch.hset(f"{{{scope}}}:h", {"f": b"1"})
                batch.xadd(f"{{{scope}}}:s", {"e": b"1"})
                batch.incrby(f"{{{scope}}}:c", 3)
            for amount in increments:
                batch.incrby(f"{{{scope}}}:n", amount)
    except (InvalidArgument, BackendUnavailable) as error:
        return type(error)
    raise AssertionError(f"{trigger} {way}: Redis accepted the batch")


def _half_applied(fence: RedisFence, plain: redis.Redis) -> tuple[int, int, set[type[Exception]]]:
    """(batches half-applied, batches run, the errors raised) over every trigger and way."""
    half = runs = 0
    errors: set[type[Exception]] = set()
    for t, trigger in enumerate(TRIGGERS):
        for w, way in enumerate(WAYS):
            scope = f"t{t}w{w}"
            fence.set(tok(1, scope), f"{{{scope}}}:a", b"old")  # the mark at 1, a at its old value
            if way != "set-in-the-batch":
                plain.set(f"{{{scope}}}:n", TRIGGERS[trigger][0])
            before = redis_state(plain)
            errors.add(_trigger_batch(fence, scope, trigger, way))
            runs += 1
            half += redis_state(plain) != before
    return half, runs, errors


def test_no_batch_is_half_applied_over_the_five_triggers(fence: RedisFence, plain: redis.Redis) -> None:
    half, runs, errors = _half_applied(fence, plain)
    assert runs >= 15
    assert half == 0, f"{half} of {runs} batches half-applied"
    assert errors == {InvalidArgument}  # refused, nothing applied: never an unknown outcome


def test_control_the_old_first_pass_half_applies_them(control: RedisFence, plain: redis.Redis) -> None:
    half, runs, errors = _half_applied(control, plain)
    assert (half, runs) == (15, 15)
    assert errors == {BackendUnavailable}


def _retried(fence: RedisFence, plain: redis.Redis) -> tuple[bytes | None, list[type[Exception]]]:
    """A batch that counts c by 5 and is refused for ``n = 01``, sent twice; then sent fixed, same token."""
    raised: list[type[Exception]] = []
    for attempt in range(3):
        fixed = attempt == 2
        if fixed:
            plain.set("{r}:n", "1")
        try:
            with fence.batch(tok(5, "r")) as batch:
                batch.incrby("{r}:c", 5)
                if not fixed:
                    batch.set("{r}:n", "01")
                batch.incrby("{r}:n", 1)
        except (InvalidArgument, BackendUnavailable) as error:
            raised.append(type(error))
    return plain.get("{r}:c"), raised


def test_a_refused_batch_retried_applies_once(fence: RedisFence, plain: redis.Redis) -> None:
    counted, raised = _retried(fence, plain)
    assert raised == [InvalidArgument, InvalidArgument]
    assert counted == b"5" and plain.get("{r}:n") == b"2"


def test_control_the_old_first_pass_counts_a_retried_batch_again(control: RedisFence, plain: redis.Redis) -> None:
    counted, raised = _retried(control, plain)
    assert raised == [BackendUnavailable, BackendUnavailable]
    assert counted == b"15"  # 5 per half-applied attempt, 5 for the whole one


# -- generated batches against Redis itself --------------------------------------------------------------

# Strings Redis may or may not read as a 64-bit integer (util.c string2ll): the edges first.
EDGES = ["0", "-0", "00", "01", "-01", "+1", " 1", "1 ", "", "-", "1e3", "0x10", "1.0", "\x001",
         "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
         "09223372036854775807", "18446744073709551615", "99999999999999999999", "-99999999999999999999",
         "999999999999999999", "-999999999999999999", "4611686018427387904", "-4611686018427387904"]
values = st.one_of(
    st.sampled_from(EDGES),
    st.integers(-(2**63) - 3, 2**63 + 3).map(str),
    st.integers(0, 10**19).map(lambda n: "0" + str(n)),
    st.from_regex(r"-?[0-9]{17,21}", fullmatch=True),
    st.text(alphabet="-+0123456789 ", max_size=6),
)
amounts = st.one_of(st.sampled_from([BIG, -BIG, 1, -1, 0, BIG - 1]), st.integers(-BIG, BIG))
KEY_COUNT = 3
commands = st.lists(
    st.one_of(
        st.tuples(st.just("SET"), st.integers(0, KEY_COUNT - 1), values),
        st.tuples(st.just("INCRBY"), st.integers(0, KEY_COUNT - 1), amounts),
        st.tuples(st.just("DEL"), st.integers(0, KEY_COUNT - 1), st.none()),
        st.tuples(st.just("HSET"), st.integers(0, KEY_COUNT - 1), st.none()),
        st.tuples(st.just("XADD"), st.integers(0, KEY_COUNT - 1), st.none()),
    ),
    min_size=1, max_size=8,
)
#: What each key holds before the batch: nothing, a string, a hash, or a stream.
initial = st.lists(st.one_of(st.none(), values, st.just(("hash",)), st.just(("stream",))),
                   min_size=KEY_COUNT, max_size=KEY_COUNT)

Command = tuple[str, int, Any]


def _load(client: redis.Redis, tag: str, start: list[Any]) -> None:
    for index, held in enumerate(start):
        key = f"{{{tag}}}:k{index}"
        if held == ("hash",):
            client.hset(key, "f", "1")
        elif held == ("stream",):
            client.xadd(key, {"e": "1"})
        elif held is not None:
            client.set(key, held)


def _send(target: Callable[..., Any], tag: str, command: Command) -> None:
    name, index, arg = command
    key = f"{{{tag}}}:k{index}"
    if name == "SET":
        target("SET", key, arg)
    elif name == "INCRBY":
        target("INCRBY", key, arg)
    elif name in ("DEL", "HSET"):
        target(*(("DEL", key) if name == "DEL" else ("HSET", key, "f", "2")))
    else:
        target("XADD", key, "*", "e", "2")


def _contents(client: redis.Redis, tag: str) -> list[Any]:
    """Each key as Redis holds it (a stream by its length: its ids follow the clock)."""
    out: list[Any] = []
    for index in range(KEY_COUNT):
        key = f"{{{tag}}}:k{index}"
        kind = client.type(key).decode()
        held = {"string": client.get, "hash": client.hgetall, "stream": client.xlen}.get(kind, lambda k: None)(key)
        out.append((kind, held))
    return out


def disagreement(fence: RedisFence, plain: redis.Redis, start: list[Any], batch: list[Command]) -> str | None:
    """Run ``batch`` on Redis itself, one command at a time on a copy, and as a fenced batch: how they differ."""
    plain.flushall()
    _load(plain, "ref", start)
    _load(plain, "a", start)
    refused = None
    for n, command in enumerate(batch):
        try:
            _send(plain.execute_command, "ref", command)
        except redis.ResponseError as error:
            refused = f"command {n} {command[0]}: {error}"
            break
    before = _contents(plain, "a")
    try:
        with fence.batch(tok(2)) as fenced:
            for name, index, arg in batch:
                key = f"{{a}}:k{index}"
                calls: dict[str, Callable[[], None]] = {
                    "SET": lambda key=key, arg=arg: fenced.set(key, arg),
                    "INCRBY": lambda key=key, arg=arg: fenced.incrby(key, arg),
                    "DEL": lambda key=key: fenced.delete(key),
                    "HSET": lambda key=key: fenced.hset(key, {"f": "2"}),
                    "XADD": lambda key=key: fenced.xadd(key, {"e": "2"}),
                }
                calls[name]()
    except InvalidArgument as error:
        if refused is None:
            return f"the fence refused a batch Redis takes: {error}"
        if _contents(plain, "a") != before or fence.high_water("a") != 0:
            return "refused, yet something was applied"
        return None
    except BackendUnavailable as error:
        return f"outcome unknown ({refused or 'Redis takes it'}): {error}"
    if refused is not None:
        return f"the fence took a batch Redis refuses at {refused}"
    if _contents(plain, "a") != _contents(plain, "ref"):
        return "applied, but not as Redis applies it"
    return None


@settings(max_examples=GENERATED_BATCHES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=initial, batch=commands)
@example(start=[None, None, None], batch=[("SET", 0, "0"), ("INCRBY", 0, BIG), ("INCRBY", 0, BIG)])
@example(start=["01", None, None], batch=[("SET", 1, "x"), ("INCRBY", 0, 1)])
@example(start=["-0", None, None], batch=[("INCRBY", 0, 1)])
@example(start=[None, None, None], batch=[("SET", 1, "x"), ("SET", 0, "007"), ("INCRBY", 0, 1)])
@example(start=["999999999999999999", None, None], batch=[("INCRBY", 0, BIG), ("INCRBY", 0, BIG)])
@example(start=["-9223372036854775808", None, None], batch=[("INCRBY", 0, -1)])
@example(start=["9223372036854775800", None, None], batch=[("INCRBY", 0, 7), ("INCRBY", 0, -BIG)])
@example(start=[("stream",), "1", None], batch=[("INCRBY", 1, 1), ("INCRBY", 0, 1)])
def test_the_first_pass_refuses_exactly_what_redis_refuses(
    fence: RedisFence, plain: redis.Redis, start: list[Any], batch: list[Command]
) -> None:
    assert disagreement(fence, plain, start, batch) is None


def test_control_the_old_first_pass_disagrees_with_redis(control: RedisFence, plain: redis.Redis) -> None:
    cases = [
        ([None, None, None], [("SET", 1, "x"), ("SET", 0, "0"), ("INCRBY", 0, BIG), ("INCRBY", 0, BIG)]),
        (["01", None, None], [("SET", 1, "x"), ("INCRBY", 0, 1)]),
        (["-0", None, None], [("SET", 1, "x"), ("INCRBY", 0, 1)]),
        (["007", None, None], [("SET", 1, "x"), ("INCRBY", 0, 1)]),
        (["999999999999999999", None, None], [("SET", 1, "x"), ("INCRBY", 0, BIG), ("INCRBY", 0, BIG)]),
        (["9223372036854775800", None, None], [("INCRBY", 0, 7)]),  # 19 digits: refused, Redis takes it
    ]
    found = [disagreement(control, plain, start, batch) for start, batch in cases]
    assert all(found), found


# -- streams at their last id, and a first pass that misses ----------------------------------------------

LAST_MS = "18446744073709551615"


def test_xadd_on_a_stream_at_its_last_possible_id_is_refused_whole(fence: RedisFence, plain: redis.Redis) -> None:
    plain.xadd("{a}:full", {"e": "1"}, id=f"{LAST_MS}-{LAST_MS}")
    plain.xadd("{a}:near", {"e": "1"}, id=f"{LAST_MS}-18446744073709551613")  # room for two more ids
    before = redis_state(plain)
    for key, count in (("{a}:full", 1), ("{a}:near", 3)):
        with pytest.raises(InvalidArgument, match="exhausted"):
            with fence.batch(tok(2)) as batch:
                batch.set("{a}:k", b"new")
                for _ in range(count):
                    batch.xadd(key, {"e": "2"})
    assert redis_state(plain) == before
    with fence.batch(tok(2)) as batch:  # two fit; and a deleted stream starts again from 0-0
        batch.xadd("{a}:near", {"e": "2"})
        batch.xadd("{a}:near", {"e": "3"})
        batch.delete("{a}:full")
        batch.xadd("{a}:full", {"e": "2"})
    assert batch.results[1] == f"{LAST_MS}-{LAST_MS}" and plain.xlen("{a}:full") == 1


def test_a_command_the_first_pass_missed_is_reported_as_a_bug_not_an_unknown_outcome(
    fence: RedisFence, plain: redis.Redis
) -> None:
    # A mutated script whose first pass notes a refusal and goes on: Redis refuses HSET in the write pass.
    blind = script.FENCED_WRITE.replace("return refuse(", "refuse(")
    assert blind != script.FENCED_WRITE
    fence._write = fence.client.register_script(blind)
    plain.set("{a}:text", "x")
    with pytest.raises(InvariantViolation, match="FENCEPARTIAL after 1 commands"):
        with fence.batch(tok(2)) as batch:
            batch.set("{a}:k", b"new")
            batch.hset("{a}:text", {"f": b"1"})


def test_values_the_old_first_pass_refused_are_taken_as_redis_takes_them(fence: RedisFence, plain: redis.Redis) -> None:
    plain.set("{a}:n", "9223372036854775800")  # 19 digits
    plain.set("{a}:m", "-9223372036854775807")
    with fence.batch(tok(2)) as batch:
        batch.incrby("{a}:n", 7)
        batch.incrby("{a}:m", -1)
        batch.incrby("{a}:m", BIG)
        batch.incrby("{a}:m", -BIG)
    assert batch.results == [2**63 - 1, -(2**63), -(2**63) + BIG, -(2**63)]
    with pytest.raises(InvalidArgument, match="overflow"):
        fence.incrby(tok(2), "{a}:m", -1)
    assert plain.get("{a}:m") == b"-9223372036854775808"



def test_control_the_conformance_suites_partial_failures_catch_the_old_first_pass(tmp_path: Path) -> None:
    """The suite's refused-write test (run on every adapter by test_fence_conformance) fails on the control."""
    harness = make_redis_harness(tmp_path, CLUSTER, KEYS, None)
    old_first_pass(harness.fence)
    try:
        with pytest.raises(AssertionError, match="6 of 7 units half-applied"):
            partial.test_a_unit_whose_later_write_the_resource_refuses_applies_nothing(harness, REDIS_WAYS)
    finally:
        harness.close()
