"""``stockade status``: leases, holders, tokens and high-water marks.

Reads the coordinator and store files read-only and creates no file, so it
works on a read-only data directory and on a full disk."""

from __future__ import annotations

import argparse
import json
import sys

from stockade.cli._common import add_data_dir, data_dir, fail
from stockade.cli._readonly import read_coordinator, read_high_waters
from stockade.clock import SystemClock
from stockade.core.errors import StockadeError

SCOPES_SHOWN_MAX = 10_000


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stockade status", description=__doc__)
    add_data_dir(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per scope")
    args = parser.parse_args(argv)
    root = data_dir(args)
    if not (root / "coord.db").exists():
        return fail(f"no coordinator at {root / 'coord.db'} (use --data-dir or ${'STOCKADE_DATA'})")
    # Read-only: no file is written or created, so status works on a read-only
    # mount, in a directory it may only read, and on a full disk.
    try:
        snapshot = read_coordinator(root / "coord.db", SystemClock().now_ns(), SCOPES_SHOWN_MAX)
        infos = snapshot.scopes
        notes = [snapshot.note]
        high_waters: dict[str, int] = {}
        if (root / "store.db").exists():
            high_waters, note = read_high_waters(root / "store.db")
            notes.append(note)
    except StockadeError as exc:
        return fail(str(exc))
    for note in filter(None, notes):
        print(f"stockade: note: {note}", file=sys.stderr)
    rows = [
        {
            "scope": i.scope,
            "state": i.state.value,
            "holder": i.holder,
            "token": i.token.value if i.token else None,
            "last_token": i.last_token,
            "remaining_ms": i.remaining_ms,
            "waiters": i.waiters,
            "high_water": high_waters.get(i.scope),
        }
        for i in infos
    ]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"coordinator {root / 'coord.db'}  cluster {snapshot.cluster_id}")
    if not rows:
        print("no scopes yet")
        return 0
    header: tuple[str, ...] = ("SCOPE", "STATE", "HOLDER", "TOKEN", "LAST", "REMAINING", "WAITERS", "HIGH-WATER")
    table: list[tuple[str, ...]] = [header] + [
        (
            str(r["scope"]), str(r["state"]), str(r["holder"] or "-"), str(r["token"] or "-"), str(r["last_token"]),
            f"{r['remaining_ms']} ms" if r["state"] == "held" else "-", str(r["waiters"]),
            "-" if r["high_water"] is None else str(r["high_water"]),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    return 0
