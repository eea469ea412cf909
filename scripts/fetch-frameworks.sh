#!/usr/bin/env bash
# Fetch the real frameworks tests/frameworks.rs runs on the simulated driver (no GPU needed):
#   .deps/frameworks/venv/    a virtual environment with the pinned versions below
#   .deps/frameworks/.stamp   the pinned versions it was built with
# Idempotent: when the stamp matches, nothing is downloaded (no network). When the package index
# cannot be reached, one line on stderr and a non-zero exit (the tests would otherwise not run).
# PyPI's Linux torch wheel is the CUDA build (torch 2.15.0: CUDA 13.2, cuda-toolkit 13.2.2,
# cuDNN 9.26); download.pytorch.org is not needed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.deps/frameworks"
venv="$dest/venv"
stamp="$dest/.stamp"

pins=(
  "torch==2.15.0"
  "cupy-cuda12x==14.2.0"
)
want="$(printf '%s\n' "${pins[@]}")"

die() { echo "fetch-frameworks: error: $*" >&2; exit 1; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 is needed to create $venv"
rm -rf "$venv" "$stamp"
mkdir -p "$dest"
python3 -m venv "$venv" >/dev/null 2>&1 \
  || die "python3 -m venv failed (install python3-venv, e.g. 'apt-get install -y python3-venv')"
start=$(date +%s)
echo "fetch-frameworks: installing ${pins[*]} into $venv (about 5.7 GB, once)" >&2
log="$dest/pip.log"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
      "${pins[@]}" >"$log" 2>&1; then
  rm -rf "$venv"
  die "could not install ${pins[*]} from the package index (no network or no index? see $log)"
fi
"$venv/bin/python" -c 'import torch, cupy' >>"$log" 2>&1 \
  || { rm -rf "$venv"; die "the installed frameworks do not import (see $log)"; }
echo "$want" > "$stamp"
echo "fetch-frameworks: ready in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1) in $venv" >&2
