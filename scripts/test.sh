#!/usr/bin/env bash
# Every test of tally, on a fresh machine with the Rust toolchain (and Python 3, as the
# machine has): the workspace's tests (the server's HTTP suite on the embedded engine), the
# server's HTTP suite again on a single redis-server and on a 3-master Redis Cluster, then
# schemathesis against a live server's OpenAPI document. Whatever a step needs beyond the
# toolchain, this script or the step's own installs.
#
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== redis-server (the Redis backend's tests start their own)"
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version

echo "== cargo test --workspace"
cargo test --workspace --locked

echo "== the server's HTTP suite on Redis, then on Redis Cluster"
TALLY_TEST_BACKEND=redis cargo test --locked -p tally-server --test it
TALLY_TEST_BACKEND=cluster cargo test --locked -p tally-server --test it

echo "== schemathesis against /openapi.json"
scripts/schemathesis.sh 30
