#!/usr/bin/env bash
# The test command: install everything, then run the default suite.
# STOCKADE_LONG=1 adds the long fault runs. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# Byte-compile the sources once, before the run: it starts hundreds of Python processes (servers, workers,
# the CLI), and where PYTHONDONTWRITEBYTECODE is set (it is on some CI hosts) each of them would compile every
# module it imports again, about 0.1 s of CPU a start. The .pyc files go to __pycache__/ (ignored by git).
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m compileall -q -j 0 src tests >/dev/null
# pytest rewrites the asserts of each test module as it imports it, and keeps the result beside the .pyc
# only where bytecode may be written: otherwise every worker rewrites all of them again. Two collections, half
# the files each, keep them first (6-9 s here); five workers then start and collect on 15-17 s of CPU, not 33.
modules=(tests/test_*.py)
half=$(( ${#modules[@]} / 2 ))
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider \
    "${modules[@]:0:half}" >/dev/null &
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider \
    "${modules[@]:half}" >/dev/null || true  # a module that fails to import is reported by the run itself
wait $! || true
# Temporary files (each test's directory, the servers' data: up to about 4 GiB) go to a RAM disk when
# /dev/shm is a tmpfs with 8 GiB free: a fsync there costs no disk and little CPU (on 2 idle cores, 2,412 tests:
# 8 min 17 s against 9 min 58 s on the disk, kernel CPU 3 min 14 s against 5 min 02 s). What the tests prove does
# not change: their crashes are kill -9 and SIGSTOP, which a RAM disk survives as a disk does, and the full-disk
# tests mount a small tmpfs of their own anyway; a control that needs the disk's pace keeps its files in /var/tmp
# (tests/test_coordinator_frozen.py). STOCKADE_TEST_TMP=DIR chooses the place (e.g. /tmp: the disk).
if [ -z "${STOCKADE_TEST_TMP:-}" ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] \
    && [ "$(stat -f -c '%a' /dev/shm)" -ge $(( (8 << 30) / $(stat -f -c '%S' /dev/shm) )) ]; then
    STOCKADE_TEST_TMP=/dev/shm/stk  # short: a unix socket's path under it must fit in 108 bytes
fi
if [ -n "${STOCKADE_TEST_TMP:-}" ]; then
    mkdir -p "$STOCKADE_TEST_TMP"
    export TMPDIR="$STOCKADE_TEST_TMP"
fi
# Parallel workers (pytest-xdist): many tests wait on servers, disks and timers, not on the CPU.
# Each worker starts its own PostgreSQL and Redis on free ports; the run shares one etcd cluster and one
# ZooKeeper ensemble (tests/helpers/shared_servers.py). STOCKADE_TEST_WORKERS=N sets the number of workers
# (default 6); 0 runs everything in this one process. On 2 idle cores, clean clones, 2,412 tests, 6 workers:
# 8 min 17 s on the RAM disk, 9 min 10 s to 10 min 22 s on the disk (CPU-bound). Tests whose
# premise depended on timing hold by construction.
workers=${STOCKADE_TEST_WORKERS:-6}
# --durations: the 25 slowest steps are printed at the end, to keep the default run within budget.
if [ "$workers" = 0 ]; then exec .venv/bin/python -m pytest --durations=25 "$@"; fi
exec .venv/bin/python -m pytest -n "$workers" --durations=25 "$@"
