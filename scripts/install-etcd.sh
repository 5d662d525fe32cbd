#!/usr/bin/env bash
# etcd for the fleet tests (tests/daemon/cluster/): Debian's etcd-server (3.4),
# started by the tests themselves on loopback with a temporary data directory.
set -euo pipefail
exec </dev/null
command -v etcd >/dev/null 2>&1 && exit 0
[ "$(id -u)" = 0 ] || { echo "install-etcd.sh: run as root to apt-get install etcd-server" >&2; exit 1; }
echo "install-etcd.sh: installing etcd-server etcd-client" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends etcd-server etcd-client >&2
