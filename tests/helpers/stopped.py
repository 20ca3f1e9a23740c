"""A writer process that stops itself (SIGSTOP) at a chosen point, seen from the test: stopped yet, what it said."""

from __future__ import annotations

import subprocess
from pathlib import Path


def stopped(pid: int) -> bool:
    """True once ``pid`` is in the stopped state (the SIGSTOP has taken effect)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


def read_line(process: subprocess.Popen[str]) -> str:
    """The writer's next line; an AssertionError if it exited instead."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise AssertionError(f"writer exited: {process.wait()}")
    return line.strip()
