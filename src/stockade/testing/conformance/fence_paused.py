"""The fence suite's attack class "a writer paused inside its unit": the higher token wins at the resource (L1).

A writer holding token ``t`` opens the adapter's unit, writes once, and is
then paused for real: it runs in a child process of its own, which the test
stops with SIGSTOP (and sees stopped) before it can end its unit. A newer
holder with ``t + 1`` then writes to the same scope. Counted per round:

(a) the newer unit completes while the paused writer is still stopped, within
    the adapter's declared bound (`PausedBound`) plus `SLACK_MS` for a busy
    machine;
(b) the paused writer, resumed with SIGCONT, writes once more and ends its
    unit: that fails with a fencing error (`StaleToken` or a subclass such as
    `Superseded`), and none of its writes is visible;
(c) the newer write is intact and the scope's mark is ``t + 1``.

An adapter either states its bound (how long a newer token may wait for a
paused lower one) or says in words why there is none (`NotBounded`).
tests/test_fence_conformance.py gives every target its declaration (a missing
one fails) through the ``paused_bound`` fixture, and runs the same check on a
control without the adapter's way of ending a paused holder, which must fail (a).

A declaration of no bound is checked too, so that it stays true
(`check_declared_stall`): the same pause, and the newer unit must still be
waiting `STALL_MS` into it (the adapter holds what it says it holds); resumed,
the paused writer commits (its unit was admitted first: R6 keeps the newer one
out until it ends) and the newer unit then completes above it, or is refused
with `BackendUnavailable` when its own wait ran out first. An adapter that
declares no bound but holds nothing fails this; its control is a target that
holds nothing (the store on SQLite) declared unbounded. Where a pause across
processes cannot be staged at all (``staged=False``: one process's memory),
both tests skip with the declared reason, never silently.

The pause is a fork of the test process (the child opens its own handle with
the declaration's ``open_writer``, by default the harness's ``clone``), so any
harness can be paused without a worker script of its own; the child leaves
with ``os._exit`` and never touches what it inherited.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from stockade.core.errors import BackendUnavailable, StaleToken
from stockade.testing.conformance.fence import FenceHarness, tok

#: Rounds per target (the issue's figure is 20 of 20: ``STOCKADE_LONG=1``; ``STOCKADE_PAUSED_ROUNDS`` overrides).
PAUSED_ROUNDS = int(os.environ.get("STOCKADE_PAUSED_ROUNDS", "0") or 0) or (
    20 if os.environ.get("STOCKADE_LONG") == "1" else 2)
#: What a busy machine may add to a declared bound before the newer unit counts as stalled.
SLACK_MS = 5_000
#: How long the test waits for a child to open its unit, or to answer once resumed (a hang, not a bound).
CHILD_WAIT_S = 60.0
#: How far into the pause a newer unit of a `NotBounded` adapter must still be waiting (its declared stall).
STALL_MS = 1_000


def _clone(harness: Any) -> Any:
    return harness.clone()


@dataclass(frozen=True)
class PausedBound:
    """How long a newer token may wait for a writer paused inside its unit with a lower one.

    Attributes:
        bound_ms: the bound (0: the paused writer holds nothing the newer one waits for).
        why: what the bound comes from (for the report and the docs).
        open_writer: opens the paused writer's own handle in the child process
            (default: ``harness.clone()``); a harness whose clone shares an object
            that must not cross a fork (an SQLite connection) opens a new one.
    """

    bound_ms: int
    why: str
    open_writer: Callable[[Any], Any] = field(default=_clone, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.bound_ms, bool) or not isinstance(self.bound_ms, int) or self.bound_ms < 0:
            raise ValueError("bound_ms must be an int >= 0")
        if not self.why.strip():
            raise ValueError("say what the bound comes from")


@dataclass(frozen=True)
class NotBounded:
    """Why a paused writer can stall a newer token on this adapter without bound (shown as the skip reason).

    Attributes:
        reason: what the paused writer holds, and why nothing takes it away.
        staged: whether the suite can stage the pause (a writer in another process): True, and
            `check_declared_stall` shows the stall is real; False where it cannot (one process's
            memory), and the reason says so.
        open_writer: as `PausedBound`.
    """

    reason: str
    staged: bool = True
    open_writer: Callable[[Any], Any] = field(default=_clone, compare=False)

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise ValueError("say why there is no bound")


Paused = PausedBound | NotBounded


@dataclass
class PausedOutcome:
    """Counts over the rounds of `check_paused_writer`.

    Attributes:
        rounds: rounds run.
        newer_in_bound: (a) newer units completed while the writer was stopped, within bound + slack.
        refused: (b) resumed writers whose unit failed with a `StaleToken` (or subclass).
        nothing_visible: (b) rounds where none of the paused writer's writes is visible.
        newer_intact: (c) rounds where the newer write and the mark ``t + 1`` are there.
        slowest_ms: the slowest newer unit (from the moment the writer was stopped).
        answers: what the resumed writers reported, by kind.
    """

    rounds: int = 0
    newer_in_bound: int = 0
    refused: int = 0
    nothing_visible: int = 0
    newer_intact: int = 0
    slowest_ms: float = 0.0
    answers: dict[str, int] = field(default_factory=dict)

    def all_held(self) -> bool:
        return self.rounds == self.newer_in_bound == self.refused == self.nothing_visible == self.newer_intact


def _read_line(fd: int, timeout_s: float) -> str:
    """One line from the pipe ``fd`` ('' when nothing came within ``timeout_s`` or the pipe closed)."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return ""
        chunk = os.read(fd, 4096)
        if not chunk:
            return ""
        data += chunk
    return data.decode("utf-8", "replace").strip()


def _child(open_writer: Callable[[Any], Any], harness: Any, scope: str, token: Any, key: str,
           report: int, go: int) -> None:  # pragma: no cover - runs in the forked child
    try:
        writer = open_writer(harness)
        try:
            with writer.fenced(scope, token) as unit:
                unit.write(key, b"paused")
                os.write(report, b"in-unit\n")
                os.read(go, 1)  # stopped here by the parent; resumed, it goes on
                unit.write(f"{key}-after", b"paused")
            answer = "committed"
        except StaleToken as error:
            answer = f"fencing-error {type(error).__name__}"
        except BaseException as error:  # noqa: BLE001 - reported to the parent, which judges it
            answer = f"other-error {type(error).__name__}"
        os.write(report, answer.encode() + b"\n")
    finally:
        os._exit(0)  # no finalizer of anything inherited from the parent runs here


@dataclass
class _Round:
    """One round as the parent saw it: the newer unit's fate, and the resumed writer's answer."""

    in_time: bool  # the newer unit completed while the writer was stopped, within the round's wait
    took_ms: float  # the newer unit's time (inf: it failed)
    answer: str  # what the resumed writer reported
    error: BaseException | None  # what the newer unit raised, if it failed


def _paused_round(harness: FenceHarness, newer: FenceHarness, open_writer: Callable[[Any], Any], scope: str,
                  old: int, new: int, key: str, wait_ms: int) -> _Round:
    """One round: the writer with ``old`` stopped inside its unit, the newer unit with ``new`` watched ``wait_ms``."""
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        _child(open_writer, harness, scope, tok(old, scope=scope), key, report_w, go_r)
    os.close(report_w)
    os.close(go_r)
    done = threading.Event()
    took: list[float] = []
    errors: list[BaseException] = []
    thread: threading.Thread | None = None
    try:
        opened = _read_line(report_r, CHILD_WAIT_S)
        if opened != "in-unit":
            raise AssertionError(f"the writer did not open its unit: {opened!r}")
        os.kill(pid, signal.SIGSTOP)
        _, status = os.waitpid(pid, os.WUNTRACED)  # returns once the child is really stopped
        assert os.WIFSTOPPED(status), status

        def write_newer() -> None:
            started = time.monotonic()
            try:
                with newer.fenced(scope, tok(new, scope=scope)) as unit:
                    unit.write(f"{key}-newer", str(new).encode())
                took.append((time.monotonic() - started) * 1000)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)
            finally:
                done.set()

        thread = threading.Thread(target=write_newer, daemon=True)
        thread.start()
        in_time = done.wait(wait_ms / 1000) and bool(took)
    finally:
        os.kill(pid, signal.SIGCONT)
        os.write(go_w, b"g")
        answer = _read_line(report_r, CHILD_WAIT_S) or "no answer"
        os.close(report_r)
        os.close(go_w)
        os.waitpid(pid, 0)
        if thread is not None:
            thread.join(CHILD_WAIT_S)
    return _Round(in_time, took[0] if took else float("inf"), answer, errors[0] if errors else None)


def check_paused_writer(harness: FenceHarness, declared: PausedBound, *, rounds: int = 0,
                        scope: str = "a") -> PausedOutcome:
    """`PAUSED_ROUNDS` rounds of a writer paused inside its unit while a newer token writes; the counts."""
    outcome = PausedOutcome()
    newer = harness.clone()
    base = harness.high_water(scope)
    try:
        for i in range(rounds or PAUSED_ROUNDS):
            old, new, key = base + 2 * i + 1, base + 2 * i + 2, f"z{i}"
            seen = _paused_round(harness, newer, declared.open_writer, scope, old, new, key,
                                 declared.bound_ms + SLACK_MS)
            if seen.error is not None:
                raise AssertionError(f"the newer unit failed: {seen.error!r}")
            outcome.rounds += 1
            outcome.newer_in_bound += seen.in_time
            outcome.slowest_ms = max(outcome.slowest_ms, seen.took_ms)
            outcome.answers[seen.answer] = outcome.answers.get(seen.answer, 0) + 1
            outcome.refused += seen.answer.startswith("fencing-error ")
            outcome.nothing_visible += (harness.read(scope, key), harness.read(scope, f"{key}-after")) == (None, None)
            outcome.newer_intact += (harness.read(scope, f"{key}-newer") == str(new).encode()
                                     and harness.high_water(scope) == new)
    finally:
        if newer is not harness:
            newer.close()
    return outcome


@dataclass
class StallOutcome:
    """Counts over the rounds of `check_declared_stall` (an adapter that declares no bound).

    Attributes:
        rounds: rounds run.
        held_up: newer units still waiting `STALL_MS` into the pause (the declared stall is real).
        committed: resumed writers whose unit committed, both its writes visible (admitted first, R6).
        newer_after: newer units that completed after the resume, their write there and the mark ``t + 1``.
        newer_refused: newer units refused with `BackendUnavailable` (their own wait ran out first).
        answers: what the resumed writers reported, by kind.
    """

    rounds: int = 0
    held_up: int = 0
    committed: int = 0
    newer_after: int = 0
    newer_refused: int = 0
    answers: dict[str, int] = field(default_factory=dict)

    def as_declared(self) -> bool:
        return self.rounds == self.held_up == self.committed == self.newer_after + self.newer_refused


def check_declared_stall(harness: FenceHarness, declared: NotBounded, *, rounds: int = 0,
                         scope: str = "a") -> StallOutcome:
    """`PAUSED_ROUNDS` rounds of the paused-writer staging against an adapter declared `NotBounded`; the counts."""
    outcome = StallOutcome()
    newer = harness.clone()
    base = harness.high_water(scope)
    try:
        for i in range(rounds or PAUSED_ROUNDS):
            old, new, key = base + 2 * i + 1, base + 2 * i + 2, f"z{i}"
            seen = _paused_round(harness, newer, declared.open_writer, scope, old, new, key, STALL_MS)
            if seen.error is not None and not isinstance(seen.error, BackendUnavailable):
                raise AssertionError(f"the newer unit failed: {seen.error!r}")
            outcome.rounds += 1
            outcome.held_up += not seen.in_time and seen.took_ms > STALL_MS
            outcome.answers[seen.answer] = outcome.answers.get(seen.answer, 0) + 1
            outcome.committed += seen.answer == "committed" and None not in (
                harness.read(scope, key), harness.read(scope, f"{key}-after"))
            outcome.newer_refused += seen.error is not None
            outcome.newer_after += (seen.error is None and harness.read(scope, f"{key}-newer") == str(new).encode()
                                    and harness.high_water(scope) == new)
    finally:
        if newer is not harness:
            newer.close()
    return outcome


def _staged_or_skip(paused_bound: Paused) -> None:
    if isinstance(paused_bound, NotBounded) and not paused_bound.staged:
        pytest.skip(f"a pause cannot be staged here: {paused_bound.reason}")


def test_a_writer_paused_inside_its_unit_never_stalls_a_newer_token(fence: FenceHarness, paused_bound: Paused) -> None:
    _staged_or_skip(paused_bound)
    if isinstance(paused_bound, NotBounded):
        pytest.skip(f"declared not bounded: {paused_bound.reason}")
    outcome = check_paused_writer(fence, paused_bound)
    print(f"paused writer, bound {paused_bound.bound_ms} ms: {outcome}")
    assert outcome.all_held(), (
        f"of {outcome.rounds}: newer within {paused_bound.bound_ms} + {SLACK_MS} ms {outcome.newer_in_bound}, "
        f"paused writer refused {outcome.refused}, nothing of it visible {outcome.nothing_visible}, newer intact "
        f"{outcome.newer_intact}; slowest {outcome.slowest_ms:.0f} ms; answers {outcome.answers}")


def test_a_writer_paused_inside_its_unit_stalls_only_as_declared(fence: FenceHarness, paused_bound: Paused) -> None:
    """The other half of the declaration: an adapter that says it has no bound does hold a newer token up."""
    _staged_or_skip(paused_bound)
    if isinstance(paused_bound, PausedBound):
        pytest.skip(f"declared bounded ({paused_bound.bound_ms} ms): the class above holds it to that")
    outcome = check_declared_stall(fence, paused_bound)
    print(f"paused writer, declared not bounded: {outcome}")
    assert outcome.as_declared(), (
        f"of {outcome.rounds}: newer still waiting {STALL_MS} ms into the pause {outcome.held_up} (if 0: the "
        f"adapter holds nothing and should declare a PausedBound), paused writer committed {outcome.committed}, "
        f"newer done after {outcome.newer_after}, refused {outcome.newer_refused}; answers {outcome.answers}")


__all__ = [
    "CHILD_WAIT_S", "NotBounded", "PAUSED_ROUNDS", "Paused", "PausedBound", "PausedOutcome", "SLACK_MS", "STALL_MS",
    "StallOutcome", "check_declared_stall", "check_paused_writer",
    "test_a_writer_paused_inside_its_unit_never_stalls_a_newer_token",
    "test_a_writer_paused_inside_its_unit_stalls_only_as_declared",
]
