"""The clean-checkout plugin (tests/helpers/clean_checkout.py) sees a file a test run leaves behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import python_env

ROOT = Path(__file__).resolve().parent.parent


def _pytest_in(checkout: Path, test_body: str) -> subprocess.CompletedProcess[str]:
    (checkout / "tests").mkdir(parents=True)
    (checkout / "tests" / "helpers").mkdir()
    (checkout / "tests" / "helpers" / "__init__.py").write_text("")
    plugin = (ROOT / "tests" / "helpers" / "clean_checkout.py").read_text()
    (checkout / "tests" / "helpers" / "clean_checkout.py").write_text(plugin)
    (checkout / "tests" / "conftest.py").write_text('pytest_plugins = ["helpers.clean_checkout"]\n')
    (checkout / "tests" / "test_one.py").write_text(f"from pathlib import Path\n\ndef test_it():\n{test_body}\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(checkout), *args], check=True, capture_output=True)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=checkout,
                          env=python_env(), capture_output=True, text=True, timeout=120)


def test_a_file_left_in_the_checkout_fails_the_run(tmp_path: Path) -> None:
    done = _pytest_in(tmp_path / "left", "    (Path(__file__).parent.parent / 'app-data').mkdir()\n"
                                         "    (Path(__file__).parent.parent / 'app-data' / 'x.db').write_text('')")
    assert done.returncode == 1 and "left 1 new file(s) in the checkout: app-data/x.db" in done.stdout, done.stdout


def test_a_run_that_writes_nothing_passes(tmp_path: Path) -> None:
    done = _pytest_in(tmp_path / "clean", "    pass")
    assert done.returncode == 0, done.stdout
