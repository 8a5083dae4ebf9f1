#!/usr/bin/env bash
# The soak test (issue 9): SIGKILL a real `tally serve` CYCLES times (default 100) while
# writes are in flight, on one data directory kept across cycles, and verify after every
# restart that each acknowledged event is counted exactly once and each unacknowledged batch
# wholly or not at all; `tally check` between cycles. Then a disk-full round on a 64 MiB
# tmpfs (needs root; skipped with a message otherwise). The driver is
# crates/bench/src/soak.rs. Exits non-zero on any violation.
#
#   scripts/soak.sh [CYCLES]
set -euo pipefail

cycles="${1:-100}"
case "$cycles" in
  '' | *[!0-9]*) echo "usage: scripts/soak.sh [CYCLES]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

cargo build --release -p tally -p tally-bench
work="$(mktemp -d "${TMPDIR:-/tmp}/tally-soak.XXXXXX")"
mounted=""
cleanup() {
  if [ -n "$mounted" ]; then umount "$mounted" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
# Run copies, so a rebuild during a long soak cannot swap the binaries under it.
mkdir "$work/bin"
cp "${CARGO_TARGET_DIR:-target}/release/tally" "${CARGO_TARGET_DIR:-target}/release/tally-bench" "$work/bin/"
target="$work/bin"

echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
"$target/tally-bench" soak --tally "$target/tally" --data "$work/data" --cycles "$cycles"

small="$work/small"
mkdir -p "$small"
if mount -t tmpfs -o size=64m tally-soak "$small" 2>"$work/mount.err"; then
  mounted="$small"
  "$target/tally-bench" soak-disk-full --tally "$target/tally" --dir "$small"
else
  echo "disk-full round skipped: cannot mount a 64 MiB tmpfs here ($(cat "$work/mount.err")); run as root to include it"
fi
