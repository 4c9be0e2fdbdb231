#!/bin/sh
# Installs Prometheus and promtool from Debian's package as .venv/bin/prometheus and
# .venv/bin/promtool, for the tests of the chart's alert rules and dashboard (`promtool test rules`).
# No root: `apt-get download` fetches the package of the machine's release (through its apt sources,
# signatures checked by apt) and `dpkg-deb -x` unpacks it; the binaries are static Go programs.
set -eu
BIN=${1:-.venv/bin}
if [ -x "$BIN/promtool" ] && [ -x "$BIN/prometheus" ] && "$BIN/promtool" --version >/dev/null 2>&1; then
    exit 0
fi
command -v apt-get >/dev/null || { echo "install-prometheus.sh: apt-get is needed (Debian's prometheus package)" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && apt-get download prometheus >/dev/null 2>"$WORK/apt.log") || {
    # Package lists may be missing on a fresh machine: read them into a private state directory.
    mkdir -p "$WORK/lists/partial"
    apt-get -o Dir::State::Lists="$WORK/lists" update >/dev/null
    (cd "$WORK" && apt-get -o Dir::State::Lists="$WORK/lists" download prometheus >/dev/null)
}
dpkg-deb -x "$WORK"/prometheus_*.deb "$WORK/root"
install -m 0755 "$WORK/root/usr/bin/promtool" "$BIN/promtool"
install -m 0755 "$WORK/root/usr/bin/prometheus" "$BIN/prometheus"
echo "installed $("$BIN/promtool" --version 2>&1 | head -1) at $BIN"
