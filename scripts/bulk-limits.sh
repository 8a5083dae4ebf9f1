#!/usr/bin/env bash
# The bulk review's measurements (docs/reliability.md), against a release build:
#   scripts/bulk-limits.sh bigbatch   `tally load --server --batch 100000` against a server
#                                     taking 64 KiB bodies: the time and message it ends with
#   scripts/bulk-limits.sh wide       100 000 events of 250-byte keys and 2 KB values over
#                                     4 days, loaded offline (--memory-mb 16), then exported
#                                     to Parquet and CSV: each command's peak anonymous memory
# Builds target/release/tally if missing; works in a temporary directory it removes.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:?usage: scripts/bulk-limits.sh bigbatch|wide}"
[ -x target/release/tally ] || cargo build --release -q -p tally
tally="$PWD/target/release/tally"
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# Runs a command, printing its peak anonymous memory (sampled from /proc every 50 ms).
peak() {
    local what="$1"; shift
    "$@" & local pid=$! m=0 a
    while kill -0 "$pid" 2>/dev/null; do
        a=$(awk '/RssAnon/{print $2}' "/proc/$pid/status" 2>/dev/null || true)
        if [ -n "$a" ] && [ "$a" -gt "$m" ]; then m=$a; fi
        sleep 0.05
    done
    wait "$pid"
    echo "$what: peak RssAnon ${m} KB"
}

case "$mode" in
bigbatch)
    port=$((20000 + RANDOM % 20000))
    printf 'fsync = "never"\n[limits]\nmax_body_bytes = 65536\n' > "$work/cfg.toml"
    "$tally" serve --data "$work/data" --listen "127.0.0.1:$port" --config "$work/cfg.toml" \
        2> "$work/log" &
    for _ in $(seq 100); do curl -sf "localhost:$port/healthz" >/dev/null && break; sleep 0.1; done
    python3 -c "
import time; t = int(time.time()) - 86400
print('ns,key,ts,n')
for i in range(200000): print(f'ev,key{i},{t},1')" > "$work/in.csv"
    start=$(date +%s.%N)
    "$tally" load "$work/in.csv" --server "http://127.0.0.1:$port" --batch 100000 --quiet \
        || echo "exit $?"
    echo "ended after $(echo "$(date +%s.%N) - $start" | bc) s"
    ;;
wide)
    python3 - "$work/wide.csv" <<'P'
import sys, time
base = (int(time.time()) - 20 * 86400) // 86400 * 86400
with open(sys.argv[1], 'w') as f:
    f.write('ns,key,ts,n,v\n')
    for d in range(4):
        for i in range(25000):
            f.write(f"wide,{'%06d' % i + 'K' * 244},{base + d * 86400 + (i * 7) % 86400},1,"
                    f"{'%07d' % (d * 100000 + i) + 'v' * 1993}\n")
P
    to=$(( ($(date +%s) / 3600 + 1) * 3600 ))
    peak "load --memory-mb 16" "$tally" load "$work/wide.csv" --data "$work/data" --create --quiet --memory-mb 16
    for format in parquet csv; do
        peak "export $format" "$tally" export --ns wide --from 1790000000 --to "$to" \
            --resolution 1h --format "$format" --out "$work/ex_$format" --data "$work/data" --quiet
    done
    ;;
*)
    echo "unknown mode $mode: bigbatch or wide" >&2
    exit 2
    ;;
esac
