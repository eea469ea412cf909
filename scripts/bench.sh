#!/usr/bin/env bash
# gpushim overhead benchmark on the simulated driver (figures, not a test).
#  1. instructions the shim adds per cuMemAlloc_v2 + cuMemFree_v2 pair (callgrind, inside
#     run_pairs only, with and without the shim, in the same run of this script);
#  2. alloc/free pairs per second of 8 threads, with and without the shim, as a ratio.
# Usage: scripts/bench.sh [PAIRS]   (needs valgrind; builds the release artifacts)
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-20000}
target=${CARGO_TARGET_DIR:-$PWD/target}
bash scripts/fetch-deps.sh >/dev/null
cargo build --release -q -p gpushim -p gpusim-cuda
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$target/release/libcuda.so" "$work/libcuda.so.1"
ln -s "$target/release/libcuda.so" "$work/libcuda.so"
gcc -O2 -o "$work/alloc_pairs" scripts/bench/alloc_pairs.c -I.deps/cuda12/include -L"$work" -lcuda -lpthread
shim="$target/release/libgpushim.so"
export LD_LIBRARY_PATH="$work" GPUSIM_DEVICES=1 GPUSIM_MEMORY=16GiB
unset GPUSHIM_CONFIG
run_cg() { # $1: LD_PRELOAD value ('' for none) → instructions inside run_pairs
    env ${1:+LD_PRELOAD=$1} GPUSHIM_MEMORY_LIMIT=8GiB valgrind --tool=callgrind --toggle-collect=run_pairs \
        --callgrind-out-file="$work/cg.out" "$work/alloc_pairs" callgrind "$pairs" 2>"$work/cg.err"
    grep -E '^summary:|^totals:' "$work/cg.out" | head -1 | awk '{print $2}'
}
if command -v valgrind >/dev/null; then
    base=$(run_cg "")
    with=$(run_cg "$shim")
    echo "callgrind, $pairs cuMemAlloc_v2+cuMemFree_v2 pairs (4 KiB):"
    echo "  without shim: $((base / pairs)) instructions per pair"
    echo "  with shim:    $((with / pairs)) instructions per pair"
    echo "  added by the shim: $(((with - base) / pairs)) instructions per pair"
else
    echo "valgrind not found: instruction counts skipped"
fi
rate() { env ${1:+LD_PRELOAD=$1} GPUSHIM_MEMORY_LIMIT=8GiB "$work/alloc_pairs" threads 8 "$2"; }
n=$((pairs * 10))
best() { local b=0 r; for _ in 1 2 3; do r=$(rate "$1" "$n"); ((r > b)) && b=$r; done; echo "$b"; }
r0=$(best "")
r1=$(best "$shim")
echo "8 threads x $n pairs, best of 3:"
echo "  without shim: $r0 pairs/s"
echo "  with shim:    $r1 pairs/s"
awk -v a="$r1" -v b="$r0" 'BEGIN { printf "  ratio with/without: %.3f\n", a / b }'
