"""What a process's start imports: only what its path uses.

A test run starts some 3,000 Python processes (servers, host processes, the
CLI, workers), and each pays for every module it imports: ``import stockade``
took about 0.15 s of CPU when it loaded asyncio, ssl, SQLite and the embedded
engine whatever the process did. These tests pin what each start must *not*
import, counted in a fresh interpreter (no timing): asyncio only where an event
loop runs, ssl only for an ``https://`` url, SQLite and the lease engine only
for a coordinator or store in this process. benchmarks/startup_ab.py measures
the CPU side by side.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import free_port, python_env

# What a start loads only when its path uses it.
EVENT_LOOP = {"asyncio"}
TLS = {"ssl"}
EMBEDDED = {"sqlite3", "stockade.core.engine", "stockade.resources.store", "stockade.client._sync._embedded"}
ASYNC_CLIENT = {"stockade.client._async.coordinator", "stockade.client._async.connect"}
CLIENT = {"stockade.client", "stockade.client._sync.coordinator"} | ASYNC_CLIENT
SERVER = {"stockade.server", "subprocess"}
DASHBOARD_PAGES = {"importlib.resources", "stockade.timeline"}  # what a /ui/ page or file needs, not a server


def loaded(code: str, watched: set[str], *args: str) -> set[str]:
    """The modules of ``watched`` in ``sys.modules`` after a fresh interpreter runs ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(set({sorted(watched)!r}) & set(sys.modules))))"
    result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=python_env(),
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_import_stockade_loads_no_event_loop_tls_engine_client_or_server() -> None:
    watched = EVENT_LOOP | TLS | EMBEDDED | CLIENT | SERVER
    assert loaded("import stockade", watched) == set()
    # the client's names are still there, loaded on first use
    assert loaded("import stockade\nassert stockade.connect and stockade.connect_async", CLIENT) == CLIENT


def test_a_server_loads_no_client_and_no_dashboard_pages() -> None:
    """``stockade serve`` (a file's host process among them) needs the event loop, not the client."""
    assert loaded("import stockade.cli.serve, stockade.server", CLIENT | DASHBOARD_PAGES | EVENT_LOOP) == EVENT_LOOP


def test_the_lock_command_loads_no_event_loop_tls_or_ctypes() -> None:
    """ctypes is for the child's death signal, loaded as CMD is spawned."""
    assert loaded("import stockade.cli.lock", EVENT_LOOP | TLS | ASYNC_CLIENT | {"ctypes"}) == set()


def test_the_import_check_can_fail() -> None:
    """The control: a start that does import them is seen to."""
    assert loaded("import stockade, ssl, asyncio", EVENT_LOOP | TLS) == {"ssl", "asyncio"}
    assert loaded("import stockade.client._sync._embedded", EMBEDDED) == EMBEDDED


def test_the_sync_client_loads_no_event_loop_or_tls(tmp_path) -> None:
    """An embedded coordinator file and an ``http://`` url (here refused: nothing listens) need neither."""
    embedded = ("import stockade, sys\n"
                "stockade.connect('sqlite:///' + sys.argv[1] + '/coord.db?process=embedded').close()\n")
    assert loaded(embedded, EVENT_LOOP | TLS | ASYNC_CLIENT, str(tmp_path)) == set()
    remote = ("import stockade, sys\n"
              "try:\n    stockade.connect(f'http://127.0.0.1:{sys.argv[1]}')\n"
              "except stockade.BackendUnavailable:\n    pass\nelse:\n    raise SystemExit('connected')\n")
    assert loaded(remote, EVENT_LOOP | TLS | EMBEDDED, str(free_port())) == set()


@pytest.mark.parametrize("url", ["https://127.0.0.1:9", "sqlite:///coord.db?process=embedded&x=1", "nope://x"])
def test_a_bad_url_is_still_refused_at_connect(url: str, tmp_path) -> None:
    """Loading on use hides no error: a bad ``tls_ca`` or url is the same `InvalidArgument`, before any I/O."""
    code = ("import stockade, sys\n"
            "try:\n    stockade.connect(sys.argv[1], tls_ca=sys.argv[2] + '/none.pem' if 'https' in sys.argv[1] "
            "else None)\n"
            "except stockade.InvalidArgument as exc:\n    print(exc.field, file=sys.stderr)\n"
            "else:\n    raise SystemExit('accepted')\n")
    assert loaded(code, set(), url, str(tmp_path)) == set()
