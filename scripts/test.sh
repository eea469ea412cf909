#!/usr/bin/env bash
# The project's whole test command (CI runs exactly this through .ci/run):
#   1. fetch the CUDA runtime wheels the tests need (scripts/fetch-deps.sh, idempotent), real
#      NVIDIA driver libraries from Debian's non-free archive (scripts/fetch-drivers.sh) and a
#      virtual environment with PyTorch and CuPy (scripts/fetch-frameworks.sh, about 5.7 GB once),
#   2. build every crate of the workspace (the shim, the simulated driver, test clients),
#   3. run every test of the workspace against those builds.
# No GPU is needed. Extra arguments go to `cargo test` (e.g. a test-name filter).
#
#   --quick  (first argument) the contributors' suite: everything but the real frameworks
#            (tests/frameworks*.rs, which need the ~17.5 GB of .deps/frameworks, .deps/jax and
#            .deps/tf): scripts/fetch-frameworks.sh is not run, and those test binaries are
#            not run (they are built). CI runs the whole suite (no flag), where a framework
#            test whose environment is missing fails, as it always has.
#
# A run must leave nothing behind: the names this suite uses in /tmp (gpushim*, gpusim*, its
# tmux servers' sockets) and the shim's default state directories (/tmp/gpushim-UID,
# $XDG_RUNTIME_DIR/gpushim, /run/user/*/gpushim, /run/gpushim) with what they hold are listed
# before the README's commands and after `cargo test`; the run fails naming what is new (a
# failed run too). Another gpushim run on the same machine at the same time can add names.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

quick=0
if [ "${1:-}" = --quick ]; then quick=1; shift; fi

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
# tests/cdi.rs: Debian's podman applies the CDI spec (root only; a static busybox for its local
# image), Python's jsonschema checks it against the CDI schema; each part skips, saying why,
# where it cannot be had
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ! command -v podman >/dev/null 2>&1; then
  echo "test.sh: installing podman busybox-static" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman busybox-static >/dev/null; } ||
    echo "test.sh: podman could not be installed: tests/cdi.rs skips its podman test" >&2
fi
python3 -m pip --version >/dev/null 2>&1 || command -v pip3 >/dev/null 2>&1 || need pip3 python3-pip
# Python's jsonschema (tests/cdi.rs: the CDI schema) and PyYAML (tests/device_plugin.rs: the
# manifests) from Debian's packages, for /usr/bin/python3 (PEP 668 refuses pip there); the
# tests use the first of /usr/bin/python3 and python3 that has them, and fail where CI is set
# and none has
if ! /usr/bin/python3 -c 'import jsonschema, yaml' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing python3-jsonschema python3-yaml" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-jsonschema python3-yaml >/dev/null; } ||
      echo "test.sh: warning: cannot install python3-jsonschema python3-yaml: the schema and manifest checks skip (fail where CI is set)" >&2
  else
    echo "test.sh: warning: /usr/bin/python3 lacks jsonschema or yaml (not root or no apt-get): the schema and manifest checks skip (fail where CI is set)" >&2
  fi
fi
# a real single-node Slurm for tests/slurm.rs (it skips, saying why, where these are missing —
# or fails, where CI is set): the missing packages, one apt-get update and one install
wanted=""
want() {
  command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || wanted="$wanted $2"
}
want slurmctld slurmctld
want slurmd slurmd
want srun slurm-client
want munged munge
if [ -n "$wanted" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing$wanted" >&2
    # shellcheck disable=SC2086 # one word per package
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $wanted >/dev/null; } ||
      echo "test.sh: warning: cannot install$wanted; tests/slurm.rs will be skipped (failed where CI is set)" >&2
  else
    echo "test.sh: warning:$wanted missing (not root or no apt-get); tests/slurm.rs will be skipped (failed where CI is set)" >&2
  fi
fi

bash scripts/fetch-deps.sh
bash scripts/fetch-drivers.sh
[ "$quick" = 1 ] || bash scripts/fetch-frameworks.sh
bash scripts/fetch-prometheus.sh
python3 scripts/layers.py  # a lower layer never imports a higher one (docs/src/architecture.md)
python3 scripts/layers-selftest.py  # each known way around layers.py fails it
cargo build --release --workspace --all-targets

# leftovers: the suite's names in /tmp and the state directories, and what the state
# directories hold (one path a line, sorted)
leftovers() {
  local d
  for d in /tmp/gpushim* /tmp/gpusim* /tmp/tmux-*/gpushim* /run/gpushim* /run/user/*/gpushim* \
    ${XDG_RUNTIME_DIR:+"$XDG_RUNTIME_DIR"/gpushim*}; do
    [ -e "$d" ] || [ -L "$d" ] || continue
    printf '%s\n' "$d"
    if [ -d "$d" ] && [ ! -L "$d" ]; then find "$d" -mindepth 1 -maxdepth 1 2>/dev/null || true; fi
  done | LC_ALL=C sort -u
}
before="$(leftovers)"

python3 scripts/readme-commands.py   # every command of README.md (docs/src/tests.md)
bash scripts/docs.sh                 # the manual: mdBook build and link check

status=0
if [ "$quick" = 1 ]; then
  # the simulators and the cudarc client whole; the shim's unit tests and every test binary of
  # tests/ but tests/frameworks*.rs (the only ones that use .deps/frameworks, jax, tf)
  tests=()
  for f in tests/*.rs; do
    name="$(basename "$f" .rs)"
    case "$name" in frameworks*) ;; *) tests+=(--test "$name") ;; esac
  done
  cargo test --release --workspace --exclude gpushim "$@" || status=$?
  cargo test --release -p gpushim --lib "${tests[@]}" "$@" || status=$?
  echo "test.sh: quick suite: the framework tests (tests/frameworks*.rs) were not run" >&2
else
  cargo test --release --workspace "$@" || status=$?
  # the aarch64 job: cross-built, its tests under qemu-user (or one loud "aarch64: SKIPPED" line)
  bash scripts/test-aarch64.sh "$@" || status=$?
fi

left="$(LC_ALL=C comm -13 <(printf '%s\n' "$before") <(leftovers) | sed '/^$/d')"
if [ -n "$left" ]; then
  echo "test.sh: error: the run left these behind (a test must remove what it makes, or keep it in its own directory under target/tmp):" >&2
  printf '%s\n' "$left" | sed 's/^/  /' >&2
  [ "$status" != 0 ] || status=1
fi
exit "$status"
