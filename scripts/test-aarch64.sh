#!/usr/bin/env bash
# The aarch64 job (GH200/GB200 nodes), called by scripts/test.sh's full run; runs alone too:
#   1. installs the Rust target aarch64-unknown-linux-gnu (rustup) and, as root with apt, the
#      cross compiler and emulator (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
#      qemu-user-static);
#   2. fetches the aarch64 CUDA runtime wheels and the arm64 driver packages
#      (scripts/fetch-deps.sh --arch aarch64, scripts/fetch-drivers.sh --arch aarch64: new
#      trees under .deps/aarch64, the x86-64 ones untouched);
#   3. cross-builds the whole workspace (`cargo build --release --workspace --all-targets
#      --target aarch64-unknown-linux-gnu`, into target/aarch64-unknown-linux-gnu);
#   4. runs the crates' unit tests and the non-framework test files under qemu-aarch64-static
#      (cargo's runner for the test binaries; GPUSHIM_TEST_RUNNER for the programs they start,
#      binfmt_misc is not relied on). Tests that need what emulation cannot give print
#      `SKIPPED under emulation (aarch64): reason` and pass (host programs such as python3,
#      podman or sh loading the target's library; qemu-user's missing set_robust_list).
# If the target or the cross packages cannot be installed, one loud line
# `aarch64: SKIPPED (reason)` and exit status 0 (the x86-64 suite decides); any build or test
# failure fails. Extra arguments go to each `cargo test` (e.g. a name filter).
# GPUSHIM_AARCH64_TESTS="a b": only these test files (default: AARCH64_TESTS below).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target=aarch64-unknown-linux-gnu
start=$(date +%s)

skipped() {
  echo "================================================================" >&2
  echo "aarch64: SKIPPED ($*)" >&2
  echo "================================================================" >&2
  echo "aarch64: SKIPPED ($*)"
  exit 0
}

# 1. toolchain
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  command -v rustup >/dev/null 2>&1 || skipped "no rustup to install the Rust target $target"
  rustup target add "$target" >&2 || skipped "rustup target add $target failed"
fi
missing=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
[ -f /usr/aarch64-linux-gnu/lib/libc.so.6 ] && [ -f /usr/aarch64-linux-gnu/include/stdio.h ] || missing+=(libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null 2>&1 || missing+=(qemu-user-static)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test-aarch64: installing ${missing[*]}" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } \
      || skipped "apt-get could not install ${missing[*]}"
  else
    skipped "${missing[*]} not installed and no root apt-get to install them"
  fi
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
# the programs the tests start: the same emulator, the cross compiler and nm (tests/common)
# (programs a target program starts through binfmt_misc get qemu without -L: the prefix)
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
export GPUSHIM_TEST_RUNNER="$CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER"
export GPUSHIM_TEST_CC=aarch64-linux-gnu-gcc
export GPUSHIM_TEST_NM=aarch64-linux-gnu-nm
export GPUSHIM_TEST_TARGET="$target"

trap 'rc=$?; [ "$rc" = 0 ] || echo "aarch64: FAILED before the tests (exit $rc after $(( $(date +%s) - start )) s)"' EXIT

# 2. the aarch64 runtime wheels and driver packages
bash scripts/fetch-deps.sh --arch aarch64
bash scripts/fetch-drivers.sh --arch aarch64

# 3. the cross build
cargo build --release --workspace --all-targets --target "$target"
built=$(date +%s)

# 4. the tests. Not run here (each named in AARCH64_LEFT_OUT with why; a test file in neither
# list is named loudly below, so that a new one is not left out unseen): tests/frameworks*.rs
# (x86-64 framework wheels, host python), and, for time, those that mostly drive host tools or
# the command's services, each covered by the x86-64 run and architecture-neutral (no assembly,
# no ABI): deploy (podman, Kubernetes manifests, install.sh), secure (unshare, sh),
# observability (tmux), metrics_http (prometheus), sim_command, stress and compute_load (long
# timing runs that emulation slows past their bounds), cdi (podman), device_plugin (the
# command's gRPC server: Rust code only) and slurm (host daemons that would start target
# programs), limits (its runs without the shim — the simulated driver alone — hang under
# qemu-user now and then: 3 of 3 runs on 2026-11-27 had one, 120 s each, in different tests;
# natively never; not understood), compute (shares measured in wall time: under emulation a
# 30 % process next to an unlimited one got 23 %; the pacer's code is the same on both).
AARCH64_TESTS=(memory_modes runtime virtual_devices visibility nvml nvml_virtual
  nvidia_smi real_driver driver_paths device_view compute_modes placement passthrough
  config_errors shared_quota oom_wait hami race signal_handler state_dir_full report hardening
  cudarc cli)
AARCH64_LEFT_OUT=(limits compute frameworks frameworks_jax frameworks_tf frameworks_view deploy secure observability
  metrics_http sim_command stress compute_load cdi device_plugin slurm)
for f in tests/*.rs; do
  name=$(basename "$f" .rs)
  case " ${AARCH64_TESTS[*]} ${AARCH64_LEFT_OUT[*]} " in
    *" $name "*) ;;
    *) echo "test-aarch64: WARNING: tests/$name.rs is in neither AARCH64_TESTS nor AARCH64_LEFT_OUT: not run under aarch64" >&2 ;;
  esac
done
if [ -n "${GPUSHIM_AARCH64_TESTS:-}" ]; then read -r -a AARCH64_TESTS <<< "$GPUSHIM_AARCH64_TESTS"; fi
trap - EXIT  # (from here on the verdict line below says it)
tests=()
for t in "${AARCH64_TESTS[@]}"; do tests+=(--test "$t"); done
status=0
cargo test --release --target "$target" --workspace --lib --no-fail-fast "$@" || status=1
# A test file that fails is run once more, loudly: qemu-user has hung a simulator process that
# runs fine natively (see limits above). A failure that comes back fails the job; the retry is printed.
log=$(mktemp)
files_status=0
cargo test --release --target "$target" -p gpushim --no-fail-fast "${tests[@]}" "$@" 2>&1 | tee "$log" || files_status=1
if [ "$files_status" != 0 ]; then
  failed=$(grep -o 'to rerun pass `-p gpushim --test [A-Za-z0-9_]*`' "$log" | sed 's/.*--test \([A-Za-z0-9_]*\)`/\1/' | sort -u || true)
  if [ -n "$failed" ]; then
    retry=()
    for t in $failed; do retry+=(--test "$t"); done
    echo "aarch64: RETRYING once under emulation, after a failure: $(echo $failed)" >&2
    files_status=0
    cargo test --release --target "$target" -p gpushim --no-fail-fast "${retry[@]}" "$@" || files_status=1
    [ "$files_status" = 0 ] && echo "aarch64: the retry of $(echo $failed) passed (a failure under emulation that did not come back)" >&2
  fi
fi
rm -f "$log"
[ "$files_status" = 0 ] || status=1
end=$(date +%s)
verdict=PASSED
[ "$status" = 0 ] || verdict=FAILED
echo "aarch64: $verdict (build $((built - start)) s, tests $((end - built)) s; unit tests and ${#AARCH64_TESTS[@]} test files under qemu-aarch64-static)"
exit "$status"
