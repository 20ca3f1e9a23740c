#!/usr/bin/env bash
# Install everything the tests need: the Debian packages of the peer servers
# (etcd, ZooKeeper, Redis, PostgreSQL) and a virtualenv in .venv with stockade
# and its test extras. Safe to run again; skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(etcd-server etcd-client zookeeper redis-server postgresql faketime libfaketime nodejs chromium chromium-driver)
missing=()
for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then echo "install.sh: need root to install: ${missing[*]}" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'

# The TypeScript client's tests (tests/test_typescript_client.py): Node >= 20 and npm, then the
# pinned TypeScript and pg from clients/typescript/package-lock.json. Some nodejs packages bundle
# npm; where it is a package of its own, install it.
if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then echo "install.sh: need root to install: npm" >&2; exit 1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm
fi
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
  || { echo "install.sh: the TypeScript client needs Node >= 20, found $(node --version)" >&2; exit 1; }
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)
