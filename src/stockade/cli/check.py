"""``stockade check --coordinator URL --resource URL``: prove the fence on your own stack, with real processes.

Starts worker processes that take leases from your coordinator (any url
`stockade.connect` takes) and write to your resource (your PostgreSQL with the
fence installed, a SQLite file, Redis, a directory, or stockade's store over
http), and runs the failure cases of fencing against them:

  pause     a holder frozen (SIGSTOP) past its lease writes after a newer holder:
            the write must be refused
  delay     a write held in a proxy until a newer holder wrote (a resource reached
            over TCP): the write must be refused
  retries   holders in turn, each retrying its writes with the same token: no
            write applied twice, no newer write lost
  failover  the coordinator restarted (--coordinator-restart CMD; a SQLite
            coordinator file the check restarts itself) while a frozen holder holds a
            lease: tokens keep rising, the holder from before is refused
  restore   the resource restored from a backup (--resource-restore CMD; a
            directory the check backs up and restores itself): a holder from
            before writes again until `stockade floor` raised the mark

Before the cases, one line per precondition of the resource (durability,
isolation, eviction, who can take the fence's locks, whether the keyring
verifies), each with a verdict: ok, warn or FAIL. Then the timeline of what
every worker did, and one verdict line.

It writes only under a scratch prefix (scopes stockade-check.<hex>.*, a table
or subdirectory stockade-check-<hex>) that it creates and removes; the
coordinator's counters and the resource's marks of those scopes stay (tokens
never go back). A case that cannot run (a worker that fails, a server that
stops answering, a restart or restore command that fails) is reported on its
own line, "could not run: WHY"; the next case runs if the workers can start
again; every finished case's verdict is printed, and --history and --report
are written all the same.

Exit status: 0 only when every case held and no setup line FAILed; 1 when a
case broke or a setup line FAILed (or none of --cases applies); 2 when a case
could not run and none broke, or for bad input or a server that cannot be
reached at the start (one line on stderr, nothing touched). docs/check.md
describes each case and line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from stockade.cli._common import help_text
from stockade.core.errors import BackendUnavailable, InvalidArgument, StockadeError
from stockade.core.limits import validate_int

_TTL_MS_DEFAULT = 500
#: The cases, in the order they run (docs/check.md, The cases).
CASES = ("pause", "delay", "retries", "failover", "restore")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stockade check", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--coordinator", required=True, help="the coordinator's url (sqlite:///..., http://..., "
                                                             "postgresql://..., etcd://..., zookeeper://...)")
    parser.add_argument("--resource", required=True, help="the resource's url (postgresql://..., sqlite:///FILE, "
                                                          "redis://..., file:///DIR, http://HOST:PORT)")
    parser.add_argument("--seconds", type=int, default=60, help="the time the cases may take (1..3600; default 60)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per case at most (1..1000; default 20)")
    parser.add_argument("--ttl-ms", type=int, default=_TTL_MS_DEFAULT,
                        help=f"the workers' lease TTL (default {_TTL_MS_DEFAULT}); a pause round lasts about this")
    parser.add_argument("--report", "--html", dest="report", type=Path, default=None,
                        help="write the timeline, verdicts and setup lines as one self-contained HTML file")
    parser.add_argument("--history", type=Path, default=None,
                        help="write every event (grants, writes with their outcome and mark, pauses) and each case's "
                             "verdict as JSON lines, each as it happens")
    parser.add_argument("--quiet", action="store_true", help="leave the timeline out of the output")
    parser.add_argument("--coordinator-restart", default=None, metavar="CMD",
                        help="a shell command that restarts the coordinator (the failover case; run with a timeout)")
    parser.add_argument("--resource-restore", default=None, metavar="CMD",
                        help="a shell command that restores the resource from your backup (the restore case)")
    parser.add_argument("--resource-floor", default=None, metavar="URL",
                        help="the url the restore case raises the marks through (stockade floor's; default: "
                             "--resource; a stockade serve's store: its file, sqlite:///DATA/store.db)")
    parser.add_argument("--control", default=None, choices=("fencing-off", "strict-greater", "restore-no-floor"),
                        help="run against a deliberately broken fence on the scratch prefix (restore-no-floor: the "
                             "restore case skips the floor): the check must FAIL")
    parser.add_argument("--cases", default=None, metavar="LIST",
                        help=f"run only these cases, comma-separated ({', '.join(CASES)}; default: all that apply)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default=None, help=argparse.SUPPRESS)
    return parser


def _one_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _keyring_line(coord: Any, target: Any, scope: str, ttl_ms: int) -> Any:
    """Whether the resource refuses a token the coordinator never issued (its MAC over another value)."""
    from stockade.core.tokens import FencingToken
    from stockade.timeline import SetupLine

    name = "keyring verifies (a forged token is refused)"
    lease = coord.acquire(scope, ttl_ms=max(ttl_ms, 1000), wait_ms=10_000, holder="check-setup")
    try:
        token = lease.token
        if not token.signed:
            return SetupLine(name, "tokens are unsigned: a forged one cannot be told apart", "warn")
        forged = FencingToken(token.cluster, token.scope, token.value + 1, kid=token.kid, mac=token.mac)
        try:
            outcome = target.write(forged, scope, "forged", "forged", None)
        except StockadeError as exc:  # e.g. a Redis fence that refuses an evicting policy: nothing can be written
            return SetupLine(name, f"the resource refused every write: {_one_line(exc)}", "FAIL")
        refused = outcome.result == "mismatch"
        return SetupLine(name, "refused" if refused else f"ACCEPTED ({outcome.result})", "ok" if refused else "FAIL")
    finally:
        lease.release()


def _clean_store(coord: Any, target: Any, scopes: list[str], ttl_ms: int) -> None:
    """stockade's store deletes only under a lease: take each scratch scope once more and delete its keys."""
    for scope in scopes:
        with coord.lock(scope, ttl_ms=max(ttl_ms, 1000), wait_ms=10_000) as lease:
            for item in target.store.list(scope):
                target.store.delete(scope, item.key, token=lease.token)


def _run_cases(args: argparse.Namespace, run: Any, started: float) -> list[Any]:
    """Start the workers (A through the proxy when the resource is reached over TCP), run the cases in the time
    left, stop every worker. A case that could not run (an error that is no verdict: a worker that failed, a
    server that did not answer, a command that failed) is said so, and the next one runs with workers started
    anew; when they cannot start (the stack is gone), the cases left are said not begun. A case that does not
    apply to this stack is said so on a note line."""
    from stockade.check._proxy import HoldProxy, proxied_url, upstream_of
    from stockade.check.cases import WorkerFailed
    from stockade.timeline import Verdict

    no_verdict = (WorkerFailed, StockadeError, OSError)
    verdicts: list[Verdict] = []
    upstream = upstream_of(args.resource)
    proxy = HoldProxy(upstream) if upstream is not None else None
    restart, restore, own = _restarts_of(args, run.target)
    cases = ["pause"] + (["delay"] if proxy is not None else []) + ["retries"] \
        + (["failover"] if restart is not False else []) + (["restore"] if restore is not False else [])
    chosen = _chosen(args)
    cases = [case for case in cases if case in chosen]
    budget = args.seconds - (time.monotonic() - started)
    share = budget / max(len(cases), 1)
    try:
        for index, case in enumerate(cases):
            deadline = time.monotonic() + share if index < len(cases) - 1 else started + args.seconds
            run.case = case
            try:
                if not run.workers:
                    for name in ("A", "B", "C"):
                        run.start(name, proxied_url(args.resource, proxy.port) if proxy and name == "A" else None)
            except no_verdict as exc:
                not_begun = [Verdict(left, False, f"could not run: the workers did not start: {_reason(exc)}",
                                     ran=False) for left in cases[index:]]
                verdicts += not_begun
                for verdict in not_begun:
                    run.judged(verdict)
                break
            try:
                verdict = _one_case(case, run, proxy, restart, restore, own, rounds=args.rounds, deadline=deadline)
            except no_verdict as exc:
                verdict = Verdict(case, False, f"could not run: {_reason(exc)}", ran=False)
                run.stop()  # the next case starts its own workers (or finds that they cannot start)
                if proxy is not None:
                    proxy.release()
            verdicts.append(verdict)
            run.judged(verdict)
    finally:
        run.stop()
        if proxy is not None:
            proxy.close()
    if proxy is None and "delay" in chosen:
        print("note: the delay case needs a resource reached over TCP (postgresql, redis, http): not run")
    if restart is False and "failover" in chosen:
        print("note: the failover case needs --coordinator-restart CMD (or a sqlite:// coordinator): not run")
    if restore is False and "restore" in chosen:
        print("note: the restore case needs --resource-restore CMD (or a file:// directory): not run")
    return verdicts


def _one_case(case: str, run: Any, proxy: Any, restart: Any, restore: Any, own: Any, *, rounds: int,
              deadline: float) -> Any:
    from stockade.check._restarts import failover_case, restore_case
    from stockade.check.cases import delay_case, pause_case, retries_case

    if case == "pause":
        return pause_case(run, run.target, rounds=rounds, deadline=deadline)
    if case == "delay":
        return delay_case(run, run.target, proxy, rounds=rounds, deadline=deadline)
    if case == "retries":
        return retries_case(run, run.target, rounds=rounds, deadline=deadline)
    if case == "failover":
        return failover_case(run, run.target, restart=restart, rounds=rounds, deadline=deadline)
    return restore_case(run, restore=restore, own=own, rounds=rounds, deadline=deadline)


def _reason(exc: BaseException) -> str:
    """Why a case could not run, in one line (the error's type named unless its message says enough)."""
    from stockade.check.cases import WorkerFailed

    if isinstance(exc, (WorkerFailed, InvalidArgument, BackendUnavailable)):
        return _one_line(exc)
    return f"{type(exc).__name__}: {_one_line(exc)}"


def _chosen(args: argparse.Namespace) -> tuple[str, ...]:
    """The cases ``--cases`` names (all of them without it).

    Raises:
        InvalidArgument: a name that is not a case, or none at all.
    """
    if args.cases is None:
        return CASES
    names = tuple(name.strip() for name in args.cases.split(",") if name.strip())
    unknown = [name for name in names if name not in CASES]
    if unknown or not names:
        raise InvalidArgument("--cases", f"{', '.join(unknown) or 'nothing'}: the cases are {', '.join(CASES)}")
    return names


def _restarts_of(args: argparse.Namespace, target: Any) -> tuple[str | None | bool, str | None | bool, Any]:
    """``(restart, restore, own backup)``: a command, None (the check does it itself), or False (not run)."""
    from stockade.check._restarts import SelfRestore

    restart: str | None | bool = args.coordinator_restart
    if restart is None and not args.coordinator.startswith("sqlite:"):
        restart = False
    restore: str | None | bool = args.resource_restore
    own_root = target.own_backup()
    own = SelfRestore(own_root) if restore is None and own_root is not None else None
    if restore is None and own is None:
        restore = False
    return restart, restore, own


def _check(args: argparse.Namespace) -> int:
    import stockade
    from stockade.check.cases import Run
    from stockade.check.targets import open_target, scratch_scope, target_class

    started = time.monotonic()
    target_class(args.resource)  # a typo or a missing file: one line, before anything is opened
    if args.coordinator.startswith("memory://"):
        raise InvalidArgument("coordinator", "memory:// lives inside one process; the check's workers are processes")
    for option, command in (("--coordinator-restart", args.coordinator_restart),
                            ("--resource-restore", args.resource_restore)):
        if command is not None and not command.strip():
            raise InvalidArgument(option, "is an empty command")
    floor_url = _floor_url(args)
    scratch = f"stockade-check-{os.urandom(4).hex()}"
    run = Run(args.coordinator, args.resource, scratch, control=args.control, ttl_ms=args.ttl_ms,
              command_timeout_s=float(args.seconds), floor_url=floor_url)
    run.coord = stockade.connect(args.coordinator)
    try:
        run.target = open_target(args.resource, scratch, coord=run.coord, control=args.control)
    except BaseException:
        run.coord.close()
        raise
    scopes = [scratch_scope(scratch, case) for case in ("keys", "pause", "delay", "retries", "failover", "restore")]
    print(f"stockade check: {run.target.kind} resource, scratch prefix {scratch}"
          + (f", CONTROL {args.control}" if args.control else ""))
    failed = True
    try:
        run.target.create_scratch()
        setup = run.target.setup_lines() + [_keyring_line(run.coord, run.target, scopes[0], args.ttl_ms)]
        print("setup:")
        for line in setup:
            print(f"  {line.verdict:<4}  {line.name}: {line.found}")
        if args.history is not None:  # written as the cases go: what was measured stays, whatever ends the run
            run.history = open(args.history, "w", encoding="utf-8")  # noqa: SIM115 - closed below
        verdicts = _run_cases(args, run, started)
        failed = False
    finally:
        left = _clean_up(args, run, scopes, quiet=failed)
        if run.history is not None:
            run.history.close()
    return _report(args, run, setup, verdicts, left)


def _floor_url(args: argparse.Namespace) -> str | None:
    """``--resource-floor``, checked: a url `stockade floor` opens, naming something that is there.

    Raises:
        InvalidArgument: not such a url; or a restore command for a `stockade serve` without it (the server's
            store is floored through its file).
    """
    from stockade.check.targets import target_class
    from stockade.resources.registry import FLOOR_TARGETS

    url: str | None = args.resource_floor
    if url is None:
        if args.resource_restore is not None and args.resource.startswith(("http://", "https://")):
            raise InvalidArgument("--resource-floor", "the restore case floors a stockade serve's store through its "
                                                      "file: give --resource-floor sqlite:///DATA/store.db")
        return None
    if url.partition("://")[0] not in FLOOR_TARGETS:
        raise InvalidArgument("--resource-floor", f"{url!r}: stockade floor opens {', '.join(sorted(FLOOR_TARGETS))}")
    try:
        target_class(url)  # a typo or a missing file: one line, before anything is opened
    except InvalidArgument as exc:
        raise InvalidArgument("--resource-floor", exc.reason) from None
    return url


def _clean_up(args: argparse.Namespace, run: Any, scopes: list[str], *, quiet: bool) -> str | None:
    """Remove the scratch data and close. Returns why that could not be finished (a server gone), or None;
    ``quiet``: an error is already on its way out, and a coordinator or resource that a failed command left down
    must not hide it behind its own."""
    try:
        try:
            if run.target.kind == "store":
                _clean_store(run.coord, run.target, scopes, args.ttl_ms)
            run.target.remove_scratch(scopes)
        finally:
            try:
                run.target.close()
            finally:
                run.coord.close()
    except (StockadeError, OSError) as exc:
        return None if quiet else _reason(exc)
    return None


#: How a verdict's line begins (`stockade.timeline.Verdict.status`), six columns wide.
_MARKS = {"held": "held  ", "BROKEN": "BROKEN", "could not run": "ERROR "}


def _report(args: argparse.Namespace, run: Any, setup: list[Any], verdicts: list[Any], left: str | None) -> int:
    """Print the timeline and the verdicts, write the HTML report; the exit status: 1 when a case broke or a
    setup line FAILed (or no case applied), else 2 when a case or the clean-up could not run, else 0."""
    from stockade.timeline import render_html, render_text

    failed_setup = [line for line in setup if line.verdict == "FAIL"]
    if not args.quiet:
        print("timeline:")
        print(render_text(run.events))
    print("cases:")
    for verdict in verdicts:
        print(f"  {_MARKS[verdict.status]}  {verdict.case}: {verdict.figure}")
    if left is not None:
        print(f"note: the clean-up could not finish, scratch data may be left: {left}")
    broken = [v.case for v in verdicts if v.ran and not v.held] + [f"setup: {line.name}" for line in failed_setup]
    unrun = [v for v in verdicts if not v.ran]
    not_run = ", ".join([v.case for v in unrun] + (["clean-up"] if left is not None else []))
    if broken or not verdicts:
        status = 1
        summary = (f"FAILED: {'; '.join(broken) or 'no case ran (none of --cases applies here)'}"
                   + (f"; could not run: {not_run}" if not_run else ""))
    elif not_run:
        status = 2
        summary = (f"INCOMPLETE: {len(verdicts) - len(unrun)} of {len(verdicts)} cases held, none broke; "
                   f"could not run: {not_run}")
    else:
        status, summary = 0, f"HELD: {len(verdicts)} of {len(verdicts)} cases held, no setup line failed"
    if args.report is not None:
        args.report.write_text(render_html(f"stockade check: {run.target.kind} resource", run.events,
                                           verdicts=verdicts, setup=setup, summary=summary), encoding="utf-8")
        print(f"report: {args.report}")
    print(f"stockade check: {summary}")
    if status == 2:  # one line on stderr, as for any exit 2: the first thing that could not run, and why
        first = f"{unrun[0].case}: {unrun[0].figure}" if unrun else f"clean-up: could not run: {left}"
        print(f"stockade check: {first}", file=sys.stderr)
    return status


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.worker is not None:
            from stockade.check.worker import serve_commands

            return serve_commands(args.worker, args.coordinator, args.resource, args.scratch, args.control)
        validate_int("--seconds", args.seconds, 1, 3600)
        validate_int("--rounds", args.rounds, 1, 1000)
        validate_int("--ttl-ms", args.ttl_ms, 100, 60_000)
        _chosen(args)
        for option, path in (("--report", args.report), ("--history", args.history)):
            if path is not None and not path.parent.is_dir():
                raise InvalidArgument(option, f"{path.parent}: no such directory")
        return _check(args)
    except (InvalidArgument, BackendUnavailable) as exc:
        print(f"stockade check: {_one_line(exc)}", file=sys.stderr)
        return 2
    except StockadeError as exc:
        print(f"stockade check: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 1
    except ImportError as exc:  # an optional driver (psycopg, redis) is missing
        print(f"stockade check: {_one_line(exc)}", file=sys.stderr)
        return 2
