"""``stockade serve``: the coordinator and the fenced store over HTTP (docs/http-api.md).

With ``--coordinator URL`` the lease routes serve that backend (PostgreSQL,
etcd, ...) instead of the server's own ``coord.db``; the store in ``--data-dir``
then trusts that backend's tokens ("Serving another backend" in docs/http-api.md).

The data directory is --data-dir, else $STOCKADE_DATA, else the user's state
directory ($XDG_STATE_HOME/stockade, by default ~/.local/state/stockade), the
one `stockade lock` uses too; a coordinator created there is named in one
line. Other hosts reach it with ``--url http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from stockade.cli._common import add_data_dir, announce_created, data_dir, fail, help_text, refuse
from stockade.coordinators.sqlite._host import host_dir
from stockade.core.errors import InvalidArgument, StockadeError
from stockade.core.limits import RELEASE_LAG_MS
from stockade.transport.sqlite_url import sqlite_url
from stockade.wire import DEFAULT_PORT

_RELEASE_LAG_HELP = (f"answer a release at once and commit it with the next grant or renewal, or at most this long "
                     f"after it (default {RELEASE_LAG_MS}; 0..60000); a crash in between leaves that lease held a "
                     "full TTL from the restart. 0: answer a release once it is committed (no effect with "
                     "--coordinator)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stockade serve", description=help_text(__doc__))
    add_data_dir(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    parser.add_argument("--auth-tokens", metavar="FILE",
                        help="bearer tokens, one per line, each optionally followed by the scopes it may touch "
                             "('TOKEN reports.* billing'); every route but /healthz then needs one")
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain (with --tls-key): serve https")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    parser.add_argument("--coordinator", metavar="URL", default=os.environ.get("STOCKADE_COORDINATOR"),
                        help="serve the leases of this backend instead of DATA_DIR/coord.db: postgresql://, "
                             "postgres:// or etcd:// (any coordinator scheme but http, https and memory; a sqlite:/// "
                             "file is opened in this process, never through its host process, unless the url "
                             "says ?process=host); default $STOCKADE_COORDINATOR")
    parser.add_argument("--lock-delay-ms", type=int, default=0,
                        help="after a lease expires (not released), keep its scope ungrantable this long "
                             "(with --coordinator: for the grants made through this server)")
    parser.add_argument("--release-lag-ms", type=int, default=RELEASE_LAG_MS, metavar="MS", help=_RELEASE_LAG_HELP)
    parser.add_argument("--wait-ms-cap", type=int, default=None,
                        help="answer long polls by this many ms at most (default: the client's wait_ms)")
    parser.add_argument("--dashboard-streams-max", type=int, default=100, metavar="STREAMS",
                        help="open live streams of the /ui/ dashboard, all viewers together (default 100; "
                             "docs/dashboard.md)")
    limits = parser.add_argument_group("connection bounds (against slow or idle peers)")
    limits.add_argument("--idle-timeout-s", type=float, default=60.0,
                        help="close a keep-alive connection with no request after this long (default 60)")
    limits.add_argument("--header-timeout-s", type=float, default=10.0,
                        help="close a request whose headers are not complete this long after its first byte "
                             "(default 10)")
    limits.add_argument("--body-timeout-s", type=float, default=30.0,
                        help="close a request whose body is not complete this long after its headers (default 30)")
    limits.add_argument("--body-rate-min", type=int, default=16384, metavar="BYTES_PER_S",
                        help="close a request whose body arrives slower than this on average, after 2 s "
                             "(default 16384)")
    limits.add_argument("--connections-max", type=int, default=4096,
                        help="open connections at most; at the cap the oldest idle one is closed (default 4096)")
    limits.add_argument("--buffer-bytes-max", type=int, default=64 * 1024 * 1024,
                        help="request bytes held in memory, all connections together; past it a body is "
                             "refused with 503 and Retry-After (default 67108864: 64 MiB)")
    shares = parser.add_argument_group(
        "fair shares (per source address, and per bearer token with --auth-tokens; past one: 429, Retry-After)")
    shares.add_argument("--peer-connections-max", type=int, default=4096, metavar="CONNECTIONS",
                        help="open connections per source address; past it the address's own oldest idle one "
                             "is closed, or the new one refused (default 4096)")
    shares.add_argument("--peer-waiters-max", type=int, default=256, metavar="ACQUIRES",
                        help="acquires waiting (wait_ms > 0) at once per source address (default 256)")
    shares.add_argument("--token-connections-max", type=int, default=1024, metavar="CONNECTIONS",
                        help="connections per bearer token, counted from their latest request (default 1024)")
    shares.add_argument("--token-waiters-max", type=int, default=256, metavar="ACQUIRES",
                        help="acquires waiting (wait_ms > 0) at once per bearer token (default 256)")
    host = parser.add_argument_group("the host's coordinator process of one file (what sqlite:///FILE reaches)")
    host.add_argument("--host-file", metavar="FILE",
                      help="serve FILE's leases on the Unix socket FILE.sock (mode 0600) instead of --host/--port, "
                           "with the server's other files in FILE.host/; what the clients of "
                           "sqlite:///FILE (process=host, the default) start on demand (docs/coordinator-files.md)")
    host.add_argument("--idle-exit-s", type=float, default=30.0, metavar="SECONDS",
                      help="with --host-file: exit after this long with no lease, no waiter and no connection "
                           "(default 30)")
    parser.add_argument("--http-parser", choices=("httptools", "python"),
                        default=os.environ.get("STOCKADE_HTTP_PARSER") or None,
                        help="the request parser: httptools (the server extra's) or python (the base install's); "
                             "both take and refuse the same requests (default $STOCKADE_HTTP_PARSER, else "
                             "httptools when installed)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="JSON logs on stderr; debug adds one line per request")
    return parser


def _host_file(args: argparse.Namespace) -> Path | None:
    """``--host-file`` as an absolute path, checked against the options it excludes (raises InvalidArgument)."""
    if args.host_file is None:
        return None
    if args.coordinator or args.tls_cert or args.data_dir:
        raise InvalidArgument("host_file", "goes without --coordinator, --tls-cert and --data-dir")
    if not 0.1 <= args.idle_exit_s <= 86_400:
        raise InvalidArgument("idle_exit_s", "must be 0.1..86400")
    return Path(args.host_file).absolute()


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        from stockade.server import ServerConfig
        from stockade.server import run as run_server
        from stockade.server._auth import load_tokens
        from stockade.server._logging import configure
    except ImportError as exc:  # the server needs only the standard library: a broken install
        return fail(f"cannot import the server: {exc}")
    configure(args.log_level)
    try:
        host_file = _host_file(args)
        directory = host_dir(host_file) if host_file is not None else data_dir(args)
        # On stdout after the ready line: stderr holds JSON logs only, and the first line stays "listening on".
        announce = (announce_created(sqlite_url(directory / "coord.db"), "clients reach it through this url",
                                     prefix="stockade serve", stream=sys.stdout)
                    if not args.coordinator and host_file is None else (lambda: None))

        def ready(server: Any) -> None:
            print(f"stockade serve: listening on {server.url}", flush=True)
            announce()

        config = ServerConfig(
            data_dir=directory, host=args.host, port=args.port,
            auth_tokens=load_tokens(args.auth_tokens) if args.auth_tokens else None,
            tls_cert=Path(args.tls_cert) if args.tls_cert else None,
            tls_key=Path(args.tls_key) if args.tls_key else None,
            lock_delay_ms=args.lock_delay_ms, release_lag_ms=args.release_lag_ms, wait_ms_cap=args.wait_ms_cap,
            dashboard_streams_max=args.dashboard_streams_max, coordinator=args.coordinator or None,
            idle_timeout_s=args.idle_timeout_s, header_timeout_s=args.header_timeout_s,
            body_timeout_s=args.body_timeout_s, body_rate_min=args.body_rate_min,
            connections_max=args.connections_max, buffer_bytes_max=args.buffer_bytes_max,
            peer_connections_max=args.peer_connections_max, peer_waiters_max=args.peer_waiters_max,
            token_connections_max=args.token_connections_max, token_waiters_max=args.token_waiters_max,
            host_file=host_file, idle_exit_s=args.idle_exit_s, http_parser=args.http_parser,
        )
        status = run_server(config, ready=ready)
    except StockadeError as exc:
        return refuse(exc)  # one line, whatever the backend's driver said
    except OSError as exc:
        return fail(f"cannot serve: {exc}")
    except ImportError as exc:  # a backend's optional package (psycopg for postgresql://)
        return fail(f"--coordinator needs its backend's extra: {exc}")
    except KeyboardInterrupt:
        status = 0
    sys.stdout.flush()
    return status
