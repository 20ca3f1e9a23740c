"""The release: `python -m build` makes an sdist and a pure-Python wheel, and the wheel works with no source tree.

The wheel goes into one fresh virtualenv, made by Debian's python3 (``/usr/bin/python3 -m venv``) as a non-root
user (``nobody`` when the tests run as root, as in CI; else the user running them), in a directory of its own
under the temporary directory. Every command there runs with that directory's ``work/`` as its working
directory, no ``PYTHONPATH`` and a clean environment, so nothing of this checkout can be imported. The bare
wheel, installed by README's first command, runs ``pip check``, ``stockade --version``, ``stockade demo`` and
README's first Python example, and ``stockade serve`` (its pure-Python parser: httptools is not installed)
answers one lock cycle over HTTP from the installed client; then the ``server`` extra goes into the same
virtualenv and ``stockade serve`` (now on httptools) answers one again. pip takes the dependencies from the
package index the machine is configured for; its cache is in the temporary directory and goes with it.

The build and the virtualenv are one test: split, pytest-xdist could run each half on its own worker, each with
its own build.
"""

from __future__ import annotations

import email.parser
import os
import pwd
import re
import resource
import select
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.docblocks import blocks

from stockade.testing.servers import reaper

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEBIAN_PYTHON = Path("/usr/bin/python3")
# What `python -m build` reads from a checkout (MANIFEST.in says what the sdist takes of it).
SOURCE = ["pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md",
          "src", "docs", "tests", "examples", "scripts", "benchmarks", "clients"]
IGNORED = shutil.ignore_patterns("__pycache__", "*.py[cod]", "*.egg-info", "node_modules", "dist", "build",
                                 ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", "stockade-data")
# Passed on to pip, so that it reaches the index the way this machine is configured to.
PASSED = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "PIP_INDEX_URL",
          "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_CERT", "SSL_CERT_FILE")
EXTRAS = {"server", "postgres", "redis", "etcd", "zookeeper", "sqlalchemy"}
WITH_SERVER = 'pip install "$(ls dist/stockade-*.whl)[server]"'


def _version() -> str:
    text = (ROOT / "src" / "stockade" / "__init__.py").read_text()
    found = re.findall(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    assert len(found) == 1, found
    return found[0]


def test_one_version_source_and_the_all_extra() -> None:
    """pyproject.toml reads the version from ``stockade.__version__``; ``all`` is every other extra together."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "stockade.__version__"}
    extras = project["project"]["optional-dependencies"]
    assert EXTRAS | {"all", "test"} == set(extras)
    assert sorted(extras["all"]) == sorted({req for name in EXTRAS for req in extras[name]})


class Sandbox:
    """A directory under /tmp that belongs to a non-root user, and commands run there as that user."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.ids = self._non_root_user()
        for name in ("home", "work", "pip-cache"):
            (base / name).mkdir()
        if self.ids is not None:
            for path in (base, *base.iterdir()):
                os.chown(path, *self.ids)
        self.work = base / "work"
        self.venv = base / "venv"
        self.env = {"PATH": f"{self.venv / 'bin'}:/usr/bin:/bin", "HOME": str(base / "home"), "LANG": "C.UTF-8",
                    "PIP_CACHE_DIR": str(base / "pip-cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                    "PIP_NO_INPUT": "1", **{name: os.environ[name] for name in PASSED if name in os.environ}}

    @staticmethod
    def _non_root_user() -> tuple[int, int] | None:
        if os.geteuid() != 0:
            return None  # already one
        try:
            entry = pwd.getpwnam("nobody")
        except KeyError:  # not on this system: a user of our own, made once
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                            "stockade-package"], capture_output=True)
            entry = pwd.getpwnam("stockade-package")
        return entry.pw_uid, entry.pw_gid

    def _as_user(self) -> dict[str, Any]:
        if self.ids is None:
            return {}
        return {"user": self.ids[0], "group": self.ids[1], "extra_groups": []}

    def run(self, *command: str | Path, timeout: float = 300) -> str:
        """Run ``command`` in ``work/`` as the user; its output, or a failure with both streams."""
        result = subprocess.run([str(part) for part in command], cwd=self.work, env=self.env, capture_output=True,
                                text=True, timeout=timeout, stdin=subprocess.DEVNULL, **self._as_user())
        assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def refused(self, *command: str | Path) -> tuple[int, str]:
        result = subprocess.run([str(part) for part in command], cwd=self.work, env=self.env, capture_output=True,
                                text=True, timeout=120, stdin=subprocess.DEVNULL, **self._as_user())
        return result.returncode, result.stderr

    def popen(self, *command: str | Path, log: Path) -> subprocess.Popen[str]:
        """Start ``command`` as the user: its stdout a pipe, its stderr into ``log``."""
        with open(log, "wb") as stderr:
            process = subprocess.Popen([str(part) for part in command], cwd=self.work, env=self.env, text=True,
                                       stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                       **self._as_user())
        reaper.watch(process.pid)  # ended if this test process is killed
        return process


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    # Not pytest's tmp_path: its parents are private to the user running the tests.
    base = Path(tempfile.mkdtemp(prefix="stockade-package-"))
    try:
        yield Sandbox(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _build(tmp_path: Path) -> tuple[Path, Path]:
    """``python -m build`` on a copy of the checkout (the build writes its egg-info beside the sources)."""
    source = tmp_path / "source"
    for name in SOURCE:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=IGNORED)
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(path, source / name)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PIP_CACHE_DIR"] = str(tmp_path / "pip-cache")
    result = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(source)],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    version = _version()
    built = {path.name for path in (tmp_path / "dist").iterdir()}
    assert built == {f"stockade-{version}.tar.gz", f"stockade-{version}-py3-none-any.whl"}, built
    return tmp_path / "dist" / f"stockade-{version}.tar.gz", tmp_path / "dist" / f"stockade-{version}-py3-none-any.whl"


def _check_wheel(wheel: Path) -> None:
    """Pure Python, the package data in it, and the metadata a package index shows."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"stockade-{_version()}.dist-info"
        assert "Root-Is-Purelib: true" in archive.read(f"{info}/WHEEL").decode()
        assert not [n for n in names if n.endswith((".so", ".pyd", ".c", ".pyx"))]
        shipped = ["stockade/py.typed", *(f"stockade/server/static/{p.name}"
                                          for p in (ROOT / "src" / "stockade" / "server" / "static").iterdir())]
        for name in shipped:
            assert archive.read(name) == (ROOT / "src" / name).read_bytes(), name
        assert not [n for n in names if n.startswith(("tests/", "docs/"))]
        metadata = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    assert metadata["Version"] == _version() and metadata["Requires-Python"] == ">=3.11"
    assert metadata["License-Expression"] == "Apache-2.0" and metadata["Summary"]
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert str(metadata.get_payload()).startswith("# stockade")  # README as the long description
    assert set(metadata.get_all("Provides-Extra", [])) == EXTRAS | {"all", "test"}
    assert "Typing :: Typed" in metadata.get_all("Classifier", [])
    assert metadata.get_all("Project-URL") is None  # no address is known yet: none is made up


def _readme_first_command() -> str:
    first = next(b for b in blocks(README) if b.lang)
    assert first.lang == "sh", first.where
    command = first.code.strip().splitlines()[0].split("#")[0].strip()
    assert command == "pip install dist/stockade-*.whl", (first.where, command)
    return command


def _readme_python_example() -> str:
    return next(b for b in blocks(README) if b.lang == "python").code


def _serve(sandbox: Sandbox, parser: str) -> tuple[subprocess.Popen[str], str]:
    log = sandbox.base / f"serve-{parser}.log"
    process = sandbox.popen("stockade", "serve", "--port", "0", "--data-dir", sandbox.work / f"serve-{parser}",
                            "--http-parser", parser, log=log)
    assert process.stdout is not None
    ready, deadline = "", time.monotonic() + 60
    while not ready.endswith("\n") and time.monotonic() < deadline:
        if select.select([process.stdout], [], [], 1)[0]:
            chunk = process.stdout.readline()
            if not chunk:
                break
            ready += chunk
    assert ready.startswith("stockade serve: listening on http://127.0.0.1:"), (ready, process.poll(), log.read_text())
    return process, ready.split()[-1]


def _serve_one_cycle(sandbox: Sandbox, python: Path, parser: str) -> None:
    """``stockade serve --http-parser PARSER`` answers a lock cycle and a fenced write from the installed client."""
    server, url = _serve(sandbox, parser)
    try:
        (sandbox.work / "cycle.py").write_text(LOCK_CYCLE)
        cycle = sandbox.run(python, "cycle.py", url, timeout=60)
    finally:
        server.terminate()
        server.wait(30)
        reaper.unwatch(server.pid)
    assert cycle.startswith(str(sandbox.venv / "lib")) and "item b'written'" in cycle, cycle


class Laps:
    """Wall time per step, and the CPU time of every child process (the figure line)."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()
        self.steps: list[str] = []
        self.cpu = self._children_cpu()

    @staticmethod
    def _children_cpu() -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # of the children ended and waited for
        return children.ru_utime + children.ru_stime

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.steps.append(f"{name} {now - self.last:.1f} s")
        self.last = now

    def __str__(self) -> str:
        return (f"{', '.join(self.steps)}; {time.monotonic() - self.start:.1f} s wall, "
                f"{self._children_cpu() - self.cpu:.1f} s CPU in its child processes")


LOCK_CYCLE = """
import sys

import stockade

url = sys.argv[1]
coord, store = stockade.connect(url), stockade.open_store(url)
with coord.lock("release-check", ttl_ms=10_000, wait_ms=5_000) as lease:
    store.put("release-check", "item", b"written", token=lease.token)
    lease.renew()
second = coord.acquire("release-check", ttl_ms=10_000)
assert second.token.value > lease.token.value
second.release()
print(stockade.__file__)
print(f"tokens {lease.token.value} < {second.token.value}; item {store.get('release-check', 'item').value!r}")
"""


@pytest.mark.skipif(not DEBIAN_PYTHON.is_file(), reason="needs Debian's python3 at /usr/bin/python3")
def test_the_wheel_installs_and_runs_without_the_source_tree(tmp_path: Path, sandbox: Sandbox) -> None:
    laps = Laps()
    sdist, wheel = _build(tmp_path)
    laps("build")
    _check_wheel(wheel)
    # the control: the same check on a copy of the wheel without one of the server's static files fails
    stripped = tmp_path / "stripped" / wheel.name
    stripped.parent.mkdir()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(stripped, "w") as copy:
        for item in source.infolist():
            if item.filename != "stockade/server/static/dashboard.js":
                copy.writestr(item, source.read(item))
    with pytest.raises(KeyError, match="dashboard.js"):
        _check_wheel(stripped)
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
    for name in ("CHANGELOG.md", "LICENSE", "README.md", "pyproject.toml", "src/stockade/py.typed",
                 "src/stockade/server/static/dashboard.js", "tests/conftest.py", "docs/rules.md"):
        assert f"stockade-{_version()}/{name}" in names, name

    (sandbox.work / "dist").mkdir()
    shutil.copy(wheel, sandbox.work / "dist" / wheel.name)
    os.chmod(sandbox.work / "dist", 0o755)
    sandbox.run(DEBIAN_PYTHON, "-m", "venv", sandbox.venv)
    laps("venv")
    # the control: outside the virtualenv, this checkout is nowhere on the path
    status, stderr = sandbox.refused(DEBIAN_PYTHON, "-c", "import stockade")
    assert status == 1 and "No module named 'stockade'" in stderr, stderr
    python = sandbox.venv / "bin" / "python"
    sandbox.run("bash", "-euo", "pipefail", "-c", _readme_first_command())
    sandbox.run(python, "-m", "pip", "check")
    laps("install")
    where = sandbox.run(python, "-c", "import stockade, sys; print(stockade.__file__); print(sys.path)")
    assert where.startswith(str(sandbox.venv / "lib")) and str(ROOT) not in where, where
    assert sandbox.run("stockade", "--version") == f"stockade {_version()}\n"

    demo = sandbox.run("stockade", "demo", timeout=120)
    assert "fencing held" in demo, demo
    (sandbox.work / "example.py").write_text(_readme_python_example())
    example = sandbox.run(python, "example.py")
    assert example.startswith("stk"), example
    laps("demo and example")
    _serve_one_cycle(sandbox, python, "python")
    laps("serve on the base install")

    assert README.read_text().count(WITH_SERVER) >= 2  # how README installs an extra, run as written
    sandbox.run("bash", "-euo", "pipefail", "-c", WITH_SERVER)
    sandbox.run(python, "-m", "pip", "check")
    laps("server extra")
    _serve_one_cycle(sandbox, python, "httptools")
    laps("serve and cycle")
    print(f"\npackage: {laps}")

