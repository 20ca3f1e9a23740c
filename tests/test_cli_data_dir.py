"""Where the CLI's coordinator lives when none is named: one place per user, never the working directory.

The finding: `stockade lock nightly -- job` run from two working directories
created ``./stockade-data`` in each, and both held ``nightly`` at once;
nothing said a new coordinator was made. Now the default is
``$XDG_STATE_HOME/stockade`` (else ``~/.local/state/stockade``), creating a
coordinator prints one line naming it, and a ``./stockade-data`` of the old
default in the working directory is refused unless named.

Every test here gives the processes a home and a state directory of their own
(``HOME``, ``XDG_STATE_HOME`` under ``tmp_path``): nothing touches the real home.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import python_env

from stockade.cli import _common

STOCKADE = [sys.executable, "-m", "stockade"]
ROUNDS = 3
EXIT_LOCK_TIMEOUT = 75
# Holds the lease until the file named by its argument exists; says so first (order, not sleeps).
HOLD = ("import pathlib, sys, time\n"
        "print('holding', flush=True)\n"
        "while not pathlib.Path(sys.argv[1]).exists():\n"
        "    time.sleep(0.02)\n")


def user_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in python_env().items() if not k.startswith("STOCKADE_")}
    env.update(HOME=str(tmp_path / "home"), XDG_STATE_HOME=str(tmp_path / "state"), **extra)
    return env


def cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STOCKADE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def second_lock_while_first_holds(tmp_path: Path, scope: str, *options: str) -> tuple[int, str, str]:
    """`stockade lock SCOPE` holds from ``a/``; the same from ``b/`` tries. Returns b's exit, a's and b's stderr."""
    env = user_env(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(exist_ok=True)
    b.mkdir(exist_ok=True)
    release = tmp_path / f"release-{scope}"
    holder = subprocess.Popen([*STOCKADE, "lock", scope, *options, "--", sys.executable, "-c", HOLD, str(release)],
                              cwd=a, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"  # a holds the lease now
        second = cli("lock", scope, *options, "--", sys.executable, "-c", "pass", cwd=b, env=env)
    finally:
        release.touch()
        _, holder_err = holder.communicate(timeout=60)
    assert holder.returncode == 0, holder_err
    return second.returncode, holder_err, second.stderr


def test_two_working_directories_reach_one_coordinator(tmp_path: Path) -> None:
    """Two real `stockade lock` processes from two cwds: the second is refused the lock while the first holds it."""
    state = tmp_path / "state" / "stockade"
    held_twice = 0
    created: list[list[str]] = []
    for round_ in range(ROUNDS):
        code, holder_err, second_err = second_lock_while_first_holds(tmp_path, f"nightly-{round_}")
        held_twice += code != EXIT_LOCK_TIMEOUT
        created.append([line for line in (holder_err + second_err).splitlines() if "created a new coordinator" in line])
    print(f"\n[figure] one lock from two working directories: held twice in {held_twice} of {ROUNDS}")
    assert held_twice == 0, second_err
    # one line, naming it, the first time only
    assert created[0] == [f"stockade: created a new coordinator at {state / 'coord.db'} "
                          "(other hosts reach it through 'stockade serve' and --url)"]
    assert created[1:] == [[]] * (ROUNDS - 1)
    assert list(tmp_path.glob("*/stockade-data")) == []  # no coordinator in either cwd


def test_control_the_old_default_gives_each_directory_its_own_lock(tmp_path: Path) -> None:
    """The control: the old default spelled out (``--data-dir stockade-data``, relative) holds one lock twice."""
    held_twice = 0
    for round_ in range(ROUNDS):
        code, _, second_err = second_lock_while_first_holds(tmp_path, f"nightly-{round_}", "--data-dir",
                                                             "stockade-data")
        held_twice += code == 0
    print(f"\n[figure] control (./stockade-data per cwd): held twice in {held_twice} of {ROUNDS}")
    assert held_twice == ROUNDS, second_err
    assert sorted(p.parent.parent.name for p in tmp_path.glob("*/stockade-data/coord.db")) == ["a", "b"]


def test_a_coordinator_of_the_old_default_in_the_cwd_is_refused_naming_both(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    old = cli("lock", "x", "--data-dir", "stockade-data", "--", "true", cwd=tmp_path, env=env)
    assert old.returncode == 0, old.stderr
    state = tmp_path / "state" / "stockade"
    for command in (["lock", "x", "--", "true"], ["status"], ["history", "x"], ["kv", "get", "x", "k"],
                    ["keys", "show"], ["serve", "--port", "0"]):
        done = cli(*command, cwd=tmp_path, env=env)
        assert done.returncode in (1, 2), (command, done.stderr)
        assert "stockade-data in the working directory holds a coordinator" in done.stderr, (command, done.stderr)
        assert f"the default is now {state}" in done.stderr and "--data-dir stockade-data" in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not state.exists()  # refused: nothing created in the default either
    # named, it is used: by the option, or by the variable
    assert cli("lock", "x", "--data-dir", "stockade-data", "--", "true", cwd=tmp_path, env=env).returncode == 0
    named = cli("status", cwd=tmp_path, env={**env, "STOCKADE_DATA": str(tmp_path / "stockade-data")})
    assert named.returncode == 0 and "\nx " in named.stdout, named.stderr


def test_the_default_follows_xdg_state_home_and_ignores_a_relative_one(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert _common.default_data_dir() == tmp_path / "xdg" / "stockade"
    for ignored in ("relative/state", ""):  # the XDG spec: a relative path is invalid and ignored
        monkeypatch.setenv("XDG_STATE_HOME", ignored)
        assert _common.default_data_dir() == tmp_path / "home" / ".local" / "state" / "stockade"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert _common.default_data_dir() == tmp_path / "home" / ".local" / "state" / "stockade"


def test_serve_uses_the_same_default_and_names_what_it_created(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    server = subprocess.Popen([*STOCKADE, "serve", "--port", "0"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        listening = server.stdout.readline()
        assert listening.startswith("stockade serve: listening on http://127.0.0.1:"), listening
        created = server.stdout.readline()
        # One request first: a SIGTERM sent the instant the ready line is out can be lost (the loop is not
        # running yet; seen in 5 of 20 on the code before this change too), and the server then runs on.
        url = listening.strip().rsplit(" ", 1)[-1]
        with urllib.request.urlopen(f"{url}/healthz", timeout=30) as answer:
            assert answer.status == 200
    finally:
        server.terminate()
        _, err = server.communicate(timeout=60)
    state = tmp_path / "state" / "stockade"
    assert created == (f"stockade serve: created a new coordinator at {state / 'coord.db'} "
                       "(clients reach it through this url)\n")
    assert "created" not in err  # stderr holds the JSON logs alone
    assert (state / "coord.db").is_file() and not (tmp_path / "stockade-data").exists()
    # a lock from another directory without --url reaches the same files (the server holds no lock on them)
    other = tmp_path / "other"
    other.mkdir()
    done = cli("lock", "shared", "--", "true", cwd=other, env=env)
    assert done.returncode == 0 and "created" not in done.stderr, done.stderr


def test_demo_without_a_data_dir_leaves_the_default_alone(tmp_path: Path) -> None:
    done = cli("demo", cwd=tmp_path, env=user_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "stockade-data").exists()
