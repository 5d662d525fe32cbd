#!/usr/bin/env bash
# Debian packages the observability tests use: promtool (from `prometheus`) for the
# alert-rule tests and the dashboard's query check, and headless Chromium for the live
# page's test. Idempotent; as root; never reads stdin. The prometheus package's own
# server unit is not wanted (nothing starts it without systemd; stopped where it runs).
set -euo pipefail
exec </dev/null
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
[ "$(id -u)" = 0 ] || { echo "install-observability-tools.sh: run as root to apt-get install ${need[*]}" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=300 -y -qq)
apt-get "${apt_opts[@]:0:2}" update -qq >&2
apt-get "${apt_opts[@]}" install --no-install-recommends "${need[@]}" >&2
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
command -v promtool >/dev/null && command -v chromium >/dev/null
