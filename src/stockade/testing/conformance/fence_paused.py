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
paused lower one) or says in words why there is none (`NotBounded`): the test
then skips with that reason, never silently. tests/test_fence_conformance.py
gives every target its declaration (a missing one fails) through the
``paused_bound`` fixture, and runs the same check on a control without the
adapter's way of ending a paused holder, which must fail (a).

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

from stockade.core.errors import StaleToken
from stockade.testing.conformance.fence import FenceHarness, tok

#: Rounds per target (the issue's figure is 20 of 20: ``STOCKADE_LONG=1``; ``STOCKADE_PAUSED_ROUNDS`` overrides).
PAUSED_ROUNDS = int(os.environ.get("STOCKADE_PAUSED_ROUNDS", "0") or 0) or (
    20 if os.environ.get("STOCKADE_LONG") == "1" else 2)
#: What a busy machine may add to a declared bound before the newer unit counts as stalled.
SLACK_MS = 5_000
#: How long the test waits for a child to open its unit, or to answer once resumed (a hang, not a bound).
CHILD_WAIT_S = 60.0


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
    """Why a paused writer can stall a newer token on this adapter without bound (shown as the skip reason)."""

    reason: str

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


def _paused_round(harness: FenceHarness, newer: FenceHarness, declared: PausedBound, scope: str, old: int,
                  new: int, key: str) -> tuple[bool, float, str]:
    """One round: (newer completed while the writer was stopped, within the deadline; its time in ms; the answer)."""
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        _child(declared.open_writer, harness, scope, tok(old, scope=scope), key, report_w, go_r)
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
        in_bound = done.wait((declared.bound_ms + SLACK_MS) / 1000) and bool(took)
    finally:
        os.kill(pid, signal.SIGCONT)
        os.write(go_w, b"g")
        answer = _read_line(report_r, CHILD_WAIT_S) or "no answer"
        os.close(report_r)
        os.close(go_w)
        os.waitpid(pid, 0)
        if thread is not None:
            thread.join(CHILD_WAIT_S)
    if errors:
        raise AssertionError(f"the newer unit failed: {errors[0]!r}")
    return in_bound, (took[0] if took else float("inf")), answer


def check_paused_writer(harness: FenceHarness, declared: PausedBound, *, rounds: int = 0,
                        scope: str = "a") -> PausedOutcome:
    """`PAUSED_ROUNDS` rounds of a writer paused inside its unit while a newer token writes; the counts."""
    outcome = PausedOutcome()
    newer = harness.clone()
    base = harness.high_water(scope)
    try:
        for i in range(rounds or PAUSED_ROUNDS):
            old, new, key = base + 2 * i + 1, base + 2 * i + 2, f"z{i}"
            in_bound, took_ms, answer = _paused_round(harness, newer, declared, scope, old, new, key)
            outcome.rounds += 1
            outcome.newer_in_bound += in_bound
            outcome.slowest_ms = max(outcome.slowest_ms, took_ms)
            outcome.answers[answer] = outcome.answers.get(answer, 0) + 1
            outcome.refused += answer.startswith("fencing-error ")
            outcome.nothing_visible += (harness.read(scope, key), harness.read(scope, f"{key}-after")) == (None, None)
            outcome.newer_intact += (harness.read(scope, f"{key}-newer") == str(new).encode()
                                     and harness.high_water(scope) == new)
    finally:
        if newer is not harness:
            newer.close()
    return outcome


def test_a_writer_paused_inside_its_unit_never_stalls_a_newer_token(fence: FenceHarness, paused_bound: Paused) -> None:
    if isinstance(paused_bound, NotBounded):
        pytest.skip(f"declared not bounded: {paused_bound.reason}")
    outcome = check_paused_writer(fence, paused_bound)
    print(f"paused writer, bound {paused_bound.bound_ms} ms: {outcome}")
    assert outcome.all_held(), (
        f"of {outcome.rounds}: newer within {paused_bound.bound_ms} + {SLACK_MS} ms {outcome.newer_in_bound}, "
        f"paused writer refused {outcome.refused}, nothing of it visible {outcome.nothing_visible}, newer intact "
        f"{outcome.newer_intact}; slowest {outcome.slowest_ms:.0f} ms; answers {outcome.answers}")


__all__ = [
    "CHILD_WAIT_S", "NotBounded", "PAUSED_ROUNDS", "Paused", "PausedBound", "PausedOutcome", "SLACK_MS",
    "check_paused_writer", "test_a_writer_paused_inside_its_unit_never_stalls_a_newer_token",
]
