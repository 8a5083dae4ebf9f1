#!/usr/bin/env bash
# Every test of tally, on a fresh machine with the Rust toolchain (and Python 3, as the
# machine has): the workspace's tests, then schemathesis against a live server's OpenAPI
# document. Whatever a step needs beyond the toolchain, the step's own script installs.
#
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace"
cargo test --workspace --locked

echo "== schemathesis against /openapi.json"
scripts/schemathesis.sh 30
