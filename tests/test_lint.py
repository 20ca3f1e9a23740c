"""The linter and the type checker are part of the test run (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    result = _run("ruff", "check", "src", "tests", "scripts", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean_and_strict_on_the_core() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
    strict = _run("mypy", "--strict", "src/stockade/core")
    assert strict.returncode == 0, strict.stdout + strict.stderr
