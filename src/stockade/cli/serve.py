"""``stockade serve``: the coordinator and the fenced store over HTTP (docs/http-api.md)."""

from __future__ import annotations

import argparse
import sys

from stockade.cli._common import add_data_dir, data_dir, fail
from stockade.core.errors import StockadeError
from stockade.wire import DEFAULT_PORT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stockade serve", description=__doc__)
    add_data_dir(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    parser.add_argument("--auth-tokens", metavar="FILE",
                        help="bearer tokens, one per line; every route but /healthz then needs one")
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain (with --tls-key): serve https")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    parser.add_argument("--lock-delay-ms", type=int, default=0,
                        help="after a lease expires (not released), keep its scope ungrantable this long")
    parser.add_argument("--wait-ms-cap", type=int, default=None,
                        help="answer long polls by this many ms at most (default: the client's wait_ms)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="JSON logs on stderr; debug adds one line per request")
    return parser


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        from stockade.server import ServerConfig
        from stockade.server import run as run_server
        from stockade.server._auth import load_tokens
        from stockade.server._logging import configure
    except ImportError as exc:
        return fail(f"the server needs its extra: pip install 'stockade[server]' ({exc})")
    from pathlib import Path

    configure(args.log_level)
    try:
        config = ServerConfig(
            data_dir=data_dir(args), host=args.host, port=args.port,
            auth_tokens=load_tokens(args.auth_tokens) if args.auth_tokens else None,
            tls_cert=Path(args.tls_cert) if args.tls_cert else None,
            tls_key=Path(args.tls_key) if args.tls_key else None,
            lock_delay_ms=args.lock_delay_ms, wait_ms_cap=args.wait_ms_cap,
        )
        status = run_server(
            config, ready=lambda server: print(f"stockade serve: listening on {server.url}", flush=True)
        )
    except StockadeError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"cannot serve: {exc}")
    except KeyboardInterrupt:
        status = 0
    sys.stdout.flush()
    return status
