#!/usr/bin/env bash
# Installs gpushim (or removes it):
#
#   bash scripts/install.sh [--prefix DIR] [--destdir DIR] [--no-build] [--target-dir DIR] [--arch ARCH] [--uninstall]
#
#   --prefix DIR      where it goes (default /usr/local)
#   --destdir DIR     staging root, prepended to every installed path (packaging: the files
#                     land in DESTDIR/PREFIX/..., but PREFIX is what the printed lines name)
#   --no-build        do not run cargo; install what is already built
#   --target-dir DIR  cargo's target directory (default: $CARGO_TARGET_DIR, else ./target);
#                     the files are taken from DIR/release, or from DIR/ARCH-unknown-linux-gnu/release
#                     (a cross build) where that holds them and DIR/release is another architecture
#   --arch ARCH       x86_64 or aarch64 (default: this machine's, `uname -m`): the architecture
#                     installed; the library's ELF header is checked against it. With a build,
#                     another architecture than this machine's is cross-built
#                     (--target ARCH-unknown-linux-gnu; needs the target and a cross linker,
#                     see scripts/test-aarch64.sh)
#   --uninstall       remove exactly the files below (and the share/gpushim directory if empty)
#
# Installed:
#   PREFIX/lib/libgpushim.so                 the shim (target/release/libgpushim.so)
#   PREFIX/bin/gpushim                       the command-line tool (target/release/gpushim)
#   PREFIX/bin/gpushim-entrypoint            container entrypoint (scripts/entrypoint.sh)
#   PREFIX/include/gpushim.h                 the C API (include/gpushim.h)
#   PREFIX/share/gpushim/gpushim.toml        the documented example configuration
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
me="install.sh"

usage() {
  sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

die() { echo "$me: error: $*" >&2; exit 1; }

prefix=/usr/local
destdir=
build=1
uninstall=0
target_dir=${CARGO_TARGET_DIR:-$root/target}
arch=$(uname -m)

while [ $# -gt 0 ]; do
  case $1 in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --destdir) [ $# -ge 2 ] || die "--destdir needs a directory"; destdir=$2; shift 2 ;;
    --destdir=*) destdir=${1#*=}; shift ;;
    --target-dir) [ $# -ge 2 ] || die "--target-dir needs a directory"; target_dir=$2; shift 2 ;;
    --target-dir=*) target_dir=${1#*=}; shift ;;
    --arch) [ $# -ge 2 ] || die "--arch needs x86_64 or aarch64"; arch=$2; shift 2 ;;
    --arch=*) arch=${1#*=}; shift ;;
    --no-build) build=0; shift ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$me: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

[ -n "$prefix" ] || die "--prefix is empty"
case $prefix in
  /*) ;;
  *) die "--prefix must be an absolute path (the library path goes into LD_PRELOAD and /etc/ld.so.preload): $prefix" ;;
esac
prefix=${prefix%/}
[ -n "$prefix" ] || prefix=/
case $target_dir in
  /*) ;;
  *) target_dir="$PWD/$target_dir" ;;
esac

case $arch in
  x86_64|amd64) arch=x86_64; machine=62 ;;
  aarch64|arm64) arch=aarch64; machine=183 ;;
  *) die "unsupported architecture $arch (x86_64 or aarch64)" ;;
esac
triple="$arch-unknown-linux-gnu"
host=$(uname -m)
case $host in amd64) host=x86_64 ;; arm64) host=aarch64 ;; esac
native=0
[ "$host" = "$arch" ] && native=1

# The ELF machine of a file (62 x86-64, 183 aarch64; empty if not ELF).
elf_machine() {
  [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ] || return 0
  od -An -tu2 -j18 -N2 "$1" | tr -d ' '
}

# The build for ARCH: DIR/release where it is that architecture (a native build), else the
# cross build's DIR/ARCH-unknown-linux-gnu/release.
release_dir() {
  if [ -f "$target_dir/release/libgpushim.so" ] && [ "$(elf_machine "$target_dir/release/libgpushim.so")" = "$machine" ]; then
    echo "$target_dir/release"
  elif [ -f "$target_dir/$triple/release/libgpushim.so" ]; then
    echo "$target_dir/$triple/release"
  else
    echo "$target_dir/release"
  fi
}

# source (relative to the build or the repository) -> installed path (relative to PREFIX), mode
release="$(release_dir)"
files=(
  "$release/libgpushim.so|lib/libgpushim.so|0755"
  "$release/gpushim|bin/gpushim|0755"
  "$root/scripts/entrypoint.sh|bin/gpushim-entrypoint|0755"
  "$root/include/gpushim.h|include/gpushim.h|0644"
  "$root/config/gpushim.toml|share/gpushim/gpushim.toml|0644"
)

dest() { # installed path of $1 (relative to PREFIX), with DESTDIR
  local p="${prefix%/}/$1"
  echo "${destdir%/}$p"
}

if [ "$uninstall" = 1 ]; then
  for f in "${files[@]}"; do
    IFS='|' read -r _ rel _ <<<"$f"
    path=$(dest "$rel")
    if [ -e "$path" ] || [ -L "$path" ]; then
      rm -f -- "$path"
      echo "removed $path"
    else
      echo "not there: $path"
    fi
  done
  rmdir -- "$(dest share/gpushim)" 2>/dev/null || true
  echo
  echo "If /etc/ld.so.preload names ${prefix%/}/lib/libgpushim.so, remove that line too: the"
  echo "dynamic loader warns about a missing preload object in every program it starts."
  exit 0
fi

if [ "$build" = 1 ]; then
  command -v cargo >/dev/null 2>&1 || die "cargo is not installed (or pass --no-build with a built --target-dir)"
  if [ "$native" = 1 ]; then
    echo "building: cargo build --release -p gpushim (target directory $target_dir)"
    (cd "$root" && CARGO_TARGET_DIR="$target_dir" cargo build --release -p gpushim) ||
      die "cargo build failed (see above); nothing was installed"
  else
    echo "building: cargo build --release -p gpushim --target $triple (target directory $target_dir)"
    (cd "$root" && CARGO_TARGET_DIR="$target_dir" cargo build --release -p gpushim --target "$triple") ||
      die "cargo build --target $triple failed (see above: rustup target add $triple, a cross linker such as CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc); nothing was installed"
  fi
  release="$(release_dir)"
  files[0]="$release/libgpushim.so|lib/libgpushim.so|0755"
  files[1]="$release/gpushim|bin/gpushim|0755"
fi

for f in "${files[@]}"; do
  IFS='|' read -r src rel _ <<<"$f"
  if [ ! -f "$src" ]; then
    case $rel in
      lib/*|bin/gpushim)
        die "$src does not exist: build it first (cargo build --release -p gpushim), or drop --no-build, or pass the right --target-dir" ;;
      *) die "$src does not exist (is this a complete checkout?)" ;;
    esac
  fi
done

for bin in "$release/libgpushim.so" "$release/gpushim"; do
  [ "$(elf_machine "$bin")" = "$machine" ] || die "$bin is not an $arch program (ELF machine $(elf_machine "$bin"), want $machine): build for $arch, or pass --arch"
done

for f in "${files[@]}"; do
  IFS='|' read -r src rel mode <<<"$f"
  path=$(dest "$rel")
  install -D -m "$mode" -- "$src" "$path"
  echo "installed $path"
done

lib="${prefix%/}/lib/libgpushim.so"
cat <<EOF

Run one program under gpushim:
  LD_PRELOAD=$lib GPUSHIM_MEMORY_LIMIT=40% python train.py
or, with the tool:
  ${prefix%/}/bin/gpushim run --memory-limit 40% -- python train.py
In a container image:
  ENTRYPOINT ["${prefix%/}/bin/gpushim-entrypoint"]
For every process of a machine or container, add this line to /etc/ld.so.preload (read the
manual's cautions first, docs/src/deployment.md: it affects every program started afterwards; GPUSHIM_DISABLE=1 turns
the shim off per process, and deleting the line undoes it):
  $lib
Uninstall: bash scripts/install.sh --prefix ${prefix%/} --uninstall
EOF
