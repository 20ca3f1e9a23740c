"""A pytest plugin: the test run leaves the checkout as it found it.

Tests run in temporary directories; one that writes into the checkout (a docs
example's relative ``app-data/``, a database, a screenshot) would be committed
by the next ``git add -A``. The controller (not an xdist worker) notes the
untracked and changed files before the run and fails the run when it ends with
new ones. Outside a git checkout, or without git, it does nothing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_BEFORE = pytest.StashKey[frozenset[str]]()


def _dirty() -> frozenset[str] | None:
    """Paths git reports as untracked or changed (ignored files excluded), or None if git cannot say."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return frozenset(line[3:] for line in done.stdout.splitlines())


def new_paths(before: frozenset[str], after: frozenset[str]) -> list[str]:
    return sorted(after - before)


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    before = _dirty()
    if before is not None and _is_controller(session.config):
        session.config.stash[_BEFORE] = before


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_BEFORE, None)
    after = _dirty() if before is not None else None
    if before is None or after is None:
        return
    left = new_paths(before, after)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the test run left {len(left)} new file(s) in the checkout: {', '.join(left[:10])}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
