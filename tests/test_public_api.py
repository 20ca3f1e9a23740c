"""The public Python API: its names, its one error tree, its urls, and the sync twin generated from async."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import stockade
from stockade import InvalidArgument

ROOT = Path(__file__).resolve().parent.parent


def test_public_api_is_pinned():
    assert sorted(stockade.__all__) == sorted(
        [
            "connect", "connect_async", "open_store", "open_store_async",
            "Coordinator", "AsyncCoordinator", "Lease", "AsyncLease", "FencedStore", "AsyncFencedStore", "Semaphore",
            "AsyncSemaphore", "ReadWriteLock", "AsyncReadWriteLock", "ReadLease", "AsyncReadLease",
            "FencingToken", "ScopeInfo", "ScopeState", "Contender", "Item", "WriteResult",
            "StockadeError", "InvalidArgument", "LimitExceeded", "FenceRejected", "StaleToken", "TokenMismatch",
            "LeaseError", "NotHolder", "LeaseLost", "LockTimeout", "Unauthorized", "BackendUnavailable",
            "InvariantViolation",
        ]
    )
    for name in stockade.__all__:
        assert getattr(stockade, name) is not None


def test_sync_client_is_generated_from_async():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"], capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


def test_error_tree_is_one_tree():
    for name in ["InvalidArgument", "LimitExceeded", "StaleToken", "TokenMismatch", "NotHolder", "LeaseLost",
                 "LockTimeout", "Unauthorized", "BackendUnavailable"]:
        assert issubclass(getattr(stockade, name), stockade.StockadeError)
    assert issubclass(stockade.StaleToken, stockade.FenceRejected)
    # A bug is not an operating error: `except StockadeError` must not catch it.
    assert not issubclass(stockade.InvariantViolation, stockade.StockadeError)
    assert issubclass(stockade.InvariantViolation, AssertionError)


def test_remote_server_down_is_backend_unavailable():
    from conftest import free_port

    with pytest.raises(stockade.BackendUnavailable):
        stockade.connect(f"http://127.0.0.1:{free_port()}")


@pytest.mark.parametrize(
    "url", ["", "coord.db", "mysql://x", "etcd://", "http://", "http://h:1?q=1", "sqlite://", 5, None],
)
def test_bad_urls(url):
    with pytest.raises(InvalidArgument):
        stockade.connect(url)


def test_every_registered_coordinator_runs_the_conformance_suite():
    """A new backend is one registry entry plus one ``backend`` parameter (tests/conftest.py)."""
    from conftest import BACKENDS

    from stockade.coordinators.registry import COORDINATORS

    assert set(COORDINATORS) <= {scheme for schemes in BACKENDS.values() for scheme in schemes}


def test_capabilities_are_declared_and_checked(tmp_path):
    from stockade.coordinators.registry import Capability

    coord = stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}?process=embedded", lock_delay_ms=200)
    assert Capability.CLIENT_LOCK_DELAY in coord.capabilities and Capability.DURABLE_TOKENS in coord.capabilities
    coord.close()
    memory = stockade.connect(f"memory://{tmp_path.name}")
    assert Capability.DURABLE_TOKENS not in memory.capabilities
    with pytest.raises(InvalidArgument, match="lock_delay_ms"):
        stockade.connect("http://127.0.0.1:9", lock_delay_ms=100)  # refused before any I/O
    for url in ["etcd://h:x", "zk://h:x", "nope://x", "memory://", "sqlite://", 5]:
        with pytest.raises(InvalidArgument):
            stockade.connect(url)


@pytest.mark.parametrize(("kept", "home"), [
    ("stockade.ids", "stockade.recipes.ids"),
    ("stockade.jobs", "stockade.recipes.jobs"),
    ("stockade.resources.log", "stockade.recipes.log"),
])
def test_documented_module_paths_are_kept(kept, home):
    """The recipes moved to stockade.recipes; the paths docs/ and README import keep every public name."""
    import importlib

    old, new = importlib.import_module(kept), importlib.import_module(home)
    assert old.__all__ == new.__all__
    assert all(getattr(old, name) is getattr(new, name) for name in new.__all__)
