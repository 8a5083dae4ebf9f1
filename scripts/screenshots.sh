#!/usr/bin/env bash
# Regenerates the dashboard screenshots in docs/ (shown in the README): starts `tally serve`
# on a free port with a fresh data directory, sends a day of sample clicks (the same every
# run: a fixed day, a fixed pseudo-random sequence), and has headless Chromium photograph
# the overview, a key, and the key at phone width. Needs chromium (apt-get install chromium).
#
#   scripts/screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."

command -v chromium >/dev/null || { echo "chromium is needed: apt-get install -y chromium" >&2; exit 1; }
cargo build --locked -q -p tally
tally=target/debug/tally

work=$(mktemp -d)
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/tally.toml" <<'EOF'
fsync = "never"

[namespaces.clicks]
tiers = ["1m:2d", "1h:forever"]
breakdown_tiers = ["1h"]
dimensions = ["country", "device", "country+device"]

[namespaces.api_hits]
tiers = ["1h:forever"]
dimensions = ["status"]
EOF

"$tally" serve --data "$work/data" --config "$work/tally.toml" --listen 127.0.0.1:0 2>"$work/log" &
server=$!
url=""
for _ in $(seq 100); do
    url=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$work/log" | head -1)
    [ -n "$url" ] && break
    sleep 0.1
done
[ -n "$url" ] || { cat "$work/log" >&2; echo "tally serve did not start" >&2; exit 1; }

# Clicks over 2025-11-02 in New York (its fall-back day: 25 hours), Zipf-ish over eight links.
awk 'BEGIN {
    srand(42);
    split("US US US DE DE FR GB IN BR JP", country, " ");
    split("mobile mobile desktop tablet", device, " ");
    day = 1762056000;  # 2025-11-02T00:00:00-04:00
    for (h = 0; h < 25; h++) {
        shape = 1 + sin((h - 8) / 24 * 6.283);
        for (k = 1; k <= 8; k++) {
            for (e = 0; e < 6; e++) {
                n = int((400 / k) * shape * rand()) + 1;
                ts = day + h * 3600 + int(rand() * 3600);
                c = country[int(rand() * 10) + 1];
                dims = "\"country\":\"" c "\"";
                if (rand() < 0.8) dims = dims ",\"device\":\"" device[int(rand() * 4) + 1] "\"";
                printf "{\"ns\":\"clicks\",\"key\":\"lnk_%d\",\"ts\":%d,\"n\":%d,\"dims\":{%s}}\n", k, ts, n, dims;
            }
        }
        for (k = 1; k <= 4; k++) {
            s = (rand() < 0.9) ? "200" : (rand() < 0.5 ? "429" : "500");
            printf "{\"ns\":\"api_hits\",\"key\":\"key_%d\",\"ts\":%d,\"n\":%d,\"dims\":{\"status\":\"%s\"}}\n", k, day + h * 3600, int(900 * rand() / k) + 1, s;
        }
    }
}' >"$work/events.ndjson"
curl -fsS -X POST -H 'Content-Type: application/x-ndjson' --data-binary @"$work/events.ndjson" "$url/v1/events" >/dev/null

shot() { # file width height fragment
    chromium --headless --disable-gpu --no-sandbox --no-first-run --hide-scrollbars --lang=en-US \
        --user-data-dir="$work/profile" --virtual-time-budget=10000 \
        --window-size="$2,$3" --screenshot="$1" "$url/#$4" 2>/dev/null
    echo "wrote $1"
}
day="range=custom&from=2025-11-02T00:00:00-04:00&to=2025-11-03T00:00:00-05:00&unit=hour&tz=America/New_York"
shot docs/dashboard-overview.png 1280 900 "/?$day"
shot docs/dashboard-key.png 1280 1700 "/key/clicks/lnk_1?$day"
shot docs/dashboard-phone.png 390 1500 "/key/clicks/lnk_1?$day"
