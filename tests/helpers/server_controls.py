"""Deliberately broken variants of `stockade serve`: the controls its fault tests must catch.

Usage: ``python server_controls.py CONTROL [serve args...]``. Each control
patches one rule of the real server, as small as possible:

- ``ack-before-commit``: answers grants before their transaction is committed
  (and commits only every 50 ms), so a kill -9 loses acknowledged tokens (C1).
- ``skip-frame``: acknowledges a batch without writing its frame to the record log
  (it reaches the coordinator file only at the next fold), so a kill -9 loses acknowledged tokens (C1).
- ``epochs-off``: the coordinator file starts no new token epoch on open, so a restored
  older copy of the file hands out tokens again from its own last ones.
- ``folds-every-20`` (not broken: a setting): the record log is folded into the file
  every 20 changes, not every 4,096, so that a test meets a fold within a few requests.
- ``apply-before-validate``: an acquire grants (and releases) a lease before it
  validates its input, so rejected requests change state.
- ``auth-after-apply``: runs the handler first and checks the bearer token
  afterwards, so an unauthenticated request changes state but still gets 401.
- ``crash-on-holder``: an uncaught exception (500) for holder names longer than 3.
- ``hands-over-lapsed-grants``: a grant kept for an HTTP wait ticket that lapsed before the
  ticket's next request is "handed over" anyway: the acquire answers 410 (not held).
- ``fencing-off``: the store is `stockade.testing.mutants.FencingOffStore`: it accepts
  every token, so a delayed write from an old holder lands (S05's control).
"""

from __future__ import annotations

import asyncio
import sys
import time

from stockade.cli import serve
from stockade.server import _groupcommit, _leases, _tickets, app

CONTROL = sys.argv[1]

if CONTROL == "hands-over-lapsed-grants":
    from stockade.core.errors import LeaseLost

    original_renewed = _tickets.WaitTickets._renewed

    async def renewed(self, lease):  # type: ignore[no-untyped-def]
        try:
            return await original_renewed(self, lease)
        except _tickets.NotHolder as exc:  # out of reach of the fix's handler, as before it
            raise LeaseLost(lease.scope, lease.token, str(exc)) from exc

    _tickets.WaitTickets._renewed = renewed  # type: ignore[method-assign]

elif CONTROL == "ack-before-commit":
    original_main_submit = _groupcommit.GroupCommitter.submit
    original_run = _groupcommit.GroupCommitter.__init__

    def init(self, name, run_batch, loop, **options):  # type: ignore[no-untyped-def]
        def slow(ops):  # type: ignore[no-untyped-def]
            time.sleep(0.05)
            return run_batch(ops)
        # Every batch to the committer's thread (none committed on the loop, inline, before the loop's next
        # answer): the answers go out at once and the commits follow 50 ms later.
        original_run(self, name, slow, loop, **{**options, "try_batch": None, "inline_ops_max": 0})

    def no_wait(write):  # type: ignore[no-untyped-def]
        return None  # nothing to wait for: the answer goes out before the commit

    _groupcommit.GroupCommitter.__init__ = init  # type: ignore[method-assign]
    _leases.LeaseService.durable = staticmethod(no_wait)  # type: ignore[method-assign]  # every answer's wait

elif CONTROL == "skip-frame":
    from stockade.coordinators.sqlite import _log

    def commit_records(self, changes):  # type: ignore[no-untyped-def]
        # Acknowledged and kept for the next fold, but never written to the log: a kill -9 before the fold loses it.
        with self.lock:
            self.pending.extend((old, new, 0) for old, new in changes)
            if len(self.pending) >= self.fold_changes:
                self._fold_locked()
        return [None] * len(changes)

    _log.RecordLog.commit_records = commit_records  # type: ignore[method-assign]

elif CONTROL == "folds-every-20":  # not a broken variant: a setting, so that a test reaches a fold in a few requests
    from stockade.coordinators.sqlite import SQLiteRecords

    original_open_log = SQLiteRecords.open_log
    SQLiteRecords.open_log = lambda self, **options: original_open_log(  # type: ignore[method-assign]
        self, **{**options, "fold_changes": 20})

elif CONTROL == "epochs-off":
    from stockade.coordinators.sqlite import SQLiteRecords

    SQLiteRecords.epochs = False  # an opener after a restore goes on from the restored file's last tokens

elif CONTROL == "apply-before-validate":
    original_acquire = app.App.acquire

    async def acquire(self, request, raw_scope):  # type: ignore[no-untyped-def]
        try:
            lease = await self.leases.acquire("control", holder="control", ttl_ms=100, wait_ms=0)
            await self.leases.release(lease.lease_id)
        except Exception:  # noqa: BLE001
            pass
        return await original_acquire(self, request, raw_scope)

    app.App.acquire = acquire  # type: ignore[method-assign]

elif CONTROL == "auth-after-apply":
    original_dispatch = app.App.dispatch

    def dispatch(self, request):  # type: ignore[no-untyped-def]
        auth, self.auth = self.auth, None
        try:
            result = original_dispatch(self, request)
        finally:
            self.auth = auth
        if auth is None or request.raw_path == "/healthz" or auth.allows(request.headers.get("authorization")):
            return result

        async def refuse():  # type: ignore[no-untyped-def]
            if not isinstance(result, app.Response):
                await result
            return app.problem_response(401, "unauthorized", "Unauthorized",
                                        headers=[("WWW-Authenticate", 'Bearer realm="stockade"')])
        return refuse()

    app.App.dispatch = dispatch  # type: ignore[method-assign]

elif CONTROL == "crash-on-holder":
    original_validate = app.validate_holder

    def validate_holder(holder):  # type: ignore[no-untyped-def]
        if isinstance(holder, str) and len(holder) > 3:
            raise ZeroDivisionError("control: a bug")
        return original_validate(holder)

    app.validate_holder = validate_holder  # type: ignore[assignment]

elif CONTROL == "fencing-off":
    from stockade.testing.mutants import FencingOffStore

    app.SQLiteStore = FencingOffStore  # type: ignore[misc]

else:
    raise SystemExit(f"unknown control {CONTROL!r}")

asyncio.set_event_loop_policy(None)
sys.exit(serve.run(sys.argv[2:]))
