#!/usr/bin/env bash
# Install everything the tests need: the Debian packages of the peer servers
# (etcd, ZooKeeper, Redis, PostgreSQL) and a virtualenv in .venv with stockade
# and its test extras. Safe to run again; skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(etcd-server etcd-client zookeeper redis-server postgresql faketime libfaketime chromium chromium-driver)
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
