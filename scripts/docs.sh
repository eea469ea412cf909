#!/usr/bin/env bash
# Build the manual (docs/, mdBook) and check it: mdBook's warnings fail the build, and every
# relative link and #anchor of the generated HTML must resolve (scripts/docs-linkcheck.py).
#
# mdBook is installed when missing: `cargo install mdbook --locked` at the version pinned
# below, from crates.io, into .deps/cargo-bin (beside the project's other downloads, not into
# ~/.cargo). An mdbook of the pinned version already on PATH is used as it is.
# Output: docs/book/index.html (ignored by git).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

version=0.5.4
cache="$root/.deps/cargo-bin"

mdbook=""
for candidate in "$(command -v mdbook || true)" "$cache/bin/mdbook"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" --version 2>/dev/null | grep -qx "mdbook v$version"; then
    mdbook=$candidate
    break
  fi
done
if [ -z "$mdbook" ]; then
  echo "docs.sh: installing mdbook $version into $cache (cargo install, a few minutes once)" >&2
  # Only what `mdbook build` needs: no `serve`/`watch` (a web server and a file watcher).
  cargo install mdbook --locked --version "$version" --no-default-features --features search \
    --root "$cache" --quiet
  mdbook="$cache/bin/mdbook"
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$mdbook" build docs >"$log" 2>&1; then
  cat "$log" >&2
  echo "docs.sh: mdbook build failed" >&2
  exit 1
fi
if grep -Eq '(^|[^A-Za-z])(WARN|ERROR)([^A-Za-z]|$)' "$log"; then
  cat "$log" >&2
  echo "docs.sh: mdbook printed warnings (treated as errors)" >&2
  exit 1
fi
python3 scripts/docs-linkcheck.py docs/book
echo "docs.sh: the manual is in docs/book/index.html"
