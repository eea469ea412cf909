#!/usr/bin/env bash
# Fetches Debian's `prometheus` package (the server, for tests/metrics_http.rs, which scrapes
# `gpushim metrics --listen` with it) into .deps/prometheus/bin without installing it: `apt-get
# download` + `dpkg-deb -x`, like scripts/fetch-drivers.sh. Idempotent; about 19 MB to
# download, 2 s on a fast link.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/.deps/prometheus"
die() { echo "fetch-prometheus.sh: error: $*" >&2; exit 1; }
[ -x "$out/bin/prometheus" ] && exit 0
command -v apt-get >/dev/null 2>&1 || die "apt-get is needed (a Debian or Ubuntu system)"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is needed to unpack the package"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
if ! (cd "$work" && apt-get -qq download prometheus >/dev/null 2>"$work/log"); then
  apt-get -qq update >/dev/null 2>&1 || true
  (cd "$work" && apt-get -qq download prometheus >/dev/null 2>"$work/log") \
    || die "cannot download Debian's prometheus package: $(tail -n1 "$work/log")"
fi
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
mkdir -p "$out/bin"
cp "$work/root/usr/bin/prometheus" "$out/bin/prometheus"
"$out/bin/prometheus" --version 2>&1 | head -n1 > "$out/VERSION"
echo "fetch-prometheus.sh: $(cat "$out/VERSION") in $out/bin" >&2
