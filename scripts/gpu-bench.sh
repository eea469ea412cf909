#!/usr/bin/env bash
# gpushim overhead on real NVIDIA hardware, without the shim and with LD_PRELOAD=libgpushim.so in
# each GPUSHIM_MEMORY_MODE (passthrough, grow, preallocate) in one run: cudaMalloc+cudaFree
# latency (4 KiB, 1 MiB, 64 MiB, 1 GiB), empty-kernel launches per second, PyTorch training-step
# time; medians of several runs, ratios shim/native against the targets (training step and
# launches >= 0.99, allocation overhead <= 1 us per pair), then the allocation latency per pair
# of every variant side by side. A mode the shim refuses ("not available in this version") is
# SKIP "not available yet".
#
#   scripts/gpu-bench.sh [--library PATH] [--build] [--runs N] [--json PATH] [--timeout S]
#                        [--simulated] [--strict]
#
# Exit status 0 (figures, not a test) unless --strict and a target is missed (1); 2 if it
# could not run at all. Details: scripts/gpu/bench.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || { echo "gpu-bench: error: $python not found (set PYTHON=...)" >&2; exit 2; }
exec "$python" "$here/gpu/bench.py" "$@"
