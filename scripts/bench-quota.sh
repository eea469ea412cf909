#!/usr/bin/env bash
# Start-up of many CUDA processes at once under gpushim, with and without a shared quota, on
# the simulated driver (figures, not a test). N processes (scripts/bench/quota_start.c) wait
# for the same instant, then each times cuInit + a context + its first 1 MiB allocation and
# free; a quota member also joins the quota then (creates or opens the quota file, takes a
# slot, registers the device). Prints, per N, the median and the slowest process' time.
#
# Usage: scripts/bench-quota.sh [N ...]   (default: 1 8 64)
set -euo pipefail
cd "$(dirname "$0")/.."
counts=${*:-1 8 64}
target=${CARGO_TARGET_DIR:-$PWD/target}
bash scripts/fetch-deps.sh >/dev/null
cargo build --release -q -p gpushim -p gpusim-cuda
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lib"
ln -s "$target/release/libcuda.so" "$work/lib/libcuda.so.1"
ln -s "$target/release/libcuda.so" "$work/lib/libcuda.so"
gcc -O2 -I.deps/cuda13/include scripts/bench/quota_start.c -L"$work/lib" -lcuda -o "$work/start"
export LD_LIBRARY_PATH=$work/lib GPUSIM_DEVICES=1 GPUSIM_MEMORY=16GiB GPUSHIM_MEMORY_LIMIT=256MiB
export GPUSHIM_STATE_DIR=$work/state
shim=$target/release/libgpushim.so

# run N MODE -> "median max" in microseconds
run() {
    local n=$1 mode=$2 start i
    rm -rf "$work/out" && mkdir "$work/out"
    start=$(($(date +%s) + 1))
    for ((i = 0; i < n; i++)); do
        case $mode in
            none) "$work/start" "$start" >"$work/out/$i" ;;
            shim) LD_PRELOAD=$shim "$work/start" "$start" >"$work/out/$i" ;;
            quota) LD_PRELOAD=$shim GPUSHIM_SHARED_QUOTA=bench "$work/start" "$start" >"$work/out/$i" ;;
        esac &
    done
    wait
    cat "$work/out"/* | sed -n 's/^us=\([0-9]*\) rc=0$/\1/p' | sort -n |
        awk -v n="$n" '{v[NR]=$1} END {if (NR != n) {print "failed", "(" NR "/" n " ok)"; exit} print v[int((NR+1)/2)], v[NR]}'
}

echo "== start-up: cuInit + context + first 1 MiB alloc/free, N processes started at the same instant"
echo "   (simulated driver, $(nproc) cores; microseconds: median / slowest process)"
printf '%-6s %20s %20s %20s\n' N "no shim" "gpushim" "gpushim + quota"
for n in $counts; do
    printf '%-6s' "$n"
    for mode in none shim quota; do
        read -r med max < <(run "$n" "$mode")
        printf ' %20s' "$med / $max"
    done
    echo
done
