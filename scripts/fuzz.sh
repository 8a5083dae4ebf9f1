#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS_PER_TARGET (default 10) from the
# committed seeds; exits non-zero naming the target and the crashing input on any failure.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
#
# Needs a nightly toolchain (`rustup toolchain install nightly`); installs cargo-fuzz if it
# is missing. Inputs a run finds go to fuzz/scratch/<target>/ (ignored by git), so the
# committed seeds in fuzz/corpus/<target>/ stay small; crashes go to fuzz/artifacts/<target>/.
# Built without a sanitizer (the workspace denies unsafe code; its one site is a cache
# prefetch, which touches no memory the program sees) and with debug assertions,
# so an arithmetic overflow is a crash too.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs="${1:-10}"
if ! [[ "$secs" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [SECONDS_PER_TARGET]" >&2
    exit 2
fi

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

build=(--sanitizer none --debug-assertions)
echo "== cargo +nightly fuzz build"
cargo +nightly fuzz build "${build[@]}"

failed=()
for target in $(cargo +nightly fuzz list); do
    scratch="scratch/$target"
    artifacts="artifacts/$target"
    mkdir -p "$scratch" "$artifacts" "corpus/$target"
    echo "== $target: ${secs}s"
    before=$(ls "$artifacts" | wc -l)
    if ! cargo +nightly fuzz run "${build[@]}" "$target" "$scratch" "corpus/$target" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$artifacts/" 2>"$scratch.log"; then
        tail -n 40 "$scratch.log" >&2
        artifact=$(ls -t "$artifacts" | head -n 1)
        echo "!! $target failed; input: fuzz/$artifacts/$artifact (after $before earlier ones)" >&2
        echo "   reproduce: cd fuzz && cargo +nightly fuzz run ${build[*]} $target $artifacts/$artifact" >&2
        failed+=("$target")
    else
        grep -E "^stat::number_of_executed_units|^Done" "$scratch.log" || true
    fi
done

if ((${#failed[@]})); then
    echo "fuzzing failed: ${failed[*]}" >&2
    exit 1
fi
echo "== every target ran ${secs}s without a crash"
