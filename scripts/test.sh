#!/usr/bin/env bash
# The project's whole test command (CI runs exactly this through .ci/run):
#   1. fetch the CUDA runtime wheels the tests need (scripts/fetch-deps.sh, idempotent), real
#      NVIDIA driver libraries from Debian's non-free archive (scripts/fetch-drivers.sh) and a
#      virtual environment with PyTorch and CuPy (scripts/fetch-frameworks.sh, about 5.7 GB once),
#   2. build every crate of the workspace (the shim, the simulated driver, test clients),
#   3. run every test of the workspace against those builds.
# No GPU is needed. Extra arguments go to `cargo test` (e.g. a test-name filter).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

need() {
  command -v "$1" >/dev/null 2>&1 && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing $2" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  fi
  command -v "$1" >/dev/null 2>&1 || { echo "test.sh: error: $1 is required (package $2)" >&2; exit 1; }
}
need gcc gcc
need python3 python3
need cargo cargo
need nm binutils
python3 -m pip --version >/dev/null 2>&1 || command -v pip3 >/dev/null 2>&1 || need pip3 python3-pip

bash scripts/fetch-deps.sh
bash scripts/fetch-drivers.sh
bash scripts/fetch-frameworks.sh
bash scripts/fetch-prometheus.sh
python3 scripts/layers.py  # a lower layer never imports a higher one (docs/src/architecture.md)
cargo build --release --workspace --all-targets
cargo test --release --workspace "$@"
