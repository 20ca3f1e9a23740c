"""``stockade etcd bump-revision``: after etcd was restored from a snapshot, advance its revision past every token.

etcd 3.4 restores a snapshot at the snapshot's revision, and a token is a
create revision: the next grants would repeat tokens issued after the
snapshot. Every stockade client refuses to grant on a cluster that looks
restored (docs/coordinator-etcd.md, Restores). This command ends that:

  1. it reads the target: the highest token issued, from ``--from-store URL``
     (each fenced resource's highest high-water mark, as ``stockade floor``
     opens it; repeat the flag for every resource), ``--to N``, and the
     coordinator's own fence floors; the largest, plus ``--margin``;
  2. it writes to a scratch key (``stockade/meta/bump``) until etcd's revision
     is at least the target: one revision per write, ``--workers`` at a time;
  3. it records the cluster as it now is as stockade's own; grants resume, and
     the next token is above the target.

``--dry-run`` reads and prints, and writes nothing. Run it with every process
that lived through the restore stopped: such a process may still hold a
lease whose token is above every resource's mark (it never wrote), which
``--margin`` or ``--to`` must then cover.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from stockade.cli._common import URL_ENV, help_text, refuse
from stockade.core.errors import InvalidArgument, LimitExceeded, StockadeError
from stockade.core.limits import validate_int

__all__ = ["run", "WORKERS_MAX"]

WORKERS_MAX = 256
WORKERS_DEFAULT = 64
TARGET_MAX = 1 << 62
PROGRESS_EVERY_S = 5.0


def _redact(url: str) -> str:
    from stockade.resources.floor import redact_url

    return redact_url(url)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stockade etcd", description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    url_help = f"etcd://h1:2379,h2:2379,h3:2379[/namespace] (default: ${URL_ENV})"
    # --url before the action too (`stockade --url U etcd bump-revision`); the action's own one is SUPPRESSed
    # when absent, so it does not overwrite the first with None.
    parser.add_argument("--url", default=None, help=url_help)
    commands = parser.add_subparsers(dest="command", required=True)
    bump = commands.add_parser("bump-revision", help="advance etcd's revision past every issued token")
    bump.add_argument("--url", default=argparse.SUPPRESS, help=url_help)
    bump.add_argument("--to", type=int, default=None, help="the highest token issued, if known (N)")
    bump.add_argument("--from-store", action="append", default=[], metavar="URL",
                      help="a fenced resource whose highest mark is a token issued (repeatable)")
    bump.add_argument("--margin", type=int, default=0, help="revisions to add on top of the target (default 0)")
    bump.add_argument("--workers", type=int, default=WORKERS_DEFAULT,
                      help=f"writes in flight (1..{WORKERS_MAX}, default {WORKERS_DEFAULT})")
    bump.add_argument("--timeout-ms", type=int, default=10_000, help="deadline of one request (default 10000)")
    bump.add_argument("--dry-run", action="store_true", help="print the target and the writes it needs; write nothing")
    bump.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    url = args.url or os.environ.get(URL_ENV, "")
    try:
        if not url.startswith("etcd://"):
            raise InvalidArgument("url", "stockade etcd needs --url etcd://h1:2379,h2:2379,... (or $STOCKADE_URL)"
                                  + (f", not {_redact(url)}" if url else ""))
        if args.to is None and not args.from_store:
            raise InvalidArgument("to", "give the highest token issued: --to N, or --from-store URL (repeatable)")
        if args.to is not None:
            validate_int("to", args.to, 0, TARGET_MAX)
        validate_int("margin", args.margin, 0, TARGET_MAX)
        validate_int("workers", args.workers, 1, WORKERS_MAX)
        validate_int("timeout_ms", args.timeout_ms, 1, 600_000)
        report = asyncio.run(bump_revision(
            url, to=args.to, stores=args.from_store, margin=args.margin, workers=args.workers,
            timeout_ms=args.timeout_ms, dry_run=args.dry_run, progress=not args.json,
        ))
    except StockadeError as exc:
        return refuse(exc)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"etcd        {report['etcd']}  (stockade cluster {report['cluster_id']})")
    print(f"restored    {report['restored'] or 'not detected'}")
    for source, value in report["sources"].items():
        print(f"  source {source}: {value}")
    print(f"target      {report['target']} (revision was {report['revision_before']}, {report['writes']} writes)")
    if report["dry_run"]:
        print("dry run: nothing written")
    else:
        print(f"revision    {report['revision_after']} after {report['writes_made']} writes in "
              f"{report['seconds']:.1f} s; recorded as stockade's cluster: grants resume")
    return 0


async def bump_revision(
    url: str, *, to: int | None, stores: list[str], margin: int, workers: int, timeout_ms: int,
    dry_run: bool = False, progress: bool = False,
) -> dict[str, Any]:
    """Advance the revision of the etcd at ``url`` past the target, then record the cluster (see the module doc).

    Raises:
        InvalidArgument: a bad url or resource url.
        LimitExceeded: the target needs more than `BUMP_WRITES_MAX` writes.
        BackendUnavailable: etcd or a resource failed; the bump can be run again (it only moves forward).
    """
    from stockade.coordinators import etcd as recipe
    from stockade.coordinators.etcd._async.port import AsyncEtcdCoordinatorPort
    from stockade.coordinators.registry import coordinator_backend
    from stockade.resources.floor import open_floor_target, redact_url

    members, layout = recipe.parse_location(url[len("etcd://"):])
    port = AsyncEtcdCoordinatorPort(
        members, layout, timeout_ms=timeout_ms, connect_timeout_ms=min(timeout_ms, 5_000),
        capabilities=coordinator_backend("etcd://")[0].capabilities,
    )
    try:
        await port.open()
        cluster_id = port.identity()[0]
        now = await port.incarnation()
        reason = recipe.restored_reason(await port.recorded_incarnation(), now)
        floors = await port.fence_floors()
        sources: dict[str, int] = {"etcd fence floors": max([floors.default, *floors.floors.values()])}
        if to is not None:
            sources["--to"] = to
        for store_url in stores:
            target_store = open_floor_target(store_url, cluster_id=cluster_id)
            try:
                sources[redact_url(store_url)] = max(target_store.high_waters().values(), default=0)
            finally:
                target_store.close()
        target = max(sources.values()) + margin
        writes = max(0, target - now.revision)
        if writes > recipe.BUMP_WRITES_MAX:
            raise LimitExceeded("BUMP_WRITES_MAX", recipe.BUMP_WRITES_MAX,
                                f"{writes} writes to reach revision {target} from {now.revision}")
        report: dict[str, Any] = {
            "etcd": url, "cluster_id": cluster_id, "restored": reason, "sources": sources, "target": target,
            "revision_before": now.revision, "writes": writes, "dry_run": dry_run,
        }
        if dry_run:
            return report
        started = time.monotonic()
        made = await _advance(port, target, workers, progress)
        confirmed = await port.confirm_incarnation()
        report.update(revision_after=confirmed.revision, writes_made=made, seconds=time.monotonic() - started,
                      recorded_gap=confirmed.gap)
        return report
    finally:
        await port.aclose()


async def _advance(port: Any, target: int, workers: int, progress: bool) -> int:
    """Write the scratch key, ``workers`` at a time, until the revision reaches ``target``; the writes made.

    Each write raises the revision by one (and anyone else's writes only raise it more), so a round
    makes exactly the writes still missing, and a second round runs only if a write failed.
    """
    highest = (await port.incarnation()).revision
    made = claimed = 0
    started = shown = time.monotonic()

    async def write(missing: int) -> None:
        nonlocal highest, made, shown, claimed
        while claimed < missing:
            claimed += 1
            highest = max(highest, await port.bump())
            made += 1
            if progress and time.monotonic() - shown >= PROGRESS_EVERY_S:
                shown = time.monotonic()
                rate = made / max(1e-9, shown - started)
                print(f"  revision {highest} of {target} ({rate:.0f} writes/s)", file=sys.stderr, flush=True)

    while highest < target:
        missing, claimed = target - highest, 0
        async with asyncio.TaskGroup() as group:
            for _ in range(min(workers, missing)):
                group.create_task(write(missing))
    return made
