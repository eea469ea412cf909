#!/usr/bin/env bash
# Fetch real NVIDIA driver libraries from Debian's non-free archive, as test fixtures that run
# without a GPU (they answer cuDriverGetVersion, cuGetProcAddress and cuGetExportTable; cuInit
# says CUDA_ERROR_NO_DEVICE, nvmlInit NVML_ERROR_DRIVER_NOT_LOADED, nvidia-smi exits 9):
#   .deps/drivers/<version>/lib/   libcuda.so.1, libnvidia-ml.so.1 (and .so links)
#   .deps/drivers/<version>/bin/   nvidia-smi
# One driver per branch: 535 (bookworm), 550 (trixie), 555 (experimental), the newest version of
# each that the archive has. The system's apt set-up is untouched: a private sources list,
# state and cache under .deps/apt. Idempotent: a driver is unpacked once (marker .complete);
# the package lists are refreshed when older than a day. NVIDIA's licence allows downloading
# and using these libraries; they are never committed.
# If the archive cannot be reached the script fails with one line saying so.
#
#   --arch aarch64   the arm64 packages instead (GH200/GB200 systems), for the cross build's
#                    tests: .deps/aarch64/drivers/<version>/{lib,bin}, its own apt state in
#                    .deps/aarch64/apt. Without it (or --arch x86_64) the amd64 paths above,
#                    unchanged.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
arch=x86_64
if [ "${1:-}" = --arch ]; then arch="${2:?--arch needs x86_64 or aarch64}"; shift 2; fi
case "$arch" in
  x86_64) deps="$root/.deps"; debarch=amd64; multiarch=x86_64-linux-gnu ;;
  aarch64) deps="$root/.deps/aarch64"; debarch=arm64; multiarch=aarch64-linux-gnu ;;
  *) echo "fetch-drivers: error: unknown --arch $arch (x86_64 or aarch64)" >&2; exit 1 ;;
esac
apt_dir="$deps/apt"
out="$deps/drivers"

die() { echo "fetch-drivers: error: $*" >&2; exit 1; }

command -v apt-get >/dev/null 2>&1 || die "apt-get is needed to fetch the NVIDIA driver packages from Debian's archive"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is needed to unpack the NVIDIA driver packages"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || die "$keyring is missing (package debian-archive-keyring)"

# suite  branch
branches=("bookworm 535" "trixie 550" "experimental 555")

mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$out"
: > "$apt_dir/sources.list"
for b in "${branches[@]}"; do
  echo "deb [signed-by=$keyring] http://deb.debian.org/debian ${b%% *} non-free" >> "$apt_dir/sources.list"
done
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
          -o "APT::Architecture=$debarch" -o "APT::Architectures=$debarch" -o Debug::NoLocking=1
          -o APT::Sandbox::User=root)

stamp="$apt_dir/updated"
if [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440)" ]; then
  apt-get "${apt_opts[@]}" -qq update >/dev/null 2>"$apt_dir/update.log" \
    || die "cannot reach Debian's archive (deb.debian.org, component non-free) to fetch the NVIDIA driver packages: $(tail -n1 "$apt_dir/update.log")"
  touch "$stamp"
fi

# The newest version of PACKAGE in suite SUITE of branch BRANCH.
newest() { # PACKAGE SUITE BRANCH
  apt-cache "${apt_opts[@]}" madison "$1" 2>/dev/null \
    | awk -F'|' -v s="$2/non-free" -v b="$3." '{gsub(/ /,"",$2); if (index($3, s) && index($2, b) == 1) print $2}' \
    | sort -V | tail -n1
}

for b in "${branches[@]}"; do
  suite="${b%% *}"; branch="${b##* }"
  version="$(newest libcuda1 "$suite" "$branch")"
  [ -n "$version" ] || die "Debian's $suite/non-free has no libcuda1 $branch.x"
  upstream="${version%%-*}"
  dest="$out/$upstream"
  if [ -f "$dest/.complete" ] && [ "$(cat "$dest/.complete")" = "$version" ]; then continue; fi
  rm -rf "$dest" "$apt_dir/debs"; mkdir -p "$dest/lib" "$dest/bin" "$apt_dir/debs"
  (cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" -qq download \
      "libcuda1=$version" "libnvidia-ml1=$version" "nvidia-smi=$version" >/dev/null 2>"$apt_dir/download.log") \
    || die "cannot download the $version driver packages: $(tail -n1 "$apt_dir/download.log")"
  for deb in "$apt_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$apt_dir/debs/root"; done
  libs="$apt_dir/debs/root/usr/lib/$multiarch/nvidia/current"
  cp "$libs/libcuda.so.$upstream" "$libs/libnvidia-ml.so.$upstream" "$dest/lib/"
  ln -sf "libcuda.so.$upstream" "$dest/lib/libcuda.so.1"; ln -sf libcuda.so.1 "$dest/lib/libcuda.so"
  ln -sf "libnvidia-ml.so.$upstream" "$dest/lib/libnvidia-ml.so.1"; ln -sf libnvidia-ml.so.1 "$dest/lib/libnvidia-ml.so"
  cp "$apt_dir/debs/root/usr/lib/nvidia/current/nvidia-smi" "$dest/bin/nvidia-smi"
  rm -rf "$apt_dir/debs"
  echo "$version" > "$dest/.complete"
  echo "fetch-drivers: unpacked NVIDIA $version into $dest" >&2
done
echo "fetch-drivers: real drivers ready in $out: $(ls "$out" | tr '\n' ' ')" >&2
