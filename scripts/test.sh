#!/usr/bin/env bash
# Every test of tally, on a fresh machine with the Rust toolchain (and Python 3, as the
# machine has): the workspace's tests, then schemathesis against a live server's OpenAPI
# document. Whatever a step needs beyond the toolchain, the step's own script installs.
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

echo "== schemathesis against /openapi.json"
scripts/schemathesis.sh 30
