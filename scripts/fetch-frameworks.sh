#!/usr/bin/env bash
# Fetch the real frameworks the tests run on the simulated driver (no GPU needed), each in its
# own virtual environment with pinned versions (their CUDA libraries' pins differ):
#   .deps/frameworks/venv/  torch 2.15.0, cupy-cuda12x 14.2.0   (tests/frameworks.rs)
#   .deps/jax/venv/         jax[cuda12] 0.10.2                  (tests/frameworks_jax.rs)
#   .deps/tf/venv/          tensorflow[and-cuda] 2.21.0         (tests/frameworks_tf.rs)
#   <dir>/.stamp            the pinned versions a venv was built with
# Idempotent: when a stamp matches, nothing is downloaded (no network). When the package index
# cannot be reached, one line on stderr and a non-zero exit (the tests would otherwise not run).
# PyPI's Linux torch wheel is the CUDA build (torch 2.15.0: CUDA 13.2, cuda-toolkit 13.2.2,
# cuDNN 9.26); download.pytorch.org is not needed. JAX 0.11+ needs Python 3.12: 0.10.2 is the
# newest that runs on this project's Python 3.11.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() { echo "fetch-frameworks: error: $*" >&2; exit 1; }

# venv DIR SIZE IMPORT PIN...: the virtual environment DIR/venv with PIN... installed.
venv() {
  local dest="$root/.deps/$1" size=$2 imports=$3
  shift 3
  local venv="$dest/venv" stamp="$dest/.stamp" want
  want="$(printf '%s\n' "$@")"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    return 0
  fi
  command -v python3 >/dev/null 2>&1 || die "python3 is needed to create $venv"
  rm -rf "$venv" "$stamp"
  mkdir -p "$dest"
  python3 -m venv "$venv" >/dev/null 2>&1 \
    || die "python3 -m venv failed (install python3-venv, e.g. 'apt-get install -y python3-venv')"
  local start log="$dest/pip.log"
  start=$(date +%s)
  echo "fetch-frameworks: installing $* into $venv (about $size, once)" >&2
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        "$@" >"$log" 2>&1; then
    rm -rf "$venv"
    die "could not install $* from the package index (no network or no index? see $log)"
  fi
  "$venv/bin/python" -c "import $imports" >>"$log" 2>&1 \
    || { rm -rf "$venv"; die "the installed frameworks do not import (see $log)"; }
  echo "$want" > "$stamp"
  echo "fetch-frameworks: ready in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1) in $venv" >&2
}

venv frameworks 5.7GB "torch, cupy" "torch==2.15.0" "cupy-cuda12x==14.2.0"
venv jax 5.5GB "jax" "jax[cuda12]==0.10.2"
venv tf 6.3GB "tensorflow" "tensorflow[and-cuda]==2.21.0"
