#!/usr/bin/env bash
# Every test of tally, on a fresh machine with the Rust toolchain (and Python 3, as the
# machine has): the workspace's tests (the server's HTTP suite on the embedded engine, the
# dashboard in headless Chromium, exports read back by DuckDB), the server's HTTP suite again on a single redis-server
# and on a 3-master Redis Cluster, then schemathesis against a live server's OpenAPI
# document. Whatever a step needs beyond the toolchain (redis-server and chromium from
# Debian's packages, duckdb from PyPI), this script or the step's own installs.
#
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
updated=""
apt_install() {
    if [ -z "$updated" ]; then $sudo apt-get update -qq >/dev/null; updated=1; fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

echo "== redis-server (the Redis backend's tests start their own)"
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    apt_install redis-server
fi
redis-server --version

echo "== chromium (the dashboard's browser test drives it headless)"
if ! command -v chromium >/dev/null; then
    apt_install chromium
fi
chromium --version 2>/dev/null
# Here a missing browser fails that test instead of skipping it.
export TALLY_REQUIRE_CHROMIUM=1

echo "== duckdb (the export test reads tally's Parquet and CSV back with it)"
duckdb_venv="target/duckdb-venv"
if ! "$duckdb_venv/bin/python" -c "import duckdb" 2>/dev/null; then
    python3 -m venv "$duckdb_venv"
    "$duckdb_venv/bin/pip" install --quiet "duckdb==2.0.0"
fi
export TALLY_DUCKDB_PYTHON="$PWD/$duckdb_venv/bin/python"
# Here a missing DuckDB fails that test instead of skipping it.
export TALLY_REQUIRE_DUCKDB=1

echo "== cargo test --workspace"
cargo test --workspace --locked

echo "== the server's HTTP suite on Redis, then on Redis Cluster"
TALLY_TEST_BACKEND=redis cargo test --locked -p tally-server --test it
TALLY_TEST_BACKEND=cluster cargo test --locked -p tally-server --test it

echo "== schemathesis against /openapi.json"
scripts/schemathesis.sh 30
