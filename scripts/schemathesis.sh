#!/usr/bin/env bash
# schemathesis against the /openapi.json of a running `tally serve`: every operation, every
# check of scripts/schemathesis.toml, a bounded number of examples. Installs schemathesis
# (pinned) into target/schemathesis-venv when it is missing. Non-zero exit on any failure.
#
#   scripts/schemathesis.sh [MAX_EXAMPLES]     # default 30 per operation
set -euo pipefail
cd "$(dirname "$0")/.."
examples="${1:-30}"
version="4.32.5"
venv="target/schemathesis-venv"

if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$version"; then
    echo "== installing schemathesis $version into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "schemathesis==$version"
fi

cargo build --locked --quiet -p tally
data="$(mktemp -d)"
log="$data/serve.log"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
target/debug/tally serve --data "$data/db" --listen "127.0.0.1:$port" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$data"' EXIT
healthy() {
    python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
        "http://127.0.0.1:$port/healthz" 2>/dev/null
}
for _ in $(seq 100); do
    healthy && break
    sleep 0.1
done

echo "== schemathesis: $examples examples per operation against 127.0.0.1:$port"
# A fixed seed and no example database (.hypothesis/) keep runs repeatable, here as in CI;
# run with SEED=random (or another number) to explore.
seed=()
if [ "${SEED:-17}" != "random" ]; then seed=(--seed "${SEED:-17}"); fi
"$venv/bin/schemathesis" --config-file scripts/schemathesis.toml run \
    "http://127.0.0.1:$port/openapi.json" \
    --checks all --exclude-checks positive_data_acceptance \
    --max-examples "$examples" "${seed[@]}" --no-color --generation-database none
# The server must have survived every request.
healthy || { echo "the server died; its log:"; cat "$log"; exit 1; }
