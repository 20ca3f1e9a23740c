"""Shared fixtures: fresh coordinator and store files per test, sync and async clients."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

import stockade

HELPERS = Path(__file__).parent / "helpers"


def python_env() -> dict[str, str]:
    """Environment for child Python processes that import the tests' helpers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HELPERS), env.get("PYTHONPATH", "")]))
    return env


PYTHON = sys.executable


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def coord_url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'coord.db'}"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'store.db'}"


class SyncRunner:
    """Runs the same test body against the sync client."""

    mode = "sync"

    def connect(self, url):
        return stockade.connect(url)

    def open_store(self, url, **kw):
        return stockade.open_store(url, **kw)

    def run(self, value):
        return value


class AsyncRunner:
    """Runs the same test body against the async client, one event loop per test."""

    mode = "async"

    def __init__(self):
        self.loop = asyncio.new_event_loop()

    def connect(self, url):
        return stockade.connect_async(url)

    def open_store(self, url, **kw):
        return stockade.open_store_async(url, **kw)

    def run(self, value):
        if asyncio.iscoroutine(value):
            return self.loop.run_until_complete(value)
        return value

    def close(self):
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def client(request):
    """``client.run(x)`` awaits x under async and passes it through under sync."""
    runner = SyncRunner() if request.param == "sync" else AsyncRunner()
    yield runner
    if isinstance(runner, AsyncRunner):
        runner.close()
