#!/usr/bin/env bash
# Debian packages the test suite needs beyond Python: installed only when
# missing, as root, with no prompts (CI runs this on a fresh machine).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
here=$(cd "$(dirname "$0")" && pwd)

need=()
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "install-test-deps: need root to install: ${need[*]}" >&2
        exit 1
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Each area's own installer (SNMP tools, Slurm, ...), when present.
for script in "$here"/install-*.sh; do
    [ "$script" = "$here/install-test-deps.sh" ] && continue
    [ -x "$script" ] && "$script"
done
exit 0
