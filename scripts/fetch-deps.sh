#!/usr/bin/env bash
# Fetch the CUDA runtime wheels the tests run real programs with (no GPU needed):
#   .deps/wheels/   the downloaded wheels (pip download --no-deps)
#   .deps/cuda12/   include/ + lib/libcudart.so.12  (nvidia-cuda-runtime-cu12 12.9.79)
#   .deps/cuda13/   include/ + lib/libcudart.so.13  (nvidia-cuda-runtime 13.5.37)
#   .deps/python/   pynvml.py (nvidia-ml-py 13.615.71, pure Python): PYTHONPATH=.deps/python
# cuda_runtime_api.h includes crt/host_defines.h, which ships in nvidia-cuda-crt; that
# header only defines host/device qualifier macros, so its 13.5 copy serves both trees.
# Idempotent: a tree is unpacked once (marker file .complete); wheels are downloaded once.
#
#   --arch aarch64   the aarch64 (manylinux aarch64) runtime wheels instead, for the cross
#                    build's tests (scripts/test-aarch64.sh): .deps/aarch64/wheels,
#                    .deps/aarch64/cuda12, .deps/aarch64/cuda13 (same layout; pynvml is pure
#                    Python and stays in .deps/python). Without it (or --arch x86_64) the x86-64
#                    paths above, unchanged.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
arch=x86_64
if [ "${1:-}" = --arch ]; then arch="${2:?--arch needs x86_64 or aarch64}"; shift 2; fi
case "$arch" in
  x86_64) deps="$root/.deps"; platforms=(--platform manylinux2014_x86_64) ;;
  aarch64) deps="$root/.deps/aarch64"
    platforms=(--platform manylinux2014_aarch64 --platform manylinux_2_27_aarch64 --platform manylinux_2_28_aarch64 --platform manylinux_2_34_aarch64) ;;
  *) echo "fetch-deps: error: unknown --arch $arch (x86_64 or aarch64)" >&2; exit 1 ;;
esac
wheels="$deps/wheels"

# name==version  wheel-file-prefix
pkgs=(
  "nvidia-cuda-runtime-cu12==12.9.79 nvidia_cuda_runtime_cu12-12.9.79-"
  "nvidia-cuda-runtime==13.5.37 nvidia_cuda_runtime-13.5.37-"
  "nvidia-cuda-crt==13.5.37 nvidia_cuda_crt-13.5.37-"
  "nvidia-ml-py==13.615.71 nvidia_ml_py-13.615.71-"
)

die() { echo "fetch-deps: error: $*" >&2; exit 1; }

find_wheel() { ls "$wheels"/"$1"*.whl 2>/dev/null | head -n1 || true; }

pip_cmd() {
  if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    echo "python3 -m pip"
  elif command -v pip3 >/dev/null 2>&1; then
    echo "pip3"
  elif command -v pip >/dev/null 2>&1; then
    echo "pip"
  fi
}

mkdir -p "$wheels"
for entry in "${pkgs[@]}"; do
  spec="${entry%% *}"; prefix="${entry##* }"
  # (pynvml is pure Python: one copy, in the x86-64 tree)
  [ "$arch" = x86_64 ] || [ "${spec%%==*}" != nvidia-ml-py ] || continue
  if [ -z "$(find_wheel "$prefix")" ]; then
    pip="$(pip_cmd)"
    [ -n "$pip" ] || die "pip is not installed (need python3 -m pip, pip3 or pip to download $spec); install it, e.g. 'apt-get install -y python3-pip'"
    echo "fetch-deps: downloading $spec" >&2
    $pip download --quiet --no-deps --only-binary=:all: \
        "${platforms[@]}" --python-version 3 --implementation py \
        --dest "$wheels" "$spec" \
      || die "could not download $spec from PyPI (no network or no index?); put the wheel into $wheels by hand to go on offline"
    [ -n "$(find_wheel "$prefix")" ] || die "pip did not produce a wheel matching $prefix in $wheels"
  fi
done

command -v python3 >/dev/null 2>&1 || die "python3 is needed to unpack the wheels"

# unpack WHEEL_PREFIX SUBDIR_IN_WHEEL DEST: copy SUBDIR/{include,lib} of the wheel into DEST
unpack() {
  local whl; whl="$(find_wheel "$1")"
  python3 - "$whl" "$2" "$3" <<'PY'
import sys, zipfile, os, shutil
whl, sub, dest = sys.argv[1], sys.argv[2].rstrip('/') + '/', sys.argv[3]
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        if not info.filename.startswith(sub) or info.is_dir():
            continue
        rel = info.filename[len(sub):]
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, 'wb') as dst:
            shutil.copyfileobj(src, dst)
        if rel.startswith('lib/'):
            os.chmod(out, 0o755)
PY
}

build_tree() { # DEST RUNTIME_PREFIX RUNTIME_SUBDIR
  local dest="$deps/$1" marker="$deps/$1/.complete" stamp="$2"
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$stamp" ]; then return; fi
  rm -rf "$dest"; mkdir -p "$dest"
  unpack "$2" "$3" "$dest"
  unpack "nvidia_cuda_crt-13.5.37-" "nvidia/cu13" "$dest"
  [ -f "$dest/include/cuda.h" ] && [ -f "$dest/include/crt/host_defines.h" ] \
    || die "unpacking into $dest did not give include/cuda.h and include/crt/host_defines.h"
  echo "$stamp" > "$marker"
  echo "fetch-deps: unpacked $dest" >&2
}

build_tree cuda12 "nvidia_cuda_runtime_cu12-12.9.79-" "nvidia/cuda_runtime"
build_tree cuda13 "nvidia_cuda_runtime-13.5.37-" "nvidia/cu13"
[ -f "$deps/cuda12/lib/libcudart.so.12" ] || die "missing $deps/cuda12/lib/libcudart.so.12"
[ -f "$deps/cuda13/lib/libcudart.so.13" ] || die "missing $deps/cuda13/lib/libcudart.so.13"

# pynvml: the whole pure-Python wheel (pynvml.py, its dist-info) unpacked into .deps/python/
python_tree() { # WHEEL_PREFIX
  local dest="$deps/python" marker="$deps/python/.complete" stamp="$1"
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$stamp" ]; then return; fi
  rm -rf "$dest"; mkdir -p "$dest"
  python3 - "$(find_wheel "$1")" "$dest" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
  [ -f "$dest/pynvml.py" ] || die "unpacking into $dest did not give pynvml.py"
  echo "$stamp" > "$marker"
  echo "fetch-deps: unpacked $dest" >&2
}

if [ "$arch" != x86_64 ]; then
  echo "fetch-deps: $arch CUDA runtimes ready in $deps" >&2
  exit 0
fi
python_tree "nvidia_ml_py-13.615.71-"
echo "fetch-deps: CUDA runtimes ready in $deps, pynvml in $deps/python" >&2
