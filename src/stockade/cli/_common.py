"""What the subcommands share: where the data lives, and how errors are printed."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from stockade.client import Coordinator, FencedStore, connect, open_store

__all__ = ["add_data_dir", "data_dir", "open_coordinator", "open_default_store", "fail", "DATA_DIR_ENV"]

DATA_DIR_ENV = "STOCKADE_DATA"
DATA_DIR_DEFAULT = "./stockade-data"


def add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=None,
        help=f"directory of coord.db and store.db (default: ${DATA_DIR_ENV}, else {DATA_DIR_DEFAULT})",
    )


def data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir or os.environ.get(DATA_DIR_ENV) or DATA_DIR_DEFAULT)


def open_coordinator(args: argparse.Namespace) -> Coordinator:
    return connect(f"sqlite://{data_dir(args) / 'coord.db'}")


def open_default_store(args: argparse.Namespace, coord: Coordinator) -> FencedStore:
    return open_store(f"sqlite://{data_dir(args) / 'store.db'}", cluster_id=coord.cluster_id)


def fail(message: str, code: int = 1) -> int:
    print(f"stockade: {message}", file=sys.stderr)
    return code
