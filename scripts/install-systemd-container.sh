#!/usr/bin/env bash
# debootstrap and systemd-nspawn for the tests under a real systemd as PID 1
# (scripts/start-systemd-container.sh, tests/systemd/test_real_systemd.py).
set -euo pipefail
exec </dev/null
command -v debootstrap >/dev/null 2>&1 && command -v systemd-nspawn >/dev/null 2>&1 && exit 0
[ "$(id -u)" = 0 ] || { echo "install-systemd-container.sh: run as root to apt-get install debootstrap systemd-container" >&2; exit 1; }
echo "install-systemd-container.sh: installing debootstrap systemd-container" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends debootstrap systemd-container >&2
