#!/usr/bin/env bash
# The Redis review's failover repro (docs/reliability.md), against a release build: a Redis
# Cluster of 3 masters and 3 replicas, two tally servers on it (one given a single seed, one
# given three), writes and reads through both, then one master SIGKILLed (its replica takes
# over) and started again 10 s later as a replica. Prints, for each server, whether it
# answers a read, /healthz and a write within 12 s, 25 s after the restart ("recovered") or
# not ("stuck"). Before 0486fd3 about half of the servers stayed stuck until restarted.
#
#   scripts/cluster-failover.sh [RUNS]        TALLY_BIN=path/to/tally to try another build
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-1}"
tally="${TALLY_BIN:-$PWD/target/release/tally}"   # TALLY_BIN: another build to compare
[ -x "$tally" ] || cargo build --release -q -p tally
work=$(mktemp -d)
base=$((20000 + RANDOM % 20000))
cleanup() {
    kill $(jobs -p) 2>/dev/null || true
    for p in $(seq $((base + 1)) $((base + 6))); do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
    rm -rf "$work"
}
trap cleanup EXIT

writer() { # BASE_URL NS SECONDS: batches of 10-15 events, one after another
    python3 - "$@" <<'P'
import json, sys, time, urllib.request, collections
url, ns, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
t0, i, now, codes = time.time(), 0, int(time.time()), collections.Counter()
while time.time() - t0 < secs:
    evs = [{"ns": ns, "key": f"s{k}", "ts": now - 60 * (i % 100), "dims": {"c": f"v{i % 7}"}} for k in range(10)]
    evs += [{"ns": ns, "key": f"b{i}", "ts": now - 3600 * j} for j in range(3 + i % 5)]
    req = urllib.request.Request(url + "/v1/events", data=json.dumps(evs).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=40) as r:
            codes[r.status] += 1
    except urllib.error.HTTPError as e:
        codes[e.code] += 1
    except Exception:
        codes["error"] += 1
    i += 1
print(f"  writes during the failover: {dict(codes)}")
P
}

for run in $(seq "$runs"); do
    dir="$work/run$run"
    for i in 1 2 3 4 5 6; do
        p=$((base + i)); mkdir -p "$dir/$p"
        (cd "$dir/$p" && redis-server --port "$p" --cluster-enabled yes --cluster-config-file nodes.conf \
            --save '' --appendonly no --daemonize yes --cluster-require-full-coverage no \
            --cluster-node-timeout 3000 --logfile "$dir/$p/log")
    done
    sleep 1
    redis-cli --cluster create $(for i in 1 2 3 4 5 6; do echo "127.0.0.1:$((base + i))"; done) \
        --cluster-replicas 1 --cluster-yes > "$dir/create.log"
    for _ in $(seq 60); do redis-cli -p $((base + 1)) cluster info | grep -q cluster_state:ok && break; sleep 0.5; done
    sleep 2
    victim=$((base + 2))
    one="$victim"
    three="$((base + 1)),127.0.0.1:$victim,127.0.0.1:$((base + 3))"
    ports=()
    for seeds in "$one" "$three"; do
        port=$((base + 70 + ${#ports[@]}))
        "$tally" serve --backend "redis+cluster://127.0.0.1:$seeds" --listen "127.0.0.1:$port" \
            2> "$dir/tally$port.log" &
        ports+=("$port")
    done
    for port in "${ports[@]}"; do
        for _ in $(seq 100); do curl -sf "localhost:$port/healthz" >/dev/null && break; sleep 0.1; done
    done
    echo "run $run"
    for port in "${ports[@]}"; do
        writer "http://127.0.0.1:$port" "w$port" 30 &
        ( # reads beside the writes (key listings and tops, as a dashboard)
            for _ in $(seq 60); do
                now=$(date +%s)
                curl -s -m 40 -o /dev/null "localhost:$port/v1/ns/w$port/keys?limit=50&prefix=b1" || true
                curl -s -m 40 -o /dev/null "localhost:$port/v1/ns/w$port/top?from=$((now / 3600 * 3600 - 7200))&to=$((now / 3600 * 3600 + 3600))" || true
                sleep 0.3
            done
        ) &
    done
    sleep 4
    kill -9 "$(redis-cli -p "$victim" info server | awk -F: '/process_id/{print $2}' | tr -d '\r')"
    sleep 10
    (cd "$dir/$victim" && redis-server --port "$victim" --cluster-enabled yes --cluster-config-file nodes.conf \
        --save '' --appendonly no --daemonize yes --cluster-require-full-coverage no \
        --cluster-node-timeout 3000 --logfile "$dir/$victim/log")
    sleep 25
    for port in "${ports[@]}"; do
        read_code=$(curl -s -m 12 -o /dev/null -w '%{http_code}' "localhost:$port/v1/ns/w$port/keys/s1/window?last=1h" || true)
        health=$(curl -s -m 12 -o /dev/null -w '%{http_code}' "localhost:$port/healthz" || true)
        write=$(curl -s -m 12 -o /dev/null -w '%{http_code}' -X POST "localhost:$port/v1/events" \
            -d "[{\"ns\":\"w$port\",\"key\":\"after\"}]" || true)
        verdict=stuck
        if [ "$read_code" = 200 ] && [ "$health" = 200 ] && [ "$write" = 200 ]; then verdict=recovered; fi
        echo "  server $port: read $read_code, healthz $health, write $write: $verdict"
    done
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    for p in $(seq $((base + 1)) $((base + 6))); do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
    base=$((base + 100))
done
