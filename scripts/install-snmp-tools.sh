#!/usr/bin/env bash
# Install net-snmp's agent and tools (snmpd, snmpget) for the SNMP interop tests and
# `make bench`. Idempotent; for a fresh Debian 12 as root with no stdin. The packages'
# own service is not wanted: the tests start snmpd in the foreground on loopback.
set -euo pipefail
if command -v snmpd >/dev/null 2>&1 && command -v snmpget >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-snmp-tools: snmpd/snmpget missing; run this script as root" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Another apt run (a parallel install) may hold the lock: wait for it.
apt_opts=(-o DPkg::Lock::Timeout=300 -y -qq)
apt-get "${apt_opts[@]:0:2}" update -qq
apt-get "${apt_opts[@]}" install --no-install-recommends snmpd snmp </dev/null >/dev/null
# Debian starts the packaged snmpd where it can; it would hold UDP 161 for nothing here.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet snmpd 2>/dev/null; then
    systemctl disable --now snmpd >/dev/null 2>&1 || true
fi
command -v snmpd >/dev/null && command -v snmpget >/dev/null
