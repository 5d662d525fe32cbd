#!/usr/bin/env bash
# Debian packages `make bench` uses: wrk, the HTTP load generator for the API
# rows. Idempotent; as root; never reads stdin.
set -euo pipefail
exec </dev/null
command -v wrk >/dev/null 2>&1 && exit 0
[ "$(id -u)" = 0 ] || { echo "install-bench-tools.sh: run as root to apt-get install wrk" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends wrk >&2
