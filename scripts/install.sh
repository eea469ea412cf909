#!/usr/bin/env bash
# Installs gpushim (or removes it):
#
#   bash scripts/install.sh [--prefix DIR] [--destdir DIR] [--no-build] [--target-dir DIR] [--uninstall]
#
#   --prefix DIR      where it goes (default /usr/local)
#   --destdir DIR     staging root, prepended to every installed path (packaging: the files
#                     land in DESTDIR/PREFIX/..., but PREFIX is what the printed lines name)
#   --no-build        do not run cargo; install what is already built
#   --target-dir DIR  cargo's target directory (default: $CARGO_TARGET_DIR, else ./target);
#                     the files are taken from DIR/release
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
  sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

die() { echo "$me: error: $*" >&2; exit 1; }

prefix=/usr/local
destdir=
build=1
uninstall=0
target_dir=${CARGO_TARGET_DIR:-$root/target}

while [ $# -gt 0 ]; do
  case $1 in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --destdir) [ $# -ge 2 ] || die "--destdir needs a directory"; destdir=$2; shift 2 ;;
    --destdir=*) destdir=${1#*=}; shift ;;
    --target-dir) [ $# -ge 2 ] || die "--target-dir needs a directory"; target_dir=$2; shift 2 ;;
    --target-dir=*) target_dir=${1#*=}; shift ;;
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

# source (relative to the build or the repository) -> installed path (relative to PREFIX), mode
release="$target_dir/release"
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
  echo "building: cargo build --release -p gpushim (target directory $target_dir)"
  (cd "$root" && CARGO_TARGET_DIR="$target_dir" cargo build --release -p gpushim) ||
    die "cargo build failed (see above); nothing was installed"
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
