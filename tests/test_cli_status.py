"""``stockade status`` reads without writing: read-only data directory, full disk, no file created.

The tests run as root, for whom ``chmod 0555`` does not bite, so the read-only
directory is a real read-only bind mount and the full disk a real full tmpfs,
each in a private mount namespace (``unshare -m``) that dies with the command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import python_env

STOCKADE = [sys.executable, "-m", "stockade"]

PUT = ("import os, stockade; d = os.environ['STOCKADE_DATA']; c = stockade.connect('sqlite:///' + d + '/coord.db'); "
       "s = stockade.open_store('sqlite:///' + d + '/store.db', cluster_id=c.cluster_id); "
       "s.put('jobs', 'k', b'v', token=os.environ['STOCKADE_TOKEN'])")
HOLD = "import time; print('in', flush=True); time.sleep(300)"


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


needs_mount_namespace = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _can_unshare(), reason="needs unshare -m and mount (root)"
)


def env_for(data: Path) -> dict[str, str]:
    return {**python_env(), "STOCKADE_DATA": str(data)}


def populate(data: Path) -> None:
    result = subprocess.run(STOCKADE + ["lock", "jobs", "--", sys.executable, "-c", PUT], env=env_for(data),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def hold(data: Path, scope: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen(STOCKADE + ["lock", scope, "--", sys.executable, "-c", HOLD], env=env_for(data),
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "in"
    return holder


def stop(holder: subprocess.Popen[str]) -> None:
    holder.terminate()
    holder.wait(timeout=60)
    holder.stdout.close()


def rows(stdout: str) -> dict[str, dict]:
    return {row["scope"]: row for row in map(json.loads, stdout.splitlines())}


def status_in_namespace(data: Path, setup: str) -> subprocess.CompletedProcess[str]:
    """``stockade status --json`` after ``setup`` (shell, $D is the data dir) in a private mount namespace."""
    script = f'set -e; D="$1"; shift; {setup}; exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(data), *STOCKADE, "status", "--json", "--data-dir", str(data)],
        capture_output=True, text=True, env=python_env(), timeout=60,
    )


EXPECTED_JOBS = {"scope": "jobs", "state": "free", "holder": None, "token": None, "last_token": "the one grant",
                 "remaining_ms": 0, "waiters": 0, "high_water": "the one grant"}


def relative(found: dict[str, dict]) -> dict[str, dict]:
    """Token values depend on the epoch: check that the one grant's token is both marks, then name it."""
    for row in found.values():
        if row.get("last_token") and row.get("last_token") == row.get("high_water"):
            row["last_token"] = row["high_water"] = "the one grant"
    return found


@needs_mount_namespace
def test_status_on_read_only_data_dir(tmp_path):
    data = tmp_path / "data"
    populate(data)
    data.chmod(0o555)
    ro = 'mount -o bind,ro "$D" "$D"'
    try:
        result = status_in_namespace(data, ro)  # every change checkpointed: no WAL
        assert result.returncode == 0, result.stderr
        assert relative(rows(result.stdout)) == {"jobs": EXPECTED_JOBS}
        data.chmod(0o755)
        holder = hold(data, "busy")  # a live WAL: read through it, read-only
        try:
            result = status_in_namespace(data, ro)
            assert result.returncode == 0, result.stderr
            busy = rows(result.stdout)["busy"]
            assert busy["state"] == "held" and busy["token"] == busy["last_token"] > 0 and busy["remaining_ms"] > 0
            assert relative(rows(result.stdout))["jobs"] == EXPECTED_JOBS
        finally:
            stop(holder)
    finally:
        data.chmod(0o755)


@needs_mount_namespace
def test_status_on_full_disk(tmp_path):
    data = tmp_path / "data"
    populate(data)
    staged = tmp_path / "staged"
    shutil.copytree(data, staged, ignore=shutil.ignore_patterns("*.sock"))  # the host process's socket stays
    # copy the data onto a small tmpfs over the data dir (8 MiB: the host process's record log is 4 MiB), then fill it
    fill = ('mount -t tmpfs -o size=8m tmpfs "$D" && cp -a "$0"/. "$D"/ && '
            '(dd if=/dev/zero of="$D/filler" bs=4k 2>/dev/null || true) && '
            'if (echo x > "$D/probe") 2>/dev/null; then echo "disk not full" >&2; exit 99; fi')
    script = f'set -e; D="$1"; shift; {fill}; exec "$@"'
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, str(staged), str(data),
         *STOCKADE, "status", "--json", "--data-dir", str(data)],
        capture_output=True, text=True, env=python_env(), timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert relative(rows(result.stdout)) == {"jobs": EXPECTED_JOBS}


def test_status_creates_no_file(tmp_path):
    data = tmp_path / "data"
    populate(data)
    before = sorted(os.listdir(data))
    result = subprocess.run(STOCKADE + ["status", "--json"], env=env_for(data), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(data)) == before
    holder = hold(data, "busy")
    try:
        # The holder's keepalive makes its own renewal file (coord.db.renew) whenever it first renews: not status's.
        during = [name for name in sorted(os.listdir(data)) if not name.endswith(".renew")]
        result = subprocess.run(STOCKADE + ["status", "--json"], env=env_for(data), capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0 and rows(result.stdout)["busy"]["state"] == "held", result.stderr
        assert [name for name in sorted(os.listdir(data)) if not name.endswith(".renew")] == during
    finally:
        stop(holder)


def test_status_on_bad_files_is_a_clear_error(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "coord.db").write_bytes(b"this is not a database" * 100)
    result = subprocess.run(
        STOCKADE + ["status"], env=env_for(data), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "coord.db" in result.stderr
    assert sorted(os.listdir(data)) == ["coord.db"]


@needs_mount_namespace
def test_demo_on_read_only_data_dir_is_a_clear_error(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'set -e; mount -o bind,ro "$1" "$1"; shift; exec "$@"', "sh", str(data),
         *STOCKADE, "demo", "--data-dir", str(data)],
        capture_output=True, text=True, env=python_env(), timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot write in it" in result.stderr and "Traceback" not in result.stderr, result.stderr
