#!/usr/bin/env bash
# install-slurm.sh — install what the Slurm integration tests need on Debian 12:
# munge, slurmctld, slurmd, slurmrestd, scontrol/sinfo and the JWT auth plugin.
# Idempotent (does nothing when everything is there); as root; never reads stdin.
#
# Usage: sudo scripts/install-slurm.sh
set -euo pipefail
exec </dev/null

PKGS="munge slurmctld slurmd slurmrestd slurm-client slurm-wlm-jwt-plugin"
BINS="munged mungekey slurmctld slurmd slurmrestd scontrol sinfo"

missing=0
for b in $BINS; do command -v "$b" >/dev/null 2>&1 || missing=1; done
ls /usr/lib/*/slurm-wlm/auth_jwt.so >/dev/null 2>&1 || missing=1
[ "$missing" = 0 ] && exit 0

[ "$(id -u)" = 0 ] || { echo "install-slurm.sh: must run as root to apt-get install: $PKGS" >&2; exit 1; }
echo "install-slurm.sh: installing $PKGS" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# --no-install-recommends: no mail server, no slurmdbd; the daemons are started by
# start-slurm.sh, not by systemd (policy-rc.d would be overkill: no systemd here).
apt-get install -y -qq --no-install-recommends $PKGS >&2
