"""The start-up cost of stockade's processes, two builds side by side.

    python benchmarks/startup_ab.py --a CHECKOUT_A/src --b CHECKOUT_B/src --runs 9

Each entry point a test run or a user starts over and over (``import stockade``,
the CLI's help, ``stockade lock``, ``stockade serve --host-file`` through its idle
exit, an embedded ``connect``) is run as a fresh child of this Python, ``--runs`` times per build,
the builds and entry points interleaved so that the machine's load falls on both
alike. The child's CPU (user + system, from ``wait4``) and wall time are
recorded; the medians are printed per entry point and build, with the ratio b/a
and the CPU of a bare ``python -c pass`` beside them (the floor no change of
stockade can go under). Byte-compile both trees first (``python -m compileall``):
without their ``.pyc`` files every child compiles every module it imports.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRIES: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "import stockade": ["-c", "import stockade"],
    "stockade --help": ["-m", "stockade", "--help"],
    "stockade serve --help": ["-m", "stockade", "serve", "--help"],
    "stockade lock --help": ["-m", "stockade", "lock", "--help"],
    "connect embedded": ["-c", "import stockade, sys; stockade.connect("
                         "'sqlite:///' + sys.argv[1] + '/coord.db?process=embedded').close()", "{tmp}"],
    # the default url: a client of the file's host process (started by the first run, stopped at the end)
    "stockade lock (host process)": ["-m", "stockade", "lock", "--url", "sqlite:///{tmp}/lock.db", "bench", "--",
                                     "true"],
    "stockade lock (embedded)": ["-m", "stockade", "lock", "--url", "sqlite:///{tmp}/coord.db?process=embedded",
                                 "bench", "--", "true"],
    "serve --host-file (0.1 s idle)": ["-m", "stockade", "serve", "--host-file", "{tmp}/host.db",
                                       "--idle-exit-s", "0.1", "--log-level", "warning"],
}


def _once(python: str, src: str, argv: list[str], tmp: str) -> tuple[float, float]:
    """One child: (CPU seconds, wall seconds)."""
    env = {**os.environ, "PYTHONPATH": src}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command = [python, *(part.replace("{tmp}", tmp) for part in argv)]
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {proc.returncode}: {err.decode(errors='replace')[-400:]}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="the first build's src directory (PYTHONPATH)")
    parser.add_argument("--b", required=True, help="the second build's src directory")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--only", action="append", help="an entry point's name (repeatable; default all)")
    args = parser.parse_args()
    entries = {name: argv for name, argv in ENTRIES.items() if not args.only or name in args.only}
    builds = {"a": str(Path(args.a).absolute()), "b": str(Path(args.b).absolute())}
    cpu: dict[tuple[str, str], list[float]] = {}
    wall: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as root:
        dirs = {side: Path(root, side) for side in builds}
        for directory in dirs.values():
            directory.mkdir()
        for run in range(args.runs):
            order = list(builds) if run % 2 == 0 else list(builds)[::-1]
            for name, argv in entries.items():
                for side in order:
                    c, w = _once(args.python, builds[side], argv, str(dirs[side]))
                    cpu.setdefault((name, side), []).append(c)
                    wall.setdefault((name, side), []).append(w)
        for side in builds:  # the host processes `stockade lock` started (they would linger until their idle exit)
            _once(args.python, builds[side], ["-c", "import pathlib, sys; from stockade.coordinators.sqlite._host "
                                              "import stop_host_process; stop_host_process(pathlib.Path(sys.argv[1]))",
                                              "{tmp}/lock.db"], str(dirs[side]))
    print(f"medians of {args.runs} runs, load average {os.getloadavg()[0]:.1f}; a={builds['a']} b={builds['b']}")
    print(f"{'entry point':<32} {'CPU a ms':>9} {'CPU b ms':>9} {'b/a':>5}   {'wall a ms':>9} {'wall b ms':>9}")
    for name in entries:
        ca, cb = (statistics.median(cpu[(name, side)]) * 1000 for side in builds)
        wa, wb = (statistics.median(wall[(name, side)]) * 1000 for side in builds)
        print(f"{name:<32} {ca:>9.0f} {cb:>9.0f} {cb / ca:>5.2f}   {wa:>9.0f} {wb:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
