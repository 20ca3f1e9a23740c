"""Shared fixtures: fresh coordinator and store files per test, sync and async clients."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import stockade
from stockade.coordinators.registry import COORDINATORS
from stockade.testing.servers import reaper
from stockade.testing.servers.ports import free_port
from stockade.transport.io import unix_address

HELPERS = Path(__file__).parent / "helpers"
pytest_plugins = ["helpers.clean_checkout"]  # the run leaves the checkout as it found it

# The CLI's default data directory is per user ($XDG_STATE_HOME/stockade, else ~/.local/state/stockade): no
# test, nor any process a test starts, writes to the real home's. A test that uses the default sets its own.
_STATE_HOME = Path(tempfile.mkdtemp(prefix="stockade-tests-state-"))
os.environ["XDG_STATE_HOME"] = str(_STATE_HOME)
atexit.register(shutil.rmtree, _STATE_HOME, True)


def python_env() -> dict[str, str]:
    """Environment for child Python processes that import the tests' helpers."""
    env = dict(os.environ)
    # Absolute: a child may run in another working directory than the one PYTHONPATH=src was given in.
    given = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(HELPERS), *given])
    return env


PYTHON = sys.executable

#: How long a test's teardown waits for a host coordinator process it left to end after SIGTERM.
HOST_STOP_S = 10.0


def stop_host_processes(directory: Path) -> int:
    """SIGTERM every host coordinator process (``stockade serve --host-file``) listening on a ``*.db.sock`` under
    ``directory`` (found by the socket's peer credentials) and wait until each is gone; returns how many."""
    import signal
    import struct

    stopped = 0
    for sock_path in directory.rglob("*.sock") if directory.is_dir() else ():
        if not sock_path.with_name(sock_path.name[:-len(".sock")] + ".host").is_dir():
            continue  # not a coordinator file's socket
        sock = socket.socket(socket.AF_UNIX)
        try:
            with unix_address(str(sock_path)) as address:  # a path past sun_path's 108 bytes too
                sock.connect(address)
            pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        except OSError:
            continue  # nobody listens (it exited)
        finally:
            sock.close()
        try:
            if b"--host-file" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            os.kill(pid, signal.SIGTERM)
        except (OSError, ProcessLookupError):
            continue
        stopped += 1
        deadline = time.monotonic() + HOST_STOP_S
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
    return stopped


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie waiting for its reaper has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(autouse=True)
def _no_host_process_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that reached a coordinator file through its host process (``sqlite:///F``, the default) does not
    leave that process running for its 30 s idle exit: stopped at teardown, after the test's own fixtures."""
    yield
    tmp_path = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if isinstance(tmp_path, Path):
        stop_host_processes(tmp_path)

try:
    import httptools  # noqa: F401 - the server extra's parser
    #: The request parsers a `stockade serve` here can run (``--http-parser``); the tests of the HTTP layer run each.
    HTTP_PARSERS = ["httptools", "python"]
except ImportError:
    HTTP_PARSERS = ["python"]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path


class ServeProcess:
    """A real `stockade serve` on a free loopback port, its data in ``data_dir``."""

    STARTUP_S = 20

    def __init__(self, data_dir: Path, *extra: str, port: int | None = None,
                 entry: tuple[str, ...] = ("-m", "stockade", "serve")) -> None:
        """``entry``: what the interpreter runs, before the serve arguments (a control of
        tests/helpers/server_controls.py: ``(str(HELPERS / "server_controls.py"), CONTROL)``)."""
        self.data_dir = data_dir
        self.port = port or free_port()  # a restart on the same data takes the same port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir / "serve.log"
        data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [PYTHON, *entry, "--data-dir", str(data_dir), "--port", str(self.port), *extra],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=python_env(),
            )
        reaper.watch(self.process.pid)  # ended if this test process is killed
        deadline = time.monotonic() + self.STARTUP_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"stockade serve exited {self.process.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"stockade serve not ready after {self.STARTUP_S} s: {self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture
def serve(tmp_path: Path):
    """``serve(*extra_args)`` starts a `stockade serve` (stopped after the test)."""
    started: list[ServeProcess] = []

    def start(*extra: str, data_dir: Path | None = None) -> ServeProcess:
        server = ServeProcess(data_dir or tmp_path / f"serve{len(started)}", *extra)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


#: The conformance parameters, and the registered schemes each one runs (https: test_server's TLS test),
#: read from the registry: one parameter per backend folder, named after it (the SQLite one: "embedded").
_PARAMETER_OF_FOLDER = {"sqlite": "embedded"}
BACKENDS: dict[str, tuple[str, ...]] = {}
for _scheme, _entry in COORDINATORS.items():
    _name = _PARAMETER_OF_FOLDER.get(_entry.folder, _entry.folder)
    BACKENDS[_name] = (*BACKENDS.get(_name, ()), _scheme)
if os.environ.get("STOCKADE_LONG") == "1":  # a serve --coordinator per test: ~3 min (the default runs the core)
    BACKENDS["serve-postgres"] = ("http",)
#: The PostgreSQL backend on databases set otherwise than the fixtures' own (UTF8, the server's defaults), each
#: as a user's database may be: variant -> (encoding, the database's settings, ``ALTER DATABASE ... SET``). A
#: fresh database per test, in the session's server: a database setting reaches every session on that database
#: only (a role's would reach every database the role opens, the other tests' too), and the coordinator's
#: sessions must win over it as over a role's (a session's own SET outranks both). The coordinator
#: conformance suite runs every backend, and each variant once more (the cases of each:
#: tests/test_coordinator_conformance.py ``VARIANT_CASES``); the other files that take ``backend`` run the
#: registered backends only.
PG_VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "postgres-sql_ascii": ("SQL_ASCII", {}),
    "postgres-repeatable_read": ("UTF8", {"default_transaction_isolation": "repeatable read"}),
    "postgres-serializable": ("UTF8", {"default_transaction_isolation": "serializable"}),
}

#: The variants whose database defaults to a stricter isolation level than READ COMMITTED (the other
#: PostgreSQL-backed suites run their concurrent cases on these too).
PG_ISOLATION_VARIANTS = [name for name, (_, settings) in PG_VARIANTS.items()
                         if "default_transaction_isolation" in settings]


def registered_backend(backend: str) -> str:
    """The `BACKENDS` parameter that ``backend`` runs: itself, or ``postgres`` for a `PG_VARIANTS` one."""
    return "postgres" if backend in PG_VARIANTS else backend


@pytest.fixture(params=list(BACKENDS))
def backend(request) -> str:
    """Where the conformance tests run: every registered coordinator scheme.

    ``embedded``: the SQLite files; ``memory``: the in-process engine; ``http``:
    a real `stockade serve` subprocess. A new backend adds one parameter here.
    """
    return request.param


#: The parameters that are not a registry folder, each a url template as `CoordinatorBackend.test_url`.
_TEST_URLS = {"serve-postgres": "{serve_pg.url}", **dict.fromkeys(PG_VARIANTS, "{pg_variant_coord_url}")}


@pytest.fixture
def coord_url(backend: str, request) -> str:
    """A fresh url of ``backend`` for this test: its registry entry's ``test_url``, each field a fixture."""
    template = _TEST_URLS.get(backend) or next(
        url for url in (COORDINATORS[scheme].test_url for scheme in BACKENDS[backend]) if url)
    fixtures = {field.split(".")[0] for _, field, _, _ in string.Formatter().parse(template) if field}
    return template.format(**{name: request.getfixturevalue(name) for name in fixtures})


@pytest.fixture
def store_url(tmp_path: Path, backend: str, request) -> str:
    if backend in ("http", "serve-postgres"):
        return request.getfixturevalue("serve_pg" if backend == "serve-postgres" else "http_server").url
    if backend == "memory":
        return f"memory://{tmp_path.name}"  # the in-memory store beside the in-memory engine
    request.getfixturevalue("keyring_here")  # a store opened without keys= discovers it
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def keyring_here(tmp_path: Path, backend: str, request) -> Path:
    """The coordinator's keyring in ``tmp_path`` (as `stockade keys export` leaves it on a resource host), so
    that a store there opened without ``keys=`` finds it (L2: else it refuses to open)."""
    from stockade.keys import load_keyring, save_keyring

    path = tmp_path / "coord.keys"
    if backend == "embedded":
        return path  # the coordinator's own, beside coord.db
    if backend == "http":  # this fixture's server runs without auth: its keyring file, copied by hand
        keyring = load_keyring(request.getfixturevalue("http_server").data_dir / "coord.keys")
    else:
        with stockade.connect(request.getfixturevalue("coord_url")) as coord:
            keyring = coord.verify_keys().keyring
    save_keyring(path, keyring)
    return path


@contextlib.contextmanager
def fresh_pg_url(encoding: str = "UTF8", settings: dict[str, str] | None = None) -> Iterator[str]:
    """A fresh database in ``encoding`` with ``settings`` as its defaults on the session's PostgreSQL 15
    (stockade.testing.servers.postgres ``fresh_database``) as a url, dropped after."""
    from stockade.testing.servers import postgres as pg_helper

    if not pg_helper.available():
        if os.environ.get("CI") == "true":
            raise RuntimeError("PostgreSQL 15 is not installed (scripts/test.sh installs it)")
        pytest.skip("PostgreSQL 15 is not installed")
    server = pg_helper.shared_server()
    name = pg_helper.fresh_database(server, encoding, settings)
    yield server.url(name)
    pg_helper.drop_database(server, name)


@pytest.fixture
def pg_db():
    """A fresh database on the session's PostgreSQL 15: ``(server, name)``, dropped after."""
    from stockade.testing.servers import postgres as pg_helper

    server = pg_helper.shared_server()
    name = pg_helper.fresh_database(server)
    try:
        yield server, name
    finally:
        pg_helper.drop_database(server, name)


@pytest.fixture
def pg_coord_url():
    """A fresh database as a coordinator url (`fresh_pg_url`)."""
    with fresh_pg_url() as url:
        yield url


@pytest.fixture
def pg_variant_coord_url(backend: str):
    """A fresh database of the `PG_VARIANTS` variant ``backend`` as a coordinator url (`fresh_pg_url`)."""
    with fresh_pg_url(*PG_VARIANTS[backend]) as url:
        yield url


def _shared_root(config) -> Path | None:
    """The run's directory of shared servers (tests/helpers/shared_servers.py), in a worker of a run with workers."""
    given = getattr(config, "workerinput", {}).get("stockade_shared")
    return Path(given) if given else None


@pytest.fixture(scope="session")
def etcd_cluster(request, tmp_path_factory):
    """Three real etcd members on loopback ports (tests/helpers/etcd_cluster.py): the run's, shared by its
    workers (never pause or kill them: `own_cluster`), or this process's own in a run without workers."""
    from helpers.etcd_cluster import EtcdCluster, etcd_available

    if not etcd_available() and os.environ.get("CI") != "true":
        pytest.skip("etcd is not installed (scripts/test.sh installs it; CI never skips)")
    shared = _shared_root(request.config)
    if shared is not None:
        from helpers.shared_servers import attach

        yield attach("etcd", shared)
        return
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"))
    yield cluster
    cluster.stop()


def _require_zookeeper() -> None:
    from helpers.zk_ensemble import zookeeper_available

    if not zookeeper_available() and os.environ.get("CI") != "true":
        pytest.skip("ZooKeeper is not installed (scripts/test.sh installs it; CI never skips)")


@pytest.fixture(scope="session")
def zk_ensemble(request, tmp_path_factory):
    """Three real ZooKeeper 3.8 servers on loopback ports (tests/helpers/zk_ensemble.py): the run's, shared by
    its workers (never pause or kill them: `private_zk_ensemble`), or this process's own in a run without
    workers."""
    from helpers.zk_ensemble import ZkEnsemble

    _require_zookeeper()
    shared = _shared_root(request.config)
    if shared is not None:
        from helpers.shared_servers import attach

        yield attach("zookeeper", shared)
        return
    ensemble = ZkEnsemble(tmp_path_factory.mktemp("zk"))
    yield ensemble
    ensemble.stop()


@pytest.fixture(scope="module")
def private_zk_ensemble(request, tmp_path_factory):
    """An ensemble whose servers a test may pause, kill and restart (it leaves them all serving): the session's
    in a run without workers (it is this process's alone), else one for this module's tests on this worker."""
    from helpers.zk_ensemble import ZkEnsemble

    _require_zookeeper()
    if _shared_root(request.config) is None:
        yield request.getfixturevalue("zk_ensemble")
        return
    ensemble = ZkEnsemble(tmp_path_factory.mktemp("zk-own"))
    yield ensemble
    ensemble.stop()


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """pytest's `tmp_path`, its name prefixed with the worker's id (``gw3-…``) in a run with workers: tests name
    their namespace on the run's shared etcd and ZooKeeper after it, and pytest numbers names per worker.
    Named back afterwards, so that pytest's retention (pyproject.toml: a passed test's directory goes) finds it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        yield tmp_path
        return
    named = tmp_path.with_name(f"{worker}-{tmp_path.name}")
    tmp_path.rename(named)
    yield named
    with contextlib.suppress(OSError):
        named.rename(tmp_path)


@pytest.fixture
def http_server(serve) -> ServeProcess:
    """The one server a test's coordinator and store urls both point at."""
    return serve()


class ClientDelayed:
    """The backend under test opened with ``connect(url, lock_delay_ms=...)`` (C5 in the client or its engine)."""

    def __init__(self, url: str, lock_delay_ms: int, not_restartable: str | None) -> None:
        self.url, self.lock_delay_ms, self.not_restartable = url, lock_delay_ms, not_restartable

    def connect(self, client):
        return client.connect(self.url, lock_delay_ms=self.lock_delay_ms)

    def restart(self) -> None:
        """Nothing outlives the handles here (the file, the database, etcd and ZooKeeper keep the state): the
        handles opened after are the restarted coordinator."""


class ServedDelayed:
    """A `stockade serve --lock-delay-ms` (C5 in the server); a restart stops it and starts it on its data."""

    not_restartable = None

    def __init__(self, serve, lock_delay_ms: int, data_dir: Path, *extra: str) -> None:
        self.lock_delay_ms = lock_delay_ms
        self._serve, self._data_dir, self._args = serve, data_dir, ("--lock-delay-ms", str(lock_delay_ms), *extra)
        self.server = serve(*self._args, data_dir=data_dir)

    def connect(self, client):
        return client.connect(self.server.url)

    def restart(self) -> None:
        self.server.stop()
        self.server = self._serve(*self._args, data_dir=self._data_dir)


#: A served coordinator's restart is a new `stockade serve` process, 2.3-3.2 s to ready at load 8 here: a
#: restart test's lock-delay is at least this, so that the restart lands while the delay is pending.
SERVE_RESTART_LOCK_DELAY_MS = 8_000


@pytest.fixture
def delayed_backend(backend: str, serve, tmp_path: Path, request):
    """``delayed_backend(lock_delay_ms, restart=False)``: the backend under test with a lock-delay, for the
    suite's C5 tests; with ``restart``, a served one takes a delay its restart fits in."""

    def make(lock_delay_ms: int, *, restart: bool = False):
        if backend in ("http", "serve-postgres"):
            extra = ("--coordinator", request.getfixturevalue("pg_coord_url")) if backend == "serve-postgres" else ()
            if restart:
                lock_delay_ms = max(lock_delay_ms, SERVE_RESTART_LOCK_DELAY_MS)
            return ServedDelayed(serve, lock_delay_ms, tmp_path / "served-delayed", *extra)
        why = ("an in-process coordinator lives and dies with its process: nothing outlives it to restart from"
               if backend == "memory" else None)
        return ClientDelayed(request.getfixturevalue("coord_url"), lock_delay_ms, why)

    return make


#: The per-request wait cap of the served coordinator the wait-until-granted tests run on: a few caps pass
#: in a fraction of a second.
WAIT_CAP_MS = 100


@dataclass(frozen=True)
class CappedWait:
    """The ``capped_wait`` of the conformance suite (`stockade.testing.conformance.coordinator.CappedWait`)."""

    url: str
    cap_ms: int | None
    uncapped: str | None




@pytest.fixture(scope="session")
def capped_server(tmp_path_factory) -> Iterator[ServeProcess]:
    """One `stockade serve --wait-ms-cap` for the session (its tests use scopes of their own)."""
    server = ServeProcess(tmp_path_factory.mktemp("capped"), "--wait-ms-cap", str(WAIT_CAP_MS))
    yield server
    server.stop()


@pytest.fixture
def capped_wait(backend: str, request) -> CappedWait:
    if backend == "http":
        return CappedWait(request.getfixturevalue("capped_server").url, WAIT_CAP_MS, None)
    if backend == "serve-postgres":
        server = request.getfixturevalue("serve")("--coordinator", request.getfixturevalue("pg_coord_url"),
                                                  "--wait-ms-cap", str(WAIT_CAP_MS))
        return CappedWait(server.url, WAIT_CAP_MS, None)
    # Why this backend has no per-request wait cap, in its registry entry's words.
    why = COORDINATORS[BACKENDS[registered_backend(backend)][0]].waits_in_one_call
    return CappedWait(request.getfixturevalue("coord_url"), None, why)


@pytest.fixture
def serve_pg(serve, pg_coord_url) -> ServeProcess:
    """A `stockade serve --coordinator` over a fresh PostgreSQL database (``serve-postgres``)."""
    return serve("--coordinator", pg_coord_url)


class SyncRunner:
    """Runs the same test body against the sync client."""

    mode = "sync"

    def connect(self, url, **options):
        return stockade.connect(url, **options)

    def open_store(self, url, **kw):
        return stockade.open_store(url, **kw)

    def run(self, value):
        return value


class AsyncRunner:
    """Runs the same test body against the async client, one event loop per test."""

    mode = "async"

    def __init__(self):
        self.loop = asyncio.new_event_loop()

    def connect(self, url, **options):
        return stockade.connect_async(url, **options)

    def open_store(self, url, **kw):
        return stockade.open_store_async(url, **kw)

    def run(self, value):
        if asyncio.iscoroutine(value):
            return self.loop.run_until_complete(value)
        return value

    def close(self):
        self.loop.close()


@contextlib.contextmanager
def runner_of(mode: str) -> Iterator[SyncRunner | AsyncRunner]:
    """The ``client`` fixture's runner for ``mode`` ("sync" or "async"); an async one's loop closed after."""
    runner = SyncRunner() if mode == "sync" else AsyncRunner()
    try:
        yield runner
    finally:
        if isinstance(runner, AsyncRunner):
            runner.close()


@pytest.fixture(params=["sync", "async"])
def client(request):
    """``client.run(x)`` awaits x under async and passes it through under sync."""
    with runner_of(request.param) as runner:
        yield runner



#: The slowest tests of a measured default run, "seconds node-id" a line (tests/slow_first.txt). They are
#: collected first, slowest first, so that pytest-xdist hands them out at the start and none of them starts
#: late and holds the run's end. Only an order: a test missing from the file keeps its place after them.
SLOW_FIRST = Path(__file__).parent / "slow_first.txt"


def _recorded_seconds() -> dict[str, float]:
    seconds: dict[str, float] = {}
    if SLOW_FIRST.exists():
        for line in SLOW_FIRST.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                figure, nodeid = line.split(maxsplit=1)
                seconds[nodeid] = float(figure)
    return seconds


#: The backstop for one test of a long run (pyproject.toml's ``timeout`` is the default run's).
LONG_TIMEOUT_S = 3600


def pytest_collection_modifyitems(config, items) -> None:
    recorded = _recorded_seconds()
    items.sort(key=lambda item: -recorded.get(item.nodeid, 0.0))  # stable: the others keep their order
    if os.environ.get("STOCKADE_LONG") == "1":  # the long runs' rounds take longer than the default backstop
        for item in items:
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S))


def pytest_configure(config) -> None:
    # pytest-xdist's load scheduling sends each worker a block of about a twelfth of the tests at the start,
    # and more blocks later: the slow tests, collected first, would all land on one worker, and a worker
    # would hold a queue while the others idle at the end. Two at a time, a test starts on the first
    # worker free (unless --maxschedchunk was given).
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 2


#: The stash key of the run's shared-server directory, in the controller of a run with workers.
_SHARED = pytest.StashKey[Path]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist's controller, for each worker it starts: the run's directory of shared servers
    (tests/helpers/shared_servers.py), made with the first worker."""
    from helpers.shared_servers import prepare

    config = node.config
    if _SHARED not in config.stash:
        config.stash[_SHARED] = Path(tempfile.mkdtemp(prefix="stockade-shared-"))
        prepare(config.stash[_SHARED])
    node.workerinput["stockade_shared"] = str(config.stash[_SHARED])


def pytest_unconfigure(config) -> None:
    if _SHARED in config.stash:  # the controller, after every worker ended
        from helpers.shared_servers import stop_shared

        stop_shared(config.stash[_SHARED])
