#!/usr/bin/env bash
# Builds HAMi-core (https://github.com/Project-HAMi/HAMi-core) at a pinned commit, outside the
# repository, for scripts/bench.sh's side-by-side rows. Prints the path of libvgpu.so on
# stdout; on any failure prints "hami-core: <reason>" on stderr and exits 1 (bench.sh then
# reports HAMi-core as not available). Idempotent: a finished build is reused.
#
#   HAMI_CORE_GIT       where to get the source: a git URL (default the GitHub repository) or a
#                       local git directory (a clone or a bare mirror)
#   HAMI_CORE_CACHE     the cache directory (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpushim-bench)
#
# The build is the one its `make build` (build.sh) makes: CMake with DLSYM_HOOK_ENABLE,
# MULTIPROCESS_LIMIT_ENABLE, HOOK_MEMINFO_ENABLE, HOOK_NVML_ENABLE and CMAKE_BUILD_TYPE=Debug,
# i.e. its sources compiled with `-shared -fPIC -g -D_GNU_SOURCE -Wall` (no -O) and those four
# options in config/static_config.h, not stripped. Done here with gcc alone (its CMake files
# want CMake < 3.5 and nvcc for its tests). Programs find it as HAMi's users do: preloaded, and
# at the path its dlsym opens (CUDA_REDIRECT, else /usr/local/vgpu/libvgpu.so). The headers: cuda.h from the
# CUDA 12 wheels (.deps/cuda12, scripts/fetch-deps.sh) and nvml.h from NVIDIA's
# nvidia-nvml-dev-cu12 wheel (pip download). It links nothing but libc: HAMi-core opens the
# driver and NVML itself.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=8f3a89c
version=2 # of this build recipe: a change rebuilds
src_git=${HAMI_CORE_GIT:-https://github.com/Project-HAMi/HAMi-core.git}
cache=${HAMI_CORE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushim-bench}
dir="$cache/hami-core-$commit-$version"
lib="$dir/libvgpu.so"
fail() { echo "hami-core: $*" >&2; exit 1; }
if [[ -f $dir/.built ]]; then echo "$lib"; exit 0; fi
[[ -f .deps/cuda12/include/cuda.h ]] || fail "no CUDA headers (.deps/cuda12): run scripts/fetch-deps.sh"
command -v gcc >/dev/null || fail "gcc is needed"
mkdir -p "$cache"
rm -rf "$dir.part"
mkdir -p "$dir.part/src" "$dir.part/include" "$dir.part/config"
# The source at the pinned commit.
if [[ -d $src_git ]]; then
    gitdir=$src_git
    [[ -d $src_git/.git ]] && gitdir=$src_git/.git
else
    gitdir="$cache/hami-core.git"
    if [[ ! -d $gitdir ]]; then
        git clone -q --bare "$src_git" "$gitdir.part" 2>/dev/null || fail "cannot clone $src_git (set HAMI_CORE_GIT to a local copy)"
        mv "$gitdir.part" "$gitdir"
    fi
fi
git --git-dir="$gitdir" cat-file -e "$commit^{commit}" 2>/dev/null || fail "commit $commit not in $src_git"
git --git-dir="$gitdir" archive "$commit" | tar -x -C "$dir.part/src" || fail "cannot unpack $commit"
# nvml.h from NVIDIA's wheel.
wheel_dir="$cache/nvml-dev"
if ! ls "$wheel_dir"/nvidia_nvml_dev_cu12-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps -d "$wheel_dir" "nvidia-nvml-dev-cu12==12.9.79" >/dev/null 2>&1 ||
        fail "cannot download nvidia-nvml-dev-cu12 (nvml.h)"
fi
python3 - "$wheel_dir" "$dir.part/include" <<'EOF' || fail "no nvml.h in the nvidia-nvml-dev-cu12 wheel"
import glob, sys, zipfile
z = zipfile.ZipFile(sorted(glob.glob(sys.argv[1] + "/nvidia_nvml_dev_cu12-*.whl"))[0])
open(sys.argv[2] + "/nvml.h", "wb").write(z.read("nvidia/nvml_dev/include/nvml.h"))
EOF
printf '/* as CMake writes it for build.sh */\n#define MULTIPROCESS_LIMIT_ENABLE\n/* #undef MEMORY_LIMIT_DEBUG */\n#define DLSYM_HOOK_ENABLE\n/* #undef DLSYM_HOOK_DEBUG */\n#define HOOK_MEMINFO_ENABLE\n#define HOOK_NVML_ENABLE\nextern size_t GIT_HASH_%s;\nextern size_t GIT_BRANCH_bench;\n' "$commit" \
    >"$dir.part/config/static_config.h"
s="$dir.part/src/src"
mapfile -t sources < <(ls "$s"/*.c "$s"/multiprocess/multiprocess_*.c "$s"/allocator/*.c "$s"/cuda/*.c "$s"/nvml/*.c)
gcc -shared -fPIC -g -D_GNU_SOURCE -Wall -w -I"$dir.part/include" -I.deps/cuda12/include -I"$s" \
    -I"$dir.part/config" "${sources[@]}" -o "$dir.part/libvgpu.so" -ldl -lpthread >"$dir.part/build.log" 2>&1 ||
    fail "build failed: $(grep -m1 error "$dir.part/build.log")"
rm -rf "$dir"
mv "$dir.part" "$dir"
touch "$dir/.built"
echo "$lib"
