#!/usr/bin/env bash
# gpushim on real NVIDIA hardware: PyTorch, JAX, CuPy, nvcc-built and driver-API programs,
# nvidia-smi and pynvml, each with and without LD_PRELOAD=libgpushim.so; the compute share
# (GPUSHIM_COMPUTE_LIMIT: two PyTorch processes at 30 % and 70 %, a CUDA graph loop, launch
# overhead, green contexts; `--only compute`). Prints a
# PASS/FAIL/SKIP table and writes a JSON result file; exit status 0 iff nothing FAILed
# (2: could not run at all). A scenario whose prerequisite is missing (no GPU, no JAX, no
# nvcc, one GPU only …) is SKIP with the reason.
#
#   scripts/gpu-validate.sh [--library PATH] [--build] [--only NAMES] [--timeout S]
#                           [--json PATH] [--simulated] [--include-unimplemented] [--list]
#
# libgpushim.so: --library PATH, else target/release/libgpushim.so, else built with
# `cargo build --release -p gpushim`. --simulated runs the scenarios that need no framework
# on the project's simulated driver and NVML (no GPU needed). Details: scripts/gpu/validate.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || { echo "gpu-validate: error: $python not found (set PYTHON=...)" >&2; exit 2; }
exec "$python" "$here/gpu/validate.py" "$@"
