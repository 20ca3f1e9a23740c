#!/usr/bin/env bash
# The test command: install everything, then run the default suite.
# STOCKADE_LONG=1 adds the long fault runs. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m pytest "$@"
