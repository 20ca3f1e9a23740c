"""``stockade bench``: lock cycles and fenced writes, 1 client and N client processes.

    stockade bench --url http://127.0.0.1:7390              # a running `stockade serve` (its default port)
    stockade bench                                          # a coordinator file in a temporary directory
    stockade bench --data-dir DIR                           # the coordinator file in DIR (bench-* scopes stay)
    stockade bench --url http://127.0.0.1:7390 --json out.json --runs 3

The coordinator is --url, else $STOCKADE_URL, else a coordinator file
(sqlite:///DIR/coord.db: through its host process, the default; add
?process=embedded in --url for the file in each process): in a temporary
directory that is removed afterwards, so the bench-* scopes it makes never
land in your data directory, or in --data-dir when given. Each
phase is announced on stderr before it starts; the table goes to stdout.

The workload matches the peer benchmark's (see `stockade.bench`), so the
figures can be put beside etcd's and PostgreSQL's in one run
(benchmarks/side_by_side.py, described in benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

from stockade.bench import DEFAULT_WORKLOADS, WORKLOADS, format_table, run_workload
from stockade.cli._common import URL_ENV, add_url, fail, help_text
from stockade.core.errors import InvariantViolation
from stockade.transport.sqlite_url import sqlite_url

__all__ = ["run"]


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stockade bench", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_url(parser, default="a coordinator file in a temporary directory")
    parser.add_argument("--store-url", help="store url for fenced writes (default: --url for http, else --data-dir)")
    parser.add_argument("--data-dir", default=None,
                        help="a coordinator file and store here (default: a temporary directory)")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help=f"comma list of {', '.join(WORKLOADS)} (default {','.join(DEFAULT_WORKLOADS)})")
    parser.add_argument("--clients", type=int, default=8, help="clients in the concurrent run (default 8)")
    parser.add_argument("--conc-mode", choices=["procs", "threads"], default="procs")
    parser.add_argument("--seconds", type=float, default=3.0, help="per client, per run (default 3)")
    parser.add_argument("--iters", type=int, default=2000, help="at most this many cycles per client (default 2000)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", help="write every result here")
    args = parser.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        return fail(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}", 2)
    if not 1 <= args.clients <= 256 or not 0 < args.seconds <= 600 or not 1 <= args.iters <= 10_000_000:
        return fail("--clients 1..256, --seconds 0..600, --iters 1..10000000", 2)
    url = args.url or (None if args.data_dir else os.environ.get(URL_ENV))
    if url is not None:
        return _bench(args, workloads, url, args.store_url)
    if args.data_dir:
        directory = Path(args.data_dir)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return fail(f"--data-dir {directory}: {exc.strerror or exc}", 2)
        return _bench(args, workloads, sqlite_url(directory / "coord.db"),
                      args.store_url or sqlite_url(directory / "store.db"))
    with tempfile.TemporaryDirectory(prefix="stockade-bench-") as temporary:
        directory = Path(temporary)
        return _bench(args, workloads, sqlite_url(directory / "coord.db"),
                      args.store_url or sqlite_url(directory / "store.db"))


def _progress(line: str) -> None:
    print(f"stockade bench: {line}", file=sys.stderr, flush=True)


def _bench(args: argparse.Namespace, workloads: list[str], url: str, store_url: str | None) -> int:
    if url.startswith("sqlite://") and store_url is None and "write" in workloads:
        return fail("--store-url is needed for fenced writes with a sqlite --url", 2)
    results = []
    rows = []
    tag = uuid.uuid4().hex[:6]
    print(f"stockade bench: {url}  ({args.clients} {args.conc_mode}, {args.seconds:g} s or {args.iters} cycles each)",
          flush=True)
    phases = args.runs * len(workloads) * 2
    phase = 0
    try:
        for run_number in range(1, args.runs + 1):
            for workload in workloads:
                label = f"{workload} r{run_number}"
                common = dict(seconds=args.seconds, iters=args.iters, store_url=store_url, tag=f"{tag}r{run_number}")
                phase += 1
                _progress(f"[{phase}/{phases}] {label}: 1 client, up to {args.seconds:g} s ...")
                one = run_workload(workload, url, clients=1, **common)
                phase += 1
                _progress(f"[{phase}/{phases}] {label}: {args.clients} {args.conc_mode}, up to {args.seconds:g} s ...")
                many = run_workload(workload, url, clients=args.clients, conc_mode=args.conc_mode, **common)
                rows.append((label, one, many))
                results += [{"run": run_number, **one.as_dict()}, {"run": run_number, **many.as_dict()}]
                print(format_table([(label, one, many)]).splitlines()[-1] if len(rows) > 1 else format_table(rows),
                      flush=True)
    except KeyboardInterrupt:
        return 130
    except InvariantViolation:
        raise  # a bug: keep its traceback rather than a one-line message
    except Exception as exc:  # noqa: BLE001 - one line for any failure of the run, not a traceback
        print(f"stockade bench: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    _progress("done")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"url": url, "args": {k: v for k, v in vars(args).items() if k != "json"}, "results": results},
                      file, indent=1)
    return 0
