"""``stockade floor RESOURCE_URL``: after a resource failed over or was restored, make old tokens stale there.

Reads the coordinator's last issued token of every scope and raises the
resource's high-water mark of each scope to at least it (R4), in one atomic
step, then prints what it raised. Marks only ever go up: running it twice is
harmless. Run it before the promoted replica or the restored copy takes
writes again.

The coordinator is ``--url URL`` (sqlite:///..., http://...), else
$STOCKADE_URL, else ``coord.db`` in the data directory. Resources:
sqlite:///path (stockade's store or your own fenced database),
postgresql://..., redis://..., file:///dir (a fenced directory).
"""

from __future__ import annotations

import argparse
import json

from stockade.cli._common import URL_ENV, add_data_dir, fail, help_text, local_file, refuse
from stockade.cli._common import coordinator_url as _coordinator_url
from stockade.client import connect
from stockade.core.errors import StockadeError
from stockade.resources.floor import open_floor_target, raise_to_floors, redact_url

RAISED_SHOWN_MAX = 1_000


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stockade floor", description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("resource", help="the resource to raise, e.g. postgresql://db1/app or sqlite:////srv/app.db")
    parser.add_argument("--url", default=None, help=f"coordinator url (default: ${URL_ENV}, else the data dir)")
    add_data_dir(parser)
    parser.add_argument("--dry-run", action="store_true", help="print what would be raised; change nothing")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    url = _coordinator_url(args)
    if (coord_file := local_file(url)) is not None and not coord_file.is_file():
        return fail(f"no coordinator at {coord_file} (use --url, ${URL_ENV} or --data-dir)")
    try:
        coord = connect(url)
        try:
            floors = coord.fence_floors()
            cluster_id = coord.cluster_id
        finally:
            coord.close()
        target = open_floor_target(args.resource, cluster_id=cluster_id)
        try:
            report = raise_to_floors(target, floors, dry_run=args.dry_run)
        finally:
            target.close()
    except StockadeError as exc:
        return refuse(exc)
    if args.json:
        print(json.dumps({
            "coordinator": redact_url(url), "resource": redact_url(args.resource), "cluster_id": cluster_id,
            "dry_run": report.dry_run, "scopes": report.scopes, "default": report.default,
            "raised": [{"scope": c.scope, "before": c.before, "after": c.after} for c in report.raised],
        }))
        return 0
    verb = "would raise" if report.dry_run else "raised"
    print(f"coordinator {redact_url(url)}  cluster {cluster_id}")
    print(f"resource    {redact_url(args.resource)}")
    for change in report.raised[:RAISED_SHOWN_MAX]:
        print(f"  {change.scope}: {change.before} -> {change.after}")
    if len(report.raised) > RAISED_SHOWN_MAX:
        print(f"  ... and {len(report.raised) - RAISED_SHOWN_MAX} more (--json lists them all)")
    print(f"{verb} {len(report.raised)} of {report.scopes} scopes; every other scope's floor is {report.default}")
    return 0
