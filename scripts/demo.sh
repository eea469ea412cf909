#!/usr/bin/env bash
# gpushim demo — SIMULATED: no GPU needed. Builds the shim and the project's simulated driver
# and NVML (two simulated 16 GiB GPUs), then runs the same unmodified CUDA runtime program (linked with
# the real libcudart 12.9 from PyPI) without and with the shim: limits, hiding, splitting, a typo.
# The program is kept at target/demo/demo (`demo [BLOCKS [SECONDS]]`, see scripts/demo/demo.c) to
# try further, e.g. on the simulated GPUs with `gpushim sim`.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$PWD/target}
bash scripts/fetch-deps.sh >/dev/null
cargo build --release -q -p gpushim -p gpusim-cuda -p gpusim-nvml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$target/release/libcuda.so" "$work/libcuda.so.1"
ln -s "$target/release/libnvidia_ml.so" "$work/libnvidia-ml.so.1"
cuda=.deps/cuda12
mkdir -p "$target/demo"
gcc -O2 -o "$target/demo/demo" scripts/demo/demo.c -I$cuda/include -L$cuda/lib -l:libcudart.so.12 -Wl,-rpath,"$PWD/$cuda/lib"
export LD_LIBRARY_PATH="$work" GPUSIM_DEVICES=2 GPUSIM_MEMORY=16GiB
echo "== SIMULATED driver: 2 x 16 GiB. Without gpushim:"
"$target/demo/demo"
echo
echo "== With gpushim: LD_PRELOAD=libgpushim.so GPUSHIM_MEMORY_LIMIT=25% GPUSHIM_MEMORY_LIMIT_1=3GiB"
LD_PRELOAD="$target/release/libgpushim.so" GPUSHIM_MEMORY_LIMIT=25% GPUSHIM_MEMORY_LIMIT_1=3GiB "$target/demo/demo"
echo
echo "== With gpushim: GPUSHIM_VISIBLE_DEVICES=1 GPUSHIM_VIRTUAL_DEVICES=0:2x6GiB (device 1 only, split in two)"
LD_PRELOAD="$target/release/libgpushim.so" GPUSHIM_VISIBLE_DEVICES=1 GPUSHIM_VIRTUAL_DEVICES=0:2x6GiB "$target/demo/demo"
echo
echo "== With gpushim and a typo in the configuration: GPUSHIM_MEMORY_LIMIT='4 gigs'"
LD_PRELOAD="$target/release/libgpushim.so" GPUSHIM_MEMORY_LIMIT='4 gigs' "$target/demo/demo" || true
